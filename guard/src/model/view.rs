//! This node's view: what the BPF maps should hold, derived from the sources.
//!
//! A pure function of its inputs, so that every reload, every netlink change
//! and every test goes through the same derivation.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv4Addr},
    sync::Arc,
};

use guard_common::Ownership;

use super::{addrs::AddrTable, cluster::OwnerRecord, ownership::OwnershipFile};

/// Where the knowledge about an LB IP came from (for logs and explanations).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Provenance {
    /// The ownership file, at this line.
    File { line: usize, owner: Option<String> },
    /// An address on this interface; no owner known.
    Interface(String),
    /// The Kubernetes API: which object said so (shared with the claim).
    Cluster {
        owner: Option<Arc<str>>,
        why: Arc<str>,
        /// The Service that carries the IP (Events are attached to it).
        service: Option<super::cluster::ServiceRef>,
        /// Services share the IP and were elected separately.
        split: Option<Arc<guard_wire::api::SplitElection>>,
    },
    /// What the previous daemon left in the pinned maps, kept until the
    /// Kubernetes feed has synced.
    Pinned,
}

impl std::fmt::Display for Provenance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Provenance::File {
                line,
                owner: Some(o),
            } => write!(f, "ownership file line {line}: owner {o}"),
            Provenance::File { line, owner: None } => {
                write!(f, "ownership file line {line}: no owner")
            }
            Provenance::Interface(i) => write!(f, "address on {i}, no owner known"),
            Provenance::Cluster { why, .. } => f.write_str(why),
            Provenance::Pinned => f.write_str(
                "kept from the previous daemon's pinned maps until the Kubernetes feed syncs",
            ),
        }
    }
}

impl Provenance {
    /// The owner node it names, if any.
    pub fn owner(&self) -> Option<&str> {
        match self {
            Provenance::File { owner, .. } => owner.as_deref(),
            Provenance::Cluster { owner, .. } => owner.as_deref(),
            Provenance::Interface(_) | Provenance::Pinned => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LbIp {
    pub state: Ownership,
    pub source: Provenance,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct View {
    /// LB IPs (IPv4 for ARP, IPv6 for Neighbor Discovery) and this node's
    /// state for each.
    pub lb: BTreeMap<IpAddr, LbIp>,
    /// (ifindex, address) for every IPv4 address on an uplink.
    pub if_addrs: BTreeSet<(u32, Ipv4Addr)>,
    /// Uplink ifindex -> the IPv4 an announce leak is rewritten to.
    pub if_primary: BTreeMap<u32, Ipv4Addr>,
    /// (lower ifindex, VLAN ID) -> VLAN device, for the VLAN devices on an
    /// uplink (two levels): a tagged frame is judged against its
    /// VLAN device's addresses, which `if_addrs`/`if_primary` hold as well.
    pub vlan_uppers: BTreeMap<(u32, u16), u32>,
}

pub struct Inputs<'a> {
    pub node: &'a str,
    pub file: Option<&'a OwnershipFile>,
    /// Interfaces whose addresses are LB IPs (`--lb-ips-from`).
    pub lb_ifaces: &'a [String],
    /// The uplinks: the interfaces the guard is attached to (`--interface`).
    pub uplinks: &'a [String],
    pub addrs: &'a AddrTable,
    pub cluster: Option<ClusterIn<'a>>,
}

/// What the view reads of the cluster feed: its owner records (as the feed
/// keeps them, under its lock) and whether it is stale.
#[derive(Clone, Copy)]
pub struct ClusterIn<'a> {
    pub owners: &'a BTreeMap<IpAddr, Arc<OwnerRecord>>,
    pub degraded: bool,
}

/// This node's state for an IP whose owner is `owner`. When the source may be
/// stale, "another node owns it" is no longer trusted: unknown. The owner
/// itself keeps its permission however stale the source: only a confirmed
/// change takes it away.
fn state_of(owner: Option<&str>, node: &str, stale: bool) -> Ownership {
    match owner {
        Some(o) if o == node => Ownership::Owned,
        Some(_) if stale => Ownership::Unknown,
        Some(_) => Ownership::Foreign,
        None => Ownership::Unknown,
    }
}

/// This node's entry for one LB IP, from every source at once: the file's
/// statement wins (the operator's word), then the cluster's record (while
/// the feed is stale "another node owns it" degrades to unknown), then an
/// address on an LB interface (`on_iface`: which one), with no owner known.
/// The one decision per IP: the full derivation folds it over every IP, an
/// incremental update calls it for the IPs that changed.
pub fn derive_ip(i: &Inputs<'_>, ip: IpAddr, on_iface: Option<&str>) -> Option<LbIp> {
    if let Some(entry) = i.file.and_then(|f| f.ips.get(&ip)) {
        return Some(LbIp {
            state: state_of(entry.owner.as_deref(), i.node, false),
            source: Provenance::File {
                line: entry.line,
                owner: entry.owner.clone(),
            },
        });
    }
    if let Some(c) = &i.cluster {
        if let Some(claim) = c.owners.get(&ip) {
            let stale = c.degraded || !claim.certain;
            return Some(LbIp {
                state: state_of(claim.owner.as_deref(), i.node, stale),
                source: Provenance::Cluster {
                    owner: claim.owner.clone(),
                    why: claim.why.clone(),
                    service: claim.service.clone(),
                    split: claim.split.clone(),
                },
            });
        }
    }
    on_iface.map(|name| LbIp {
        state: Ownership::Unknown,
        source: Provenance::Interface(name.to_owned()),
    })
}

/// The LB interface `ip` is on (the last of `--lb-ips-from` that has it).
fn lb_iface<'a>(i: &Inputs<'a>, ip: IpAddr) -> Option<&'a str> {
    i.lb_ifaces
        .iter()
        .rev()
        .find(|n| i.addrs.has(n, ip))
        .map(String::as_str)
}

