//! The kernel's interfaces and their IPv4 addresses, kept current through
//! rtnetlink. One table serves three needs: LB IPs read from an interface
//! (`--lb-ips-from kube-ipvs0`), the "LB IP is on the egress interface" rule,
//! and the primary IPv4 an announce leak is rewritten to.
//!
//! Notifications only trigger a fresh dump: the table is always a complete
//! snapshot, so a lost or reordered notification cannot leave it wrong, and a
//! periodic dump repairs anything that slipped through.

use std::{collections::BTreeMap, net::Ipv4Addr, time::Duration};

use anyhow::{Context as _, Result};
use futures::{StreamExt as _, TryStreamExt as _};
use netlink_packet_route::{
    address::{AddressAttribute, AddressHeaderFlags},
    link::LinkAttribute,
    AddressFamily,
};
use rtnetlink::{Handle, MulticastGroup};
use tokio::sync::watch;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IfAddr {
    pub addr: Ipv4Addr,
    /// IFA_F_SECONDARY: not the primary address of its subnet on this interface.
    pub secondary: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AddrTable {
    /// Interface name -> ifindex.
    pub links: BTreeMap<String, u32>,
    /// ifindex -> IPv4 addresses in the kernel's order (primaries first per subnet).
    pub v4: BTreeMap<u32, Vec<IfAddr>>,
}

impl AddrTable {
    pub fn ifindex(&self, name: &str) -> Option<u32> {
        self.links.get(name).copied()
    }

    pub fn v4_of_index(&self, ifindex: u32) -> &[IfAddr] {
        self.v4.get(&ifindex).map(Vec::as_slice).unwrap_or(&[])
    }

    pub fn v4_of(&self, name: &str) -> &[IfAddr] {
        self.ifindex(name)
            .map(|i| self.v4_of_index(i))
            .unwrap_or(&[])
    }
}

/// Read all links and IPv4 addresses once.
pub async fn dump(handle: &Handle) -> Result<AddrTable> {
    let mut table = AddrTable::default();
    let mut links = handle.link().get().execute();
    while let Some(msg) = links.try_next().await.context("netlink link dump")? {
        let name = msg.attributes.iter().find_map(|a| match a {
            LinkAttribute::IfName(n) => Some(n.clone()),
            _ => None,
        });
        if let Some(name) = name {
            table.links.insert(name, msg.header.index);
        }
    }
    let mut addrs = handle.address().get().execute();
    while let Some(msg) = addrs.try_next().await.context("netlink address dump")? {
        if msg.header.family != AddressFamily::Inet {
            continue;
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
        if let Some(addr) = local.or(address) {
            table.v4.entry(msg.header.index).or_default().push(IfAddr {
                addr,
                secondary: msg.header.flags.contains(AddressHeaderFlags::Secondary),
            });
        }
    }
    Ok(table)
}

/// Netlink notifications; only their arrival matters, not their content.
pub type Notifications = futures::channel::mpsc::UnboundedReceiver<(
    rtnetlink::packet_core::NetlinkMessage<rtnetlink::packet_route::RouteNetlinkMessage>,
    rtnetlink::sys::SocketAddr,
)>;

/// Open a netlink connection subscribed to link and IPv4 address changes.
pub fn connect() -> Result<(Handle, Notifications)> {
    let (conn, handle, messages) =
        rtnetlink::new_multicast_connection(&[MulticastGroup::Link, MulticastGroup::Ipv4Ifaddr])
            .context("cannot open an rtnetlink socket")?;
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

/// Publish a fresh table into `tx` after every change notification (coalesced
/// over `SETTLE`) and at least every `resync`. Runs for the life of the
/// daemon: a broken netlink socket is reopened with backoff, and meanwhile
/// the maps keep their last state.
pub async fn watch(
    mut handle: Handle,
    mut notifications: Notifications,
    tx: watch::Sender<AddrTable>,
    resync: Duration,
) {
    const SETTLE: Duration = Duration::from_millis(20);
    let mut ticker = tokio::time::interval(resync.max(Duration::from_secs(1)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            n = notifications.next() => {
                if n.is_none() {
                    (handle, notifications) = reconnect().await;
                }
                // Coalesce a burst (kube-proxy adds many addresses at once).
                tokio::time::sleep(SETTLE).await;
                while notifications.try_recv().is_ok() {}
            }
            _ = ticker.tick() => {}
        }
        match dump(&handle).await {
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
}
