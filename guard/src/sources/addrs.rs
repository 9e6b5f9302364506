//! The kernel's interfaces and their addresses (IPv4, and global IPv6),
//! kept current through rtnetlink. One table serves three needs: LB IPs read
//! from an interface (`--lb-ips-from kube-ipvs0`: both families), the "LB IP
//! is on the egress interface" rule and the primary IPv4 an announce leak is
//! rewritten to (IPv4 only: NDP has neither).
//!
//! Notifications are applied as they come (one address or link each), so an
//! address kube-vip or kube-proxy adds reaches the maps within a millisecond
//! or so; a full dump every `--resync` (and after a socket overrun) repairs
//! anything a lost notification left wrong.

use std::time::Duration;

use futures::{StreamExt as _, TryStreamExt as _};
use netlink_packet_route::{
    address::{AddressAttribute, AddressHeaderFlags, AddressMessage},
    link::{InfoData, InfoVlan, LinkAttribute, LinkInfo, LinkMessage},
    AddressFamily, RouteNetlinkMessage,
};
use rtnetlink::packet_core::NetlinkPayload;

pub use crate::model::addrs::{AddrTable, IfAddrV4};
use rtnetlink::{Handle, MulticastGroup};
use tokio::sync::watch;

/// The name of a link message, if it carries one.
fn link_name(msg: &LinkMessage) -> Option<String> {
    msg.attributes.iter().find_map(|a| match a {
        LinkAttribute::IfName(n) => Some(n.clone()),
        _ => None,
    })
}

/// (lower ifindex, VLAN ID) of a VLAN device's link message. Not for a VLAN
/// device whose lower device lives in another network namespace (its index
/// means nothing here).
fn vlan_of(msg: &LinkMessage) -> Option<(u32, u16)> {
    if msg
        .attributes
        .iter()
        .any(|a| matches!(a, LinkAttribute::LinkNetNsId(_)))
    {
        return None;
    }
    let lower = msg.attributes.iter().find_map(|a| match a {
        LinkAttribute::Link(l) => Some(*l),
        _ => None,
    })?;
    let vid = msg.attributes.iter().find_map(|a| match a {
        LinkAttribute::LinkInfo(infos) => infos.iter().find_map(|i| match i {
            LinkInfo::Data(InfoData::Vlan(v)) => v.iter().find_map(|x| match x {
                InfoVlan::Id(id) => Some(*id),
                _ => None,
            }),
            _ => None,
        }),
        _ => None,
    })?;
    Some((lower, vid))
}

/// (ifindex, address) of an IPv4 address message.
fn v4_addr(msg: &AddressMessage) -> Option<(u32, IfAddrV4)> {
    if msg.header.family != AddressFamily::Inet {
        return None;
    }
    // For IPv4, IFA_LOCAL is the interface's own address (IFA_ADDRESS is
    // the peer on point-to-point links).
    let local = msg.attributes.iter().find_map(|a| match a {
        AddressAttribute::Local(std::net::IpAddr::V4(v4)) => Some(*v4),
        _ => None,
    });
    let address = msg.attributes.iter().find_map(|a| match a {
        AddressAttribute::Address(std::net::IpAddr::V4(v4)) => Some(*v4),
        _ => None,
    });
    let addr = local.or(address)?;
    Some((
        msg.header.index,
        IfAddrV4 {
            addr,
            prefix: msg.header.prefix_len,
            secondary: msg.header.flags.contains(AddressHeaderFlags::Secondary),
        },
    ))
}

/// (ifindex, address) of a global IPv6 address message (IFA_ADDRESS is the
/// local address for IPv6); link-local and multicast are left out.
fn v6_addr(msg: &AddressMessage) -> Option<(u32, std::net::Ipv6Addr)> {
    if msg.header.family != AddressFamily::Inet6 {
        return None;
    }
    let addr = msg.attributes.iter().find_map(|a| match a {
        AddressAttribute::Address(std::net::IpAddr::V6(v6)) => Some(*v6),
        _ => None,
    })?;
    (!addr.is_unicast_link_local() && !addr.is_multicast() && !addr.is_loopback())
        .then_some((msg.header.index, addr))
}

