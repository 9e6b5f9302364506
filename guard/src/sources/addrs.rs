//! The kernel's interfaces and their addresses (IPv4, and global IPv6),
//! their kinds and the default routes, kept current through rtnetlink. One
//! table serves four needs: LB IPs read from an interface (`--lb-ips-from
//! kube-ipvs0`: both families), the "LB IP is on the egress interface" rule,
//! the primary IPv4 an announce leak is rewritten to (IPv4 only: NDP has
//! neither), and `--interface auto`'s choice of uplinks (kinds, bonds'
//! slaves, default routes).
//!
//! Notifications are applied as they come (one address or link each), so an
//! address kube-vip or kube-proxy adds reaches the maps within a millisecond
//! or so; a full dump every `--resync` (and after a socket overrun) repairs
//! anything a lost notification left wrong.

use std::time::Duration;

use futures::{StreamExt as _, TryStreamExt as _};
use netlink_packet_route::{
    address::{AddressAttribute, AddressHeaderFlags, AddressMessage},
    link::{InfoData, InfoKind, InfoVlan, LinkAttribute, LinkFlags, LinkInfo, LinkMessage},
    route::{RouteAttribute, RouteHeader, RouteMessage, RouteType},
    AddressFamily, RouteNetlinkMessage,
};
use rtnetlink::packet_core::NetlinkPayload;

pub use crate::model::addrs::{AddrTable, IfAddrV4};
use crate::model::addrs::{Device, DeviceKind, RouteKey};
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

/// What kind of device a link message describes.
fn device_of(msg: &LinkMessage) -> Device {
    let kind = msg.attributes.iter().find_map(|a| match a {
        LinkAttribute::LinkInfo(infos) => infos.iter().find_map(|i| match i {
            LinkInfo::Kind(k) => Some(k),
            _ => None,
        }),
        _ => None,
    });
    let kind = kind.map(|k| match k {
        InfoKind::Other(name) => name.clone(),
        k => k.to_string(),
    });
    let ether = msg.attributes.iter().any(|a| match a {
        LinkAttribute::Address(mac) => mac.len() == 6 && mac.iter().any(|b| *b != 0),
        _ => false,
    });
    Device {
        kind: DeviceKind::from_kind(kind.as_deref()),
        controller: msg.attributes.iter().find_map(|a| match a {
            LinkAttribute::Controller(c) if *c != 0 => Some(*c),
            _ => None,
        }),
        ether,
        loopback: msg.header.flags.contains(LinkFlags::Loopback),
        up: msg.header.flags.contains(LinkFlags::Up),
        carrier: msg.header.flags.contains(LinkFlags::LowerUp),
    }
}

/// A default route's identity and the links it leaves through; None for
/// any other route (a prefix, the local table, a blackhole).
fn default_route(msg: &RouteMessage) -> Option<(RouteKey, Vec<u32>)> {
    let h = &msg.header;
    let v6 = match h.address_family {
        AddressFamily::Inet => false,
        AddressFamily::Inet6 => true,
        _ => return None,
    };
    if h.destination_prefix_length != 0 || h.kind != RouteType::Unicast {
        return None;
    }
    let table = msg.attributes.iter().find_map(|a| match a {
        RouteAttribute::Table(t) => Some(*t),
        _ => None,
    });
    let table = table.unwrap_or(u32::from(h.table));
    // 255: the local table (addresses of this host, never a way out).
    if table == 255 {
        return None;
    }
    let metric = msg.attributes.iter().find_map(|a| match a {
        RouteAttribute::Priority(p) => Some(*p),
        _ => None,
    });
    let mut oifs: Vec<u32> = msg
        .attributes
        .iter()
        .flat_map(|a| match a {
            RouteAttribute::Oif(i) => vec![*i],
            RouteAttribute::MultiPath(hops) => hops.iter().map(|h| h.interface_index).collect(),
            _ => Vec::new(),
        })
        .collect();
    oifs.sort_unstable();
    oifs.dedup();
    let key = RouteKey {
        v6,
        table,
        metric: metric.unwrap_or(0),
    };
    Some((key, oifs))
}

