//! Interfaces and their addresses, as the kernel reports them: IPv4 with
//! prefix and primary flag (what a leak's rewrite needs), global IPv6 as
//! plain addresses (the interface source keeps this table current; the view
//! reads it).

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

    pub fn v4_of(&self, name: &str) -> &[IfAddrV4] {
        self.ifindex(name)
            .map(|i| self.v4_of_index(i))
            .unwrap_or(&[])
    }
}