pub fn compute(i: &Inputs<'_>) -> View {
    let mut view = View::default();
    // Every IP some source names, with the LB interface it is on.
    let mut ips: BTreeMap<IpAddr, Option<&str>> = BTreeMap::new();
    for name in i.lb_ifaces {
        for a in i.addrs.v4_of(name) {
            ips.insert(IpAddr::V4(a.addr), Some(name.as_str()));
        }
        for a in i.addrs.v6_of(name) {
            ips.insert(IpAddr::V6(*a), Some(name.as_str()));
        }
    }
    if let Some(c) = &i.cluster {
        for ip in c.owners.keys() {
            ips.entry(*ip).or_insert(None);
        }
    }
    if let Some(f) = i.file {
        for ip in f.ips.keys() {
            ips.entry(*ip).or_insert(None);
        }
    }
    for (ip, on) in ips {
        if let Some(l) = derive_ip(i, ip, on) {
            view.lb.insert(ip, l);
        }
    }
    view.derive_interfaces(i);
    view
}

impl View {
    /// The uplinks' addresses and rewrite addresses (few: the
    /// uplinks'), derived anew from `i` and the LB set.
    fn derive_interfaces(&mut self, i: &Inputs<'_>) {
        self.if_addrs.clear();
        self.if_primary.clear();
        self.vlan_uppers.clear();
        let mut devices = Vec::new();
        for name in i.uplinks {
            let Some(ifindex) = i.addrs.ifindex(name) else {
                continue;
            };
            devices.push(ifindex);
            // VLAN devices on it, and on those (QinQ): as deep as the
            // program looks through tags.
            for (vid, dev) in i.addrs.vlans_on(ifindex) {
                self.vlan_uppers.insert((ifindex, vid), dev);
                devices.push(dev);
                for (vid2, dev2) in i.addrs.vlans_on(dev) {
                    self.vlan_uppers.insert((dev, vid2), dev2);
                    devices.push(dev2);
                }
            }
        }
        for ifindex in devices {
            let addrs = i.addrs.v4_of_index(ifindex);
            for a in addrs {
                self.if_addrs.insert((ifindex, a.addr));
            }
            // arp_announce=2 picks a primary address; never rewrite to an LB IP.
            let not_lb = |a: &&super::addrs::IfAddrV4| !self.lb.contains_key(&IpAddr::V4(a.addr));
            let primary = addrs
                .iter()
                .filter(not_lb)
                .find(|a| !a.secondary)
                .or_else(|| addrs.iter().find(not_lb));
            if let Some(p) = primary {
                self.if_primary.insert(ifindex, p.addr);
            }
        }
    }

