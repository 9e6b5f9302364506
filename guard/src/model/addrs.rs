//! Interfaces and their addresses, as the kernel reports them: IPv4 with
//! prefix and primary flag (what a leak's rewrite needs), global IPv6 as
//! plain addresses, what kind of device each link is and which links carry
//! a default route (what choosing the uplinks needs). The interface source
//! keeps this table current; the view and the uplinks' choice read it.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

/// One IPv4 address of an interface (IPv6 ones are [`AddrTable::v6`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IfAddrV4 {
    pub addr: Ipv4Addr,
    /// The prefix length: the same address may be there twice, with two.
    pub prefix: u8,
    /// IFA_F_SECONDARY: not the primary address of its subnet on this interface.
    pub secondary: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AddrTable {
    /// Interface name -> ifindex.
    pub links: BTreeMap<String, u32>,
    /// ifindex -> IPv4 addresses in the kernel's order (primaries first per subnet).
    pub v4: BTreeMap<u32, Vec<IfAddrV4>>,
    /// VLAN device's ifindex -> (its lower device's ifindex, VLAN ID).
    pub vlans: BTreeMap<u32, (u32, u16)>,
    /// ifindex -> global IPv6 addresses (link-local ones are nobody's LB IP),
    /// for `--lb-ips-from`.
    pub v6: BTreeMap<u32, Vec<Ipv6Addr>>,
    /// ifindex -> what kind of device it is (`--interface auto`).
    pub devices: BTreeMap<u32, Device>,
    /// The default routes (IPv4 and IPv6, every table but `local`): each
    /// route's identity -> the links it leaves through.
    pub default_routes: BTreeMap<RouteKey, Vec<u32>>,
}

/// What kind of link a device is, as far as choosing uplinks goes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum DeviceKind {
    /// No `IFLA_INFO_KIND`: a physical NIC (or a driver that names none).
    Physical,
    Bond,
    Bridge,
    Vlan,
    Veth,
    Dummy,
    /// An IP-in-something tunnel or overlay (vxlan, geneve, ipip, gre,
    /// wireguard, tun ...): never the segment the LB IPs are announced on.
    Tunnel(String),
    /// Any other kind the kernel names (macvlan, team, ...).
    Other(String),
}

impl DeviceKind {
    /// From the kernel's `IFLA_INFO_KIND` name (None: a physical NIC).
    pub fn from_kind(kind: Option<&str>) -> DeviceKind {
        match kind {
            None => DeviceKind::Physical,
            Some("bond") => DeviceKind::Bond,
            Some("bridge") | Some("openvswitch") => DeviceKind::Bridge,
            Some("vlan") => DeviceKind::Vlan,
            Some("veth") | Some("netkit") => DeviceKind::Veth,
            Some("dummy") => DeviceKind::Dummy,
            Some(
                k @ ("vxlan" | "geneve" | "ipip" | "ip6tnl" | "sit" | "gre" | "gretap" | "ip6gre"
                | "ip6gretap" | "erspan" | "ip6erspan" | "vti" | "vti6" | "wireguard" | "tun"
                | "xfrm" | "gtp" | "bareudp" | "amt"),
            ) => DeviceKind::Tunnel(k.to_owned()),
            Some(k) => DeviceKind::Other(k.to_owned()),
        }
    }
}

/// One link beyond its name and addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    pub kind: DeviceKind,
    /// The bond or bridge it is enslaved to (`IFLA_MASTER`).
    pub controller: Option<u32>,
    /// It has an Ethernet address (6 bytes, not all zero): ARP and NDP
    /// happen on it.
    pub ether: bool,
    pub loopback: bool,
    /// Set up by the administrator (`IFF_UP`).
    pub up: bool,
    /// The carrier is up (`IFF_LOWER_UP`).
    pub carrier: bool,
}

/// A default route's identity, as the kernel tells one from another (a
/// deletion names the same).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct RouteKey {
    pub v6: bool,
    pub table: u32,
    pub metric: u32,
}

impl AddrTable {
    pub fn ifindex(&self, name: &str) -> Option<u32> {
        self.links.get(name).copied()
    }

    pub fn v4_of_index(&self, ifindex: u32) -> &[IfAddrV4] {
        self.v4.get(&ifindex).map(Vec::as_slice).unwrap_or(&[])
    }

    /// The VLAN devices directly on `lower`: (VLAN ID, ifindex).
    pub fn vlans_on(&self, lower: u32) -> impl Iterator<Item = (u16, u32)> + '_ {
        self.vlans
            .iter()
            .filter(move |(_, (l, _))| *l == lower)
            .map(|(dev, (_, vid))| (*vid, *dev))
    }

    pub fn v6_of(&self, name: &str) -> &[Ipv6Addr] {
        self.ifindex(name)
            .and_then(|i| self.v6.get(&i))
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    /// Whether `ip` is on the interface `name`.
    pub fn has(&self, name: &str, ip: IpAddr) -> bool {
        match ip {
            IpAddr::V4(v4) => self.v4_of(name).iter().any(|a| a.addr == v4),
            IpAddr::V6(v6) => self.v6_of(name).contains(&v6),
        }
    }

    /// The name of link `ifindex`.
    pub fn name_of(&self, ifindex: u32) -> Option<&str> {
        (self.links.iter())
            .find(|(_, i)| **i == ifindex)
            .map(|(n, _)| n.as_str())
    }

    /// Whether a default route leaves through link `ifindex`.
    pub fn has_default_route(&self, ifindex: u32) -> bool {
        self.default_routes.values().any(|o| o.contains(&ifindex))
    }

    /// The links holding `ip`.
    pub fn holding(&self, ip: IpAddr) -> Vec<u32> {
        match ip {
            IpAddr::V4(v4) => (self.v4.iter())
                .filter(|(_, a)| a.iter().any(|a| a.addr == v4))
                .map(|(i, _)| *i)
                .collect(),
            IpAddr::V6(v6) => (self.v6.iter())
                .filter(|(_, a)| a.contains(&v6))
                .map(|(i, _)| *i)
                .collect(),
        }
    }

    pub fn v4_of(&self, name: &str) -> &[IfAddrV4] {
        self.ifindex(name)
            .map(|i| self.v4_of_index(i))
            .unwrap_or(&[])
    }
}