impl AddrTable {
    /// Apply an IPv6 address notification. Returns whether the table changed.
    fn apply_v6(&mut self, msg: &AddressMessage, add: bool) -> bool {
        let Some((index, addr)) = v6_addr(msg) else {
            return false;
        };
        let list = self.v6.entry(index).or_default();
        let had = list.contains(&addr);
        if add && !had {
            list.push(addr);
        } else if !add {
            list.retain(|a| *a != addr);
        }
        if list.is_empty() {
            self.v6.remove(&index);
        }
        add != had
    }

    /// Apply one notification. Returns whether the table changed.
    pub fn apply(&mut self, msg: &RouteNetlinkMessage) -> bool {
        match msg {
            RouteNetlinkMessage::NewAddress(m) if m.header.family == AddressFamily::Inet6 => {
                self.apply_v6(m, true)
            }
            RouteNetlinkMessage::DelAddress(m) if m.header.family == AddressFamily::Inet6 => {
                self.apply_v6(m, false)
            }
            RouteNetlinkMessage::NewAddress(m) => match v4_addr(m) {
                Some((index, a)) => {
                    let list = self.v4.entry(index).or_default();
                    match list
                        .iter_mut()
                        .find(|x| x.addr == a.addr && x.prefix == a.prefix)
                    {
                        Some(x) if *x == a => false,
                        Some(x) => {
                            *x = a;
                            true
                        }
                        None => {
                            list.push(a);
                            true
                        }
                    }
                }
                None => false,
            },
            RouteNetlinkMessage::DelAddress(m) => match v4_addr(m) {
                Some((index, a)) => {
                    let list = self.v4.entry(index).or_default();
                    let before = list.len();
                    list.retain(|x| (x.addr, x.prefix) != (a.addr, a.prefix));
                    let changed = list.len() != before;
                    if list.is_empty() {
                        self.v4.remove(&index);
                    }
                    changed
                }
                None => false,
            },
            RouteNetlinkMessage::NewLink(m) => {
                let index = m.header.index;
                let vlan_changed = match vlan_of(m) {
                    Some(v) => self.vlans.insert(index, v) != Some(v),
                    None => false,
                };
                let Some(name) = link_name(m) else {
                    return vlan_changed;
                };
                if self.links.get(&name) == Some(&index) {
                    vlan_changed
                } else {
                    // A rename: the old name goes.
                    self.links.retain(|_, i| *i != index);
                    self.links.insert(name, index);
                    true
                }
            }
            RouteNetlinkMessage::DelLink(m) => {
                let index = m.header.index;
                let before = self.links.len();
                self.links.retain(|_, i| *i != index);
                let gone = self.v4.remove(&index).is_some() | self.v6.remove(&index).is_some();
                let vlan_gone = self.vlans.remove(&index).is_some();
                gone || vlan_gone || self.links.len() != before
            }
            _ => false,
        }
    }
}

/// Why the interfaces' addresses cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum AddrsError {
    #[error("cannot open an rtnetlink socket: {0}")]
    Socket(std::io::Error),
    /// A dump of `what` (links, addresses) failed.
    #[error("netlink {what} dump: {error}")]
    Dump {
        what: &'static str,
        error: rtnetlink::Error,
    },
}

/// Read all links and their IPv4 and global IPv6 addresses once.
pub async fn dump(handle: &Handle) -> Result<AddrTable, AddrsError> {
    let failed = |what| move |error| AddrsError::Dump { what, error };
    let mut table = AddrTable::default();
    let mut links = handle.link().get().execute();
    while let Some(msg) = links.try_next().await.map_err(failed("link"))? {
        if let Some(name) = link_name(&msg) {
            table.links.insert(name, msg.header.index);
        }
        if let Some(v) = vlan_of(&msg) {
            table.vlans.insert(msg.header.index, v);
        }
    }
    let mut addrs = handle.address().get().execute();
    while let Some(msg) = addrs.try_next().await.map_err(failed("address"))? {
        if let Some((index, a)) = v4_addr(&msg) {
            table.v4.entry(index).or_default().push(a);
        }
        if let Some((index, a)) = v6_addr(&msg) {
            table.v6.entry(index).or_default().push(a);
        }
    }
    Ok(table)
}

/// Netlink notifications of link and address changes.
pub type Notifications = futures::channel::mpsc::UnboundedReceiver<(
    rtnetlink::packet_core::NetlinkMessage<rtnetlink::packet_route::RouteNetlinkMessage>,
    rtnetlink::sys::SocketAddr,
)>;