/// Whether `msg` takes a link that was up down (`IFF_UP` cleared).
fn goes_down(table: &AddrTable, msg: &RouteNetlinkMessage) -> bool {
    match msg {
        RouteNetlinkMessage::NewLink(m) => {
            let was_up = (table.devices.get(&m.header.index)).is_some_and(|d| d.up);
            was_up && !m.header.flags.contains(LinkFlags::Up)
        }
        _ => false,
    }
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

    /// A link appeared or changed (kind, master, flags, name).
    fn new_link(&mut self, m: &LinkMessage) -> bool {
        let index = m.header.index;
        let vlan_changed = match vlan_of(m) {
            Some(v) => self.vlans.insert(index, v) != Some(v),
            None => false,
        };
        let device = device_of(m);
        let changed = vlan_changed | (self.devices.get(&index) != Some(&device));
        self.devices.insert(index, device);
        let Some(name) = link_name(m) else {
            return changed;
        };
        if self.links.get(&name) == Some(&index) {
            changed
        } else {
            // A rename: the old name goes.
            self.links.retain(|_, i| *i != index);
            self.links.insert(name, index);
            true
        }
    }

    /// A link went, with its addresses and routes.
    fn del_link(&mut self, index: u32) -> bool {
        let before = self.links.len();
        self.links.retain(|_, i| *i != index);
        let gone = self.v4.remove(&index).is_some() | self.v6.remove(&index).is_some();
        let vlan_gone = self.vlans.remove(&index).is_some();
        let device_gone = self.devices.remove(&index).is_some();
        // The kernel removes the link's routes without telling.
        let routes_before = self.default_routes.clone();
        self.default_routes.retain(|_, oifs| {
            oifs.retain(|i| *i != index);
            !oifs.is_empty()
        });
        let routes_gone = routes_before != self.default_routes;
        gone || vlan_gone || device_gone || routes_gone || self.links.len() != before
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
            RouteNetlinkMessage::NewLink(m) => self.new_link(m),
            RouteNetlinkMessage::DelLink(m) => self.del_link(m.header.index),
            RouteNetlinkMessage::NewRoute(m) => match default_route(m) {
                Some((key, oifs)) => self.default_routes.insert(key, oifs.clone()) != Some(oifs),
                None => false,
            },
            RouteNetlinkMessage::DelRoute(m) => match default_route(m) {
                Some((key, _)) => self.default_routes.remove(&key).is_some(),
                None => false,
            },
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

/// Read all links, their IPv4 and global IPv6 addresses and the default
/// routes once.
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
        table.devices.insert(msg.header.index, device_of(&msg));
    }
    for family in [AddressFamily::Inet, AddressFamily::Inet6] {
        let mut req = RouteMessage::default();
        req.header.address_family = family;
        req.header.table = RouteHeader::RT_TABLE_UNSPEC;
        let mut routes = handle.route().get(req).execute();
        loop {
            match routes.try_next().await {
                Ok(Some(msg)) => {
                    if let Some((key, oifs)) = default_route(&msg) {
                        table.default_routes.insert(key, oifs);
                    }
                }
                Ok(None) => break,
                // A kernel booted without IPv6 refuses that family's dump:
                // it has no IPv6 default route.
                Err(_) if family == AddressFamily::Inet6 => break,
                Err(e) => return Err(failed("route")(e)),
            }
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

/// Open a netlink connection subscribed to link, address and route
/// changes (routes: only default ones are kept; the others are read and
/// dropped, a few microseconds each).
pub fn connect() -> Result<(Handle, Notifications), AddrsError> {
    let (conn, handle, messages) = rtnetlink::new_multicast_connection(&[
        MulticastGroup::Link,
        MulticastGroup::Ipv4Ifaddr,
        MulticastGroup::Ipv6Ifaddr,
        MulticastGroup::Ipv4Route,
        MulticastGroup::Ipv6Route,
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
                            NetlinkPayload::InnerMessage(m) => {
                                // The kernel drops a link's IPv4 routes when
                                // it goes down without saying so: read them.
                                lost |= goes_down(table, &m);
                                changed |= table.apply(&m);
                            }
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

    fn route_msg(v6: bool, dst_len: u8, table: u8, metric: u32, oif: u32) -> RouteMessage {
        let mut m = RouteMessage::default();
        m.header.address_family = if v6 {
            AddressFamily::Inet6
        } else {
            AddressFamily::Inet
        };
        m.header.destination_prefix_length = dst_len;
        m.header.table = table;
        m.header.kind = RouteType::Unicast;
        m.attributes.push(RouteAttribute::Priority(metric));
        m.attributes.push(RouteAttribute::Oif(oif));
        m
    }

    #[test]
    fn default_routes_come_and_go_and_leave_with_their_link() {
        use RouteNetlinkMessage::*;
        let mut t = AddrTable::default();
        t.apply(&NewLink(link_msg(2, "eno1")));
        t.apply(&NewLink(link_msg(3, "eno2")));
        assert!(t.apply(&NewRoute(route_msg(false, 0, 254, 100, 2))));
        assert!(
            !t.apply(&NewRoute(route_msg(false, 0, 254, 100, 2))),
            "the same"
        );
        assert!(
            !t.apply(&NewRoute(route_msg(false, 24, 254, 0, 3))),
            "not a default route"
        );
        assert!(
            !t.apply(&NewRoute(route_msg(false, 0, 255, 0, 3))),
            "the local table"
        );
        assert!(t.apply(&NewRoute(route_msg(true, 0, 254, 1024, 3))));
        assert!(t.has_default_route(2) && t.has_default_route(3));
        // Replaced through another link (the same table and metric).
        assert!(t.apply(&NewRoute(route_msg(false, 0, 254, 100, 3))));
        assert!(!t.has_default_route(2));
        assert!(t.apply(&DelRoute(route_msg(false, 0, 254, 100, 3))));
        assert!(t.has_default_route(3), "the IPv6 one stays");
        assert!(t.apply(&DelLink(link_msg(3, "eno2"))));
        assert!(t.default_routes.is_empty(), "gone with its link");
    }

    #[test]
    fn links_say_their_kind_master_and_ethernet_address() {
        use crate::model::addrs::DeviceKind;
        use RouteNetlinkMessage::*;
        let mut t = AddrTable::default();
        let mut slave = link_msg(2, "eno1");
        slave
            .attributes
            .push(LinkAttribute::Address(vec![2, 0, 0, 0, 0, 1]));
        slave.attributes.push(LinkAttribute::Controller(4));
        slave.header.flags = LinkFlags::Up | LinkFlags::LowerUp;
        assert!(t.apply(&NewLink(slave)));
        let d = &t.devices[&2];
        assert_eq!(d.kind, DeviceKind::Physical);
        assert_eq!(d.controller, Some(4));
        assert!(d.ether && d.up && d.carrier && !d.loopback);
        let mut wg = link_msg(5, "wg0");
        wg.attributes
            .push(LinkAttribute::LinkInfo(vec![LinkInfo::Kind(
                InfoKind::Wireguard,
            )]));
        t.apply(&NewLink(wg));
        assert_eq!(t.devices[&5].kind, DeviceKind::Tunnel("wireguard".into()));
        assert!(!t.devices[&5].ether, "no address");
        // The carrier goes: a change of the table.
        let mut down = link_msg(2, "eno1");
        down.attributes
            .push(LinkAttribute::Address(vec![2, 0, 0, 0, 0, 1]));
        down.attributes.push(LinkAttribute::Controller(4));
        down.header.flags = LinkFlags::Up;
        assert!(t.apply(&NewLink(down)));
        assert!(!t.devices[&2].carrier);
        let mut off = link_msg(2, "eno1");
        off.header.flags = LinkFlags::empty();
        assert!(
            goes_down(&t, &NewLink(off)),
            "set down: its routes are read again"
        );
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