    /// Bring the view to what [`compute`] would give for `i`, re-deriving
    /// only the LB IPs in `changed` (every IP whose sources may have changed)
    /// with the same per-IP decision. Returns the LB IPs whose entry did
    /// change (added, removed or different), for the map writer.
    pub fn update(&mut self, i: &Inputs<'_>, changed: &BTreeSet<IpAddr>) -> BTreeSet<IpAddr> {
        let mut out = BTreeSet::new();
        for ip in changed {
            let next = derive_ip(i, *ip, lb_iface(i, *ip));
            if self.lb.get(ip) == next.as_ref() {
                continue;
            }
            match next {
                Some(l) => self.lb.insert(*ip, l),
                None => self.lb.remove(ip),
            };
            out.insert(*ip);
        }
        self.derive_interfaces(i);
        out
    }

    /// Until the Kubernetes feed has synced, an IP that only the interface
    /// source knows keeps the state the previous daemon left pinned (`held`):
    /// "unknown" from kube-ipvs0 must not overrule "foreign" from the cluster.
    pub fn hold_previous(&mut self, held: impl Fn(IpAddr) -> Option<Ownership>) {
        for (ip, l) in self.lb.iter_mut() {
            if let (Provenance::Interface(_), Some(state)) = (&l.source, held(*ip)) {
                *l = LbIp {
                    state,
                    source: Provenance::Pinned,
                };
            }
        }
    }