/// Open a netlink connection subscribed to link and address changes.
pub fn connect() -> Result<(Handle, Notifications), AddrsError> {
    let (conn, handle, messages) = rtnetlink::new_multicast_connection(&[
        MulticastGroup::Link,
        MulticastGroup::Ipv4Ifaddr,
        MulticastGroup::Ipv6Ifaddr,
    ])
    .map_err(AddrsError::Socket)?;
    tokio::spawn(conn);
    Ok((handle, messages))
}

async fn reconnect() -> (Handle, Notifications) {
    let mut delay = Duration::from_millis(500);
    loop {
        tracing::warn!("rtnetlink notifications stopped; reconnecting");
        match connect() {
            Ok(c) => return c,
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), retry_in = ?delay, "cannot reopen rtnetlink")
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(30));
    }
}

/// Keep the table in `tx` current: apply each notification as it comes
/// (whatever is already queued is applied with it, then published once), and
/// replace the table with a full dump every `resync` and after a socket
/// overrun. Runs for the life of the daemon: a broken netlink socket is
/// reopened with backoff, and meanwhile the maps keep their last state.
pub async fn watch(
    mut handle: Handle,
    mut notifications: Notifications,
    tx: watch::Sender<AddrTable>,
    resync: Duration,
) {
    let mut ticker = tokio::time::interval(resync.max(Duration::from_secs(1)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    loop {
        let dump_now = tokio::select! {
            n = notifications.next() => {
                let Some((first, _)) = n else {
                    (handle, notifications) = reconnect().await;
                    // Changes while we were away: read everything.
                    publish_dump(&handle, &tx).await;
                    continue;
                };
                // Applied in place (no copy of the table per notification);
                // the daemon is woken only if something changed.
                let mut lost = false;
                tx.send_if_modified(|table| {
                    let mut changed = false;
                    let mut next = Some(first);
                    while let Some(msg) = next {
                        match msg.payload {
                            NetlinkPayload::InnerMessage(m) => changed |= table.apply(&m),
                            NetlinkPayload::Overrun(_) => lost = true,
                            _ => {}
                        }
                        next = notifications.try_recv().ok().map(|(m, _)| m);
                    }
                    changed
                });
                lost
            }
            _ = ticker.tick() => true,
        };
        if dump_now {
            publish_dump(&handle, &tx).await;
        }
    }
}

async fn publish_dump(handle: &Handle, tx: &watch::Sender<AddrTable>) {
    match dump(handle).await {
        Ok(table) => {
            tx.send_if_modified(|cur| {
                let changed = *cur != table;
                *cur = table;
                changed
            });
        }
        Err(e) => {
            tracing::warn!(error = %format!("{e:#}"), "re-reading interface addresses failed; keeping the previous view")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr_msg(index: u32, addr: &str, secondary: bool) -> AddressMessage {
        let mut m = AddressMessage::default();
        m.header.family = AddressFamily::Inet;
        m.header.index = index;
        m.header.prefix_len = 32;
        if secondary {
            m.header.flags = AddressHeaderFlags::Secondary;
        }
        m.attributes
            .push(AddressAttribute::Local(addr.parse().unwrap()));
        m
    }

    fn link_msg(index: u32, name: &str) -> LinkMessage {
        let mut m = LinkMessage::default();
        m.header.index = index;
        m.attributes.push(LinkAttribute::IfName(name.into()));
        m
    }

    fn v6_msg(index: u32, addr: &str) -> AddressMessage {
        let mut m = AddressMessage::default();
        m.header.family = AddressFamily::Inet6;
        m.header.index = index;
        m.header.prefix_len = 128;
        m.attributes
            .push(AddressAttribute::Address(addr.parse().unwrap()));
        m
    }

    #[test]
    fn global_ipv6_addresses_come_and_go_link_local_ones_never_come() {
        let mut t = AddrTable::default();
        t.apply(&RouteNetlinkMessage::NewLink(link_msg(5, "kube-ipvs0")));
        let new = |a| RouteNetlinkMessage::NewAddress(v6_msg(5, a));
        let del = |a| RouteNetlinkMessage::DelAddress(v6_msg(5, a));
        assert!(t.apply(&new("fd00::10")));
        assert!(
            !t.apply(&new("fd00::10")),
            "the same address again changes nothing"
        );
        assert!(!t.apply(&new("fe80::1")), "link-local");
        assert_eq!(
            t.v6_of("kube-ipvs0"),
            ["fd00::10".parse::<std::net::Ipv6Addr>().unwrap()]
        );
        assert!(t.has("kube-ipvs0", "fd00::10".parse().unwrap()));
        assert!(t.apply(&del("fd00::10")));
        assert!(!t.apply(&del("fd00::10")));
        assert!(t.v6_of("kube-ipvs0").is_empty());
    }

    #[test]
    fn notifications_apply_one_change_each() {
        let mut t = AddrTable::default();
        use RouteNetlinkMessage::*;
        assert!(t.apply(&NewLink(link_msg(5, "kube-ipvs0"))));
        assert!(!t.apply(&NewLink(link_msg(5, "kube-ipvs0"))));
        assert!(t.apply(&NewAddress(addr_msg(5, "198.51.100.100", false))));
        assert!(t.apply(&NewAddress(addr_msg(5, "198.51.100.101", true))));
        assert!(!t.apply(&NewAddress(addr_msg(5, "198.51.100.101", true))));
        // A promoted secondary: same address, new flags.
        assert!(t.apply(&NewAddress(addr_msg(5, "198.51.100.101", false))));
        assert_eq!(t.v4_of("kube-ipvs0").len(), 2);
        assert!(!t.v4_of("kube-ipvs0")[1].secondary);
        // The same address with another prefix is another entry.
        let mut other = addr_msg(5, "198.51.100.101", false);
        other.header.prefix_len = 24;
        assert!(t.apply(&NewAddress(other.clone())));
        assert!(t.apply(&DelAddress(other)));
        assert_eq!(t.v4_of("kube-ipvs0").len(), 2, "the /32 stays");
        assert!(t.apply(&DelAddress(addr_msg(5, "198.51.100.100", false))));
        assert_eq!(t.v4_of("kube-ipvs0").len(), 1);
        // IPv6 is not in this table.
        let mut v6 = addr_msg(5, "fd00::1", false);
        v6.header.family = AddressFamily::Inet6;
        assert!(!t.apply(&NewAddress(v6)));
        // Renamed, then deleted with its addresses.
        assert!(t.apply(&NewLink(link_msg(5, "lb0"))));
        assert_eq!(t.ifindex("kube-ipvs0"), None);
        assert_eq!(t.v4_of("lb0").len(), 1);
        assert!(t.apply(&DelLink(link_msg(5, "lb0"))));
        assert_eq!(t, AddrTable::default());
    }

    #[test]
    fn vlan_devices_are_known_by_lower_device_and_id() {
        let mut t = AddrTable::default();
        use RouteNetlinkMessage::*;
        let mut vlan = link_msg(7, "eth0.100");
        vlan.attributes.push(LinkAttribute::Link(2));
        vlan.attributes.push(LinkAttribute::LinkInfo(vec![
            LinkInfo::Kind(netlink_packet_route::link::InfoKind::Vlan),
            LinkInfo::Data(InfoData::Vlan(vec![InfoVlan::Id(100)])),
        ]));
        assert!(t.apply(&NewLink(vlan.clone())));
        assert!(!t.apply(&NewLink(vlan)));
        assert_eq!(t.vlans_on(2).collect::<Vec<_>>(), vec![(100, 7)]);
        assert_eq!(t.vlans_on(7).count(), 0);
        // A device with a lower link but no VLAN data (a veth) is no VLAN.
        let mut veth = link_msg(8, "eth1");
        veth.attributes.push(LinkAttribute::Link(9));
        assert!(t.apply(&NewLink(veth)));
        assert_eq!(t.vlans.len(), 1);
        assert!(t.apply(&DelLink(link_msg(7, "eth0.100"))));
        assert_eq!(t.vlans_on(2).count(), 0);
        // A VLAN device moved to this namespace from its lower device's.
        let mut moved = link_msg(10, "vlan-in");
        moved.attributes.push(LinkAttribute::Link(2));
        moved.attributes.push(LinkAttribute::LinkNetNsId(1));
        moved
            .attributes
            .push(LinkAttribute::LinkInfo(vec![LinkInfo::Data(
                InfoData::Vlan(vec![InfoVlan::Id(5)]),
            )]));
        t.apply(&NewLink(moved));
        assert_eq!(t.vlans.len(), 0, "its lower index is another namespace's");
    }
}
