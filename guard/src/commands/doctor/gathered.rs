//! Everything doctor gathered, and what it was asked to look at: the input
//! of the checks, which are pure functions of these two.

use std::{
    collections::BTreeMap,
    net::{Ipv4Addr, Ipv6Addr},
};

use super::{
    guard_view::{Attached, GuardView},
    ipv6_view::Ipv6View,
    kube_proxy::KubeProxy,
    node::Node,
};
use crate::{
    model::{addrs::AddrTable, uplinks},
    telemetry::status::InterfaceState,
};

/// Everything doctor gathered on the node and from the guard.
#[derive(Debug, Clone)]
pub struct Gathered {
    pub node: Node,
    /// IPv4 addresses per interface (netlink), or why unknown.
    pub addrs: Result<AddrTable, String>,
    pub guard: GuardView,
    pub kube_proxy: KubeProxy,
    /// IPv6 addresses with their DAD state, and proxy entries (netlink).
    pub ipv6: Result<Ipv6View, String>,
}

/// What to check.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    /// The announcing interfaces (uplinks), and how they were chosen.
    pub uplinks: Vec<String>,
    pub uplinks_from: String,
    /// Interfaces whose addresses are LB IPs (kube-ipvs0).
    pub lb_ifaces: Vec<String>,
    /// Clients to check the route back to (none: the default route).
    pub clients: Vec<std::net::IpAddr>,
    pub pin_dir: String,
}

/// Whether the running guard stops the kernel's replies for a set of IPs
/// leaving one interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Coverage {
    /// Attached there, every IP in its LB set, in this mode.
    Full { mode: String },
    /// Not (fully): why, in a phrase.
    Not(String),
}

/// Interface names with at most this many addresses listed in a value.
const LIST: usize = 4;

/// `a, b, c and 5 more`.
pub fn list<T: ToString>(items: &[T]) -> String {
    let shown: Vec<String> = items.iter().take(LIST).map(T::to_string).collect();
    match items.len().saturating_sub(LIST) {
        0 => shown.join(", "),
        more => format!("{} and {more} more", shown.join(", ")),
    }
}

impl Gathered {
    /// The IPv4 addresses on `iface` (empty if unknown).
    pub fn addrs_of(&self, iface: &str) -> Vec<Ipv4Addr> {
        self.addrs
            .as_ref()
            .map(|t| t.v4_of(iface).iter().map(|a| a.addr).collect())
            .unwrap_or_default()
    }

    /// Whether `iface` exists (sysfs, else netlink).
    pub fn has_interface(&self, iface: &str) -> bool {
        self.node.has_interface(iface)
            || self
                .addrs
                .as_ref()
                .is_ok_and(|t| t.ifindex(iface).is_some())
    }

    /// Addresses the kernel answers ARP for on *other* interfaces when
    /// arp_ignore=0: those on the LB interfaces, and on `lo` outside
    /// 127.0.0.0/8. (interface, address), per interface in order.
    pub fn lb_addresses(&self, plan: &Plan) -> Vec<(String, Ipv4Addr)> {
        let mut out = Vec::new();
        for iface in &plan.lb_ifaces {
            out.extend(self.addrs_of(iface).into_iter().map(|a| (iface.clone(), a)));
        }
        if !plan.lb_ifaces.iter().any(|i| i == "lo") {
            out.extend(
                self.addrs_of("lo")
                    .into_iter()
                    .filter(|a| !a.is_loopback())
                    .map(|a| ("lo".to_owned(), a)),
            );
        }
        out
    }

    /// Every LB IP known: on the LB interfaces and in the guard's LB set.
    pub fn lb_ips(&self, plan: &Plan) -> Vec<Ipv4Addr> {
        let mut ips: Vec<Ipv4Addr> = self
            .lb_addresses(plan)
            .into_iter()
            .map(|(_, a)| a)
            .collect();
        if let Some(lb) = self.guard.lb() {
            ips.extend(lb.keys());
        }
        ips.sort_unstable();
        ips.dedup();
        ips
    }

    /// IPv6 LB IPs: the global IPv6 addresses on the LB interfaces and
    /// those in the guard's LB set, sorted.
    pub fn lb_ips6(&self, plan: &Plan) -> Vec<Ipv6Addr> {
        let mut ips: Vec<Ipv6Addr> = match &self.addrs {
            Ok(t) => plan
                .lb_ifaces
                .iter()
                .flat_map(|i| t.v6_of(i).iter().copied())
                .collect(),
            Err(_) => Vec::new(),
        };
        if let Some(lb) = self.guard.lb6() {
            ips.extend(lb.keys());
        }
        ips.sort_unstable();
        ips.dedup();
        ips
    }

    /// Why the guard does not judge what leaves `uplink` (not seen, not
    /// attached, its daemon gone), if it does.
    fn not_judging(&self, uplink: &str) -> Option<String> {
        if !self.guard.seen() {
            return Some("no running arp-guard was seen".into());
        }
        match self.guard.attached(uplink, self.node.ifindex(uplink)) {
            Attached::Daemon(InterfaceState::Attached, _)
            | Attached::PinnedLink
            | Attached::Kernel(_) => {}
            _ => return Some(format!("arp-guard is not attached to {uplink}")),
        }
        if let Some((age, _, dead)) = self.guard.heartbeat() {
            if age >= dead {
                return Some(format!(
                    "the guard's daemon is gone (heartbeat {}s old): it passes everything",
                    age.as_secs()
                ));
            }
        }
        None
    }