    pub fn count(&self, state: Ownership) -> usize {
        self.lb.values().filter(|l| l.state == state).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{model::addrs::IfAddrV4, sources::file as ownership_file};
    use std::path::Path;

    fn table() -> AddrTable {
        let mut t = AddrTable::default();
        t.links.insert("eth0".into(), 2);
        t.links.insert("kube-ipvs0".into(), 5);
        let a = |s: &str, secondary| IfAddrV4 {
            addr: s.parse().unwrap(),
            prefix: 32,
            secondary,
        };
        t.v4.insert(
            2,
            vec![
                a("198.51.100.100", false),
                a("198.51.100.11", false),
                a("198.51.100.12", true),
            ],
        );
        t.v4.insert(
            5,
            vec![
                a("198.51.100.100", false),
                a("198.51.100.101", false),
                a("10.96.0.1", false),
            ],
        );
        t
    }

    #[test]
    fn file_and_interface_sources_merge() {
        let file = ownership_file::parse(
            Path::new("f.yaml"),
            "ips:\n  - ip: 198.51.100.100\n    owner: node-a\n  - ip: 198.51.100.101\n    owner: node-b\n  - ip: 198.51.100.102\n  - ip: fd00::1\n    owner: node-a\n",
        )
        .unwrap();
        let t = table();
        let uplinks = ["eth0".to_string(), "eth9".to_string()];
        let lb_from = ["kube-ipvs0".to_string()];
        let v = compute(&Inputs {
            node: "node-a",
            file: Some(&file),
            lb_ifaces: &lb_from,
            uplinks: &uplinks,
            addrs: &t,
            cluster: None,
        });
        let st = |s: &str| v.lb[&s.parse::<IpAddr>().unwrap()].state;
        assert_eq!(st("198.51.100.100"), Ownership::Owned);
        assert_eq!(st("198.51.100.101"), Ownership::Foreign);
        assert_eq!(st("198.51.100.102"), Ownership::Unknown);
        assert_eq!(st("10.96.0.1"), Ownership::Unknown);
        // Dual-stack: the IPv6 LB IP is judged like the others.
        assert_eq!(st("fd00::1"), Ownership::Owned);
        assert_eq!(v.lb.len(), 5);
        assert_eq!(v.lb.keys().filter(|ip| ip.is_ipv6()).count(), 1);
        assert!(
            matches!(v.lb[&"10.96.0.1".parse().unwrap()].source, Provenance::Interface(ref n) if n == "kube-ipvs0")
        );
        // eth0's addresses are known; eth9 does not exist and is skipped.
        assert_eq!(v.if_addrs.len(), 3);
        // The LB IP that happens to be first on eth0 is never the rewrite address.
        assert_eq!(
            v.if_primary[&2],
            "198.51.100.11".parse::<Ipv4Addr>().unwrap()
        );
        assert_eq!(v.count(Ownership::Unknown), 2);
    }

    #[test]
    fn ipv6_addresses_of_an_lb_interface_are_lb_ips() {
        let mut t = table();
        t.v6.insert(5, vec!["fd00::10".parse().unwrap()]);
        t.v6.insert(2, vec!["fd00::99".parse().unwrap()]);
        let lb_from = ["kube-ipvs0".to_string()];
        let v = compute(&Inputs {
            node: "node-a",
            file: None,
            lb_ifaces: &lb_from,
            uplinks: &["eth0".to_string()],
            addrs: &t,
            cluster: None,
        });
        let v6: IpAddr = "fd00::10".parse().unwrap();
        assert_eq!(v.lb[&v6].state, Ownership::Unknown);
        assert!(matches!(v.lb[&v6].source, Provenance::Interface(ref n) if n == "kube-ipvs0"));
        // An address on the uplink is not an LB IP.
        assert!(!v.lb.contains_key(&"fd00::99".parse::<IpAddr>().unwrap()));
    }

    #[test]
    fn vlan_devices_on_a_guarded_interface_are_judged_with_their_own_addresses() {
        let mut t = table();
        // eth0 (2) carries eth0.100 (7), which carries eth0.100.200 (8); eth9's
        // VLAN (9) is on an interface that is not guarded.
        t.links.insert("eth0.100".into(), 7);
        t.links.insert("eth0.100.200".into(), 8);
        t.vlans.insert(7, (2, 100));
        t.vlans.insert(8, (7, 200));
        t.vlans.insert(9, (99, 100));
        let a = |s: &str| IfAddrV4 {
            addr: s.parse().unwrap(),
            prefix: 24,
            secondary: false,
        };
        t.v4.insert(7, vec![a("203.0.113.11")]);
        t.v4.insert(8, vec![a("203.0.113.12")]);
        t.v4.insert(9, vec![a("203.0.113.13")]);
        let uplinks = ["eth0".to_string()];
        let v = compute(&Inputs {
            node: "node-a",
            file: None,
            lb_ifaces: &[],
            uplinks: &uplinks,
            addrs: &t,
            cluster: None,
        });
        let want: BTreeMap<(u32, u16), u32> = [((2, 100), 7), ((7, 200), 8)].into();
        assert_eq!(v.vlan_uppers, want);
        let ip = |s: &str| s.parse::<Ipv4Addr>().unwrap();
        assert_eq!(v.if_primary[&7], ip("203.0.113.11"));
        assert_eq!(v.if_primary[&8], ip("203.0.113.12"));
        assert!(v.if_addrs.contains(&(7, ip("203.0.113.11"))));
        assert!(!v.if_primary.contains_key(&9), "not on a guarded interface");
    }

    #[test]
    fn another_node_sees_foreign() {
        let file = ownership_file::parse(
            Path::new("f.yaml"),
            "ips:\n  - ip: 198.51.100.100\n    owner: node-a\n",
        )
        .unwrap();
        let t = table();
        let v = compute(&Inputs {
            node: "node-b",
            file: Some(&file),
            lb_ifaces: &[],
            uplinks: &[],
            addrs: &t,
            cluster: None,
        });
        assert_eq!(
            v.lb[&"198.51.100.100".parse().unwrap()].state,
            Ownership::Foreign
        );
        assert!(v.if_primary.is_empty());
    }

    use crate::testing::Rng;

    /// After any sequence of address additions and removals (on the LB
    /// interface and on the uplink), claims that appear, change and go,
    /// the feed degrading and recovering and the file being reloaded, the
    /// view kept by `update` for the IPs each event touched equals `compute`
    /// from the same inputs.
    #[test]
    fn incremental_view_equals_the_full_derivation() {
        use crate::model::{cluster::OwnerRecord, ownership::Entry};
        let pool: Vec<IpAddr> = (1..=12)
            .map(|i| IpAddr::V4(Ipv4Addr::new(198, 51, 100, i)))
            .chain(
                (1..=4).map(|i| IpAddr::V6(std::net::Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, i))),
            )
            .collect();
        let owners = [None, Some("node-a"), Some("node-b")];
        let uplinks = ["eth0".to_string()];
        let lb_from = ["kube-ipvs0".to_string(), "lb1".to_string()];
        for seed in 1..=40u64 {
            let mut r = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            let mut t = AddrTable::default();
            t.links.insert("eth0".into(), 2);
            t.links.insert("kube-ipvs0".into(), 5);
            t.links.insert("lb1".into(), 6);
            let mut claims: BTreeMap<IpAddr, Arc<OwnerRecord>> = BTreeMap::new();
            let mut file: Option<OwnershipFile> = None;
            let mut degraded = false;
            let mut view = View::default();
            for _ in 0..300 {
                let ip = pool[r.below(pool.len())];
                // What the event touched: the daemon's changed set.
                let mut changed = BTreeSet::from([ip]);
                match r.below(7) {
                    0 | 1 => {
                        let ifindex = [2, 5, 6][r.below(3)];
                        match ip {
                            IpAddr::V4(ip) => {
                                let v = t.v4.entry(ifindex).or_default();
                                match v.iter().position(|a| a.addr == ip) {
                                    Some(p) => {
                                        v.remove(p);
                                    }
                                    None => v.push(IfAddrV4 {
                                        addr: ip,
                                        prefix: 24,
                                        secondary: r.below(3) == 0,
                                    }),
                                }
                            }
                            IpAddr::V6(ip) => {
                                let v = t.v6.entry(ifindex).or_default();
                                match v.iter().position(|a| *a == ip) {
                                    Some(p) => {
                                        v.remove(p);
                                    }
                                    None => v.push(ip),
                                }
                            }
                        }
                        if ifindex == 2 {
                            changed.clear();
                        }
                    }
                    2 | 3 => match owners[r.below(3)] {
                        _ if r.below(4) == 0 => {
                            claims.remove(&ip);
                        }
                        o => {
                            let c = OwnerRecord {
                                owner: o.map(Into::into),
                                why: format!("seed {seed}").into(),
                                certain: r.below(4) > 0,
                                service: None,
                                split: None,
                            };
                            claims.insert(ip, Arc::new(c));
                        }
                    },
                    4 => {
                        // The feed degrades or recovers: every claimed IP.
                        degraded = !degraded;
                        changed.extend(claims.keys().copied());
                    }
                    5 => {
                        let mut f = OwnershipFile::default();
                        for (line, ip) in pool.iter().enumerate() {
                            if r.below(4) > 0 {
                                continue;
                            }
                            let owner = owners[r.below(3)].map(Into::into);
                            let e = Entry {
                                owner,
                                service: None,
                                line,
                            };
                            f.ips.insert(*ip, e);
                        }
                        // A reload: every IP the old or the new file names.
                        for f in file.iter().chain([&f]) {
                            changed.extend(f.ips.keys().copied());
                        }
                        file = (r.below(4) > 0).then_some(f);
                    }
                    _ => {}
                }
                let inputs = Inputs {
                    node: "node-a",
                    file: file.as_ref(),
                    lb_ifaces: &lb_from,
                    uplinks: &uplinks,
                    addrs: &t,
                    cluster: Some(ClusterIn {
                        owners: &claims,
                        degraded,
                    }),
                };
                let before = view.clone();
                let keys = view.update(&inputs, &changed);
                let full = compute(&inputs);
                assert_eq!(view, full, "seed {seed}");
                let differ: BTreeSet<IpAddr> = (before.lb.keys().chain(full.lb.keys()))
                    .filter(|ip| before.lb.get(ip) != full.lb.get(ip))
                    .copied()
                    .collect();
                assert_eq!(keys, differ, "seed {seed}: the keys for the map writer");
            }
        }
    }
}
