//! What decides the kernel's IPv6 Neighbor Discovery answers, as netlink
//! shows it: every IPv6 address with the state of its duplicate address
//! detection, and the proxy entries (`ip -6 neigh show proxy`). Read once,
//! bounded; whatever cannot be read is kept as the reason.

use std::net::{IpAddr, Ipv6Addr};

use futures::TryStreamExt as _;
use netlink_packet_route::{
    address::{AddressAttribute, AddressFlags, AddressMessage},
    neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage},
    AddressFamily,
};
use rtnetlink::Handle;

/// The most addresses, and proxy entries, read (a hostile table).
pub const MAX_ENTRIES: usize = 65_536;

/// Where an address stands in duplicate address detection (RFC 4862).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dad {
    /// Done: the address is in use.
    Done,
    /// Added without it (`nodad`).
    Skipped,
    /// Under way: the kernel neither answers for it nor delivers to it yet.
    Tentative,
    /// Another node answered for it: the kernel keeps it tentative for good.
    Failed,
}

impl Dad {
    fn of(flags: AddressFlags) -> Self {
        if flags.contains(AddressFlags::Dadfailed) {
            Dad::Failed
        } else if flags.contains(AddressFlags::Tentative) {
            Dad::Tentative
        } else if flags.contains(AddressFlags::Nodad) {
            Dad::Skipped
        } else {
            Dad::Done
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Dad::Done => "done",
            Dad::Skipped => "nodad",
            Dad::Tentative => "tentative",
            Dad::Failed => "dadfailed",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Addr6 {
    pub ifindex: u32,
    pub addr: Ipv6Addr,
    pub dad: Dad,
}

/// A proxy entry: the kernel answers solicitations for `addr` arriving on
/// `ifindex` (any interface when `None`), given proxy_ndp and forwarding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proxy6 {
    pub ifindex: Option<u32>,
    pub addr: Ipv6Addr,
    /// NTF_ROUTER: its advertisements carry the Router flag.
    pub router: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ipv6View {
    pub addrs: Vec<Addr6>,
    pub proxies: Result<Vec<Proxy6>, String>,
}

fn addr6(msg: &AddressMessage) -> Option<Addr6> {
    if msg.header.family != AddressFamily::Inet6 {
        return None;
    }
    let addr = msg.attributes.iter().find_map(|a| match a {
        AddressAttribute::Address(IpAddr::V6(v6)) => Some(*v6),
        _ => None,
    })?;
    // IFA_FLAGS (32 bits) when the kernel sends it, else the header's 8.
    let flags = msg
        .attributes
        .iter()
        .find_map(|a| match a {
            AddressAttribute::Flags(f) => Some(*f),
            _ => None,
        })
        .unwrap_or_else(|| AddressFlags::from_bits_retain(u32::from(msg.header.flags.bits())));
    Some(Addr6 {
        ifindex: msg.header.index,
        addr,
        dad: Dad::of(flags),
    })
}

fn proxy6(msg: &NeighbourMessage) -> Option<Proxy6> {
    if !msg.header.flags.contains(NeighbourFlags::Proxy) {
        return None;
    }
    let addr = msg.attributes.iter().find_map(|a| match a {
        NeighbourAttribute::Destination(NeighbourAddress::Inet6(v6)) => Some(*v6),
        _ => None,
    })?;
    Some(Proxy6 {
        ifindex: (msg.header.ifindex != 0).then_some(msg.header.ifindex),
        addr,
        router: msg.header.flags.contains(NeighbourFlags::Router),
    })
}

async fn read_proxies(handle: &Handle) -> Result<Vec<Proxy6>, String> {
    let mut out = Vec::new();
    let mut dump = handle
        .neighbours()
        .get()
        .set_address_family(AddressFamily::Inet6)
        .proxies()
        .execute();
    while let Some(msg) = dump
        .try_next()
        .await
        .map_err(|e| format!("listing proxy entries: {e}"))?
    {
        if out.len() == MAX_ENTRIES {
            return Err(format!("more than {MAX_ENTRIES} proxy entries; not read"));
        }
        out.extend(proxy6(&msg));
    }
    Ok(out)
}

/// Read the IPv6 addresses and proxy entries through `handle`.
pub async fn read(handle: &Handle) -> Result<Ipv6View, String> {
    let mut addrs = Vec::new();
    let mut req = handle.address().get();
    req.message_mut().header.family = AddressFamily::Inet6;
    let mut dump = req.execute();
    while let Some(msg) = dump
        .try_next()
        .await
        .map_err(|e| format!("listing IPv6 addresses: {e}"))?
    {
        if addrs.len() == MAX_ENTRIES {
            return Err(format!("more than {MAX_ENTRIES} IPv6 addresses; not read"));
        }
        addrs.extend(addr6(&msg));
    }
    Ok(Ipv6View {
        addrs,
        proxies: read_proxies(handle).await,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dad_states_from_the_flags() {
        let f =
            |bits: &[AddressFlags]| Dad::of(bits.iter().fold(AddressFlags::empty(), |a, b| a | *b));
        // A failed address stays tentative: failed wins.
        assert_eq!(
            f(&[AddressFlags::Tentative, AddressFlags::Dadfailed]),
            Dad::Failed
        );
        assert_eq!(f(&[AddressFlags::Tentative]), Dad::Tentative);
        assert_eq!(
            f(&[AddressFlags::Nodad, AddressFlags::Permanent]),
            Dad::Skipped
        );
        assert_eq!(f(&[AddressFlags::Permanent]), Dad::Done);
    }
}