    /// The mode, once the guard covers `missing` (IPs not in its set: none).
    fn covered(&self, missing: Vec<String>) -> Coverage {
        if !missing.is_empty() {
            return Coverage::Not(format!(
                "not in the guard's LB IP set: {} (run it with --lb-ips-from kube-ipvs0)",
                list(&missing)
            ));
        }
        Coverage::Full {
            mode: self.guard.mode().unwrap_or_else(|| "unknown".into()),
        }
    }

    /// Whether the guard judges Neighbor Discovery for the IPv6 `ips` on
    /// `uplink`.
    pub fn coverage6(&self, uplink: &str, ips: &[Ipv6Addr]) -> Coverage {
        if let Some(why) = self.not_judging(uplink) {
            return Coverage::Not(why);
        }
        let Some(lb) = self.guard.lb6() else {
            return Coverage::Not(
                "the guard's IPv6 LB IP set is known only from its API, which does not answer here (pass --api)".into(),
            );
        };
        self.covered(
            ips.iter()
                .filter(|ip| !lb.contains_key(ip))
                .map(Ipv6Addr::to_string)
                .collect(),
        )
    }

    /// Whether the guard stops the kernel's replies for `ips` on `uplink`.
    pub fn coverage(&self, uplink: &str, ips: &[Ipv4Addr]) -> Coverage {
        if let Some(why) = self.not_judging(uplink) {
            return Coverage::Not(why);
        }
        let Some(lb) = self.guard.lb() else {
            return Coverage::Not("the guard's LB IP set cannot be read".into());
        };
        self.covered(
            ips.iter()
                .filter(|ip| !lb.contains_key(ip))
                .map(Ipv4Addr::to_string)
                .collect(),
        )
    }

    /// The guard's states of `ips` ("owned 1, foreign 2").
    pub fn states(&self, ips: &[Ipv4Addr]) -> String {
        let Some(lb) = self.guard.lb() else {
            return String::new();
        };
        let mut n: BTreeMap<&str, usize> = BTreeMap::new();
        for ip in ips {
            if let Some(s) = lb.get(ip) {
                *n.entry(s.as_str()).or_default() += 1;
            }
        }
        n.iter()
            .map(|(s, c)| format!("{s} {c}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Which interfaces to check when none are named: the running guard's,
/// else its pinned links', else those `--interface auto` chooses, else the
/// default route's in the procfs read, else every interface with an IPv4
/// address (not `lo`, not the LB interfaces).
pub fn default_uplinks(
    node: &Node,
    addrs: &Result<AddrTable, String>,
    guard: &GuardView,
    lb_ifaces: &[String],
) -> (Vec<String>, String) {
    if let Some(ifs) = guard.interfaces() {
        let ifs: Vec<_> = (ifs.iter())
            .filter(|i| !matches!(i.state, InterfaceState::Missing | InterfaceState::Skipped))
            .collect();
        if !ifs.is_empty() {
            // What `auto` chose, with why (a name given is its own why).
            let why: Vec<String> = (ifs.iter())
                .filter_map(|i| {
                    let c: Vec<&str> = (i.chosen_by.iter())
                        .filter(|c| c.kind != "interface")
                        .map(|c| c.text.as_str())
                        .collect();
                    (!c.is_empty()).then(|| format!("{}: {}", i.name, c.join("; ")))
                })
                .collect();
            let from = match why.is_empty() {
                true => "the running guard's interfaces".to_owned(),
                false => format!("the running guard's interfaces ({})", why.join("; ")),
            };
            return (ifs.iter().map(|i| i.name.clone()).collect(), from);
        }
    }
    if let (Some(p), Ok(ifs)) = (&guard.pinned, &node.interfaces) {
        let names: Vec<String> = ifs
            .iter()
            .filter(|(_, i)| i.is_some_and(|i| p.links.contains(&i)))
            .map(|(n, _)| n.clone())
            .collect();
        if !names.is_empty() {
            return (names, "the guard's pinned links".into());
        }
    }
    if let Ok(t) = addrs {
        // As the daemon's `--interface auto` would choose (without the
        // API's hints: the routes and what they point at).
        let ask = uplinks::Ask::new(&[uplinks::AUTO.into()], lb_ifaces);
        let c = uplinks::choose(&ask, t, &Default::default(), &Default::default());
        if !c.uplinks.is_empty() {
            let why: Vec<String> = (c.uplinks.iter())
                .map(|(n, u)| format!("{n}: {}", u.because()))
                .collect();
            let from = format!("--interface auto ({})", why.join("; "));
            return (c.names(), from);
        }
    }
    // A procfs root given to doctor (another host's /proc) may know routes
    // netlink does not.
    if let Ok(routes) = &node.routes {
        let mut names: Vec<String> = routes
            .iter()
            .filter(|r| r.prefix == 0)
            .map(|r| r.iface.clone())
            .collect();
        names.dedup();
        if !names.is_empty() {
            return (names, "the default route".into());
        }
    }
    let names = match addrs {
        Ok(t) => t
            .links
            .iter()
            .filter(|(n, i)| {
                n.as_str() != "lo" && !lb_ifaces.contains(n) && !t.v4_of_index(**i).is_empty()
            })
            .map(|(n, _)| n.clone())
            .collect(),
        Err(_) => Vec::new(),
    };
    (names, "interfaces with an IPv4 address".into())
}
