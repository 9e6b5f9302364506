//! Which interfaces are the node's uplinks (where the guard sits on egress
//! and the census on ingress): those `--interface` names (names and globs)
//! and, with `--interface auto`, those the node's own facts point at:
//!
//! - the devices its default routes leave through (IPv4 and IPv6);
//! - the device holding the Node's InternalIP (when the API told it);
//! - the devices an announcer's objects name (MetalLB L2Advertisement
//!   `interfaces`, CiliumL2AnnouncementPolicy `interfaces` regexes);
//! - those chosen before, while they exist and qualify (a default route
//!   that goes away for a moment never takes the guard off).
//!
//! A bond's or a bridge's slave is replaced by its upper device (frames of
//! the node leave through the upper one whichever slave carries them); a
//! VLAN device that holds the address is taken itself. Never taken by
//! `auto`: devices without an Ethernet address (loopback, tun, wireguard),
//! tunnels and dummies, veths that neither carry a default route nor hold
//! the Node's address nor are named by an announcer (a Pod's; a node in a
//! container, as kind runs them, has its default route on a veth), and the
//! names of CNIs' and
//! kube-proxy's devices ([`EXCLUDED_PREFIXES`]). What an operator names
//! with `--interface` is taken as named.
//!
//! Pure: the same facts give the same choice, so the daemon, `status` and
//! `doctor` say the same thing.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use super::addrs::{AddrTable, DeviceKind};

/// The `--interface` value that asks for the automatic choice.
pub const AUTO: &str = "auto";

/// Name prefixes `auto` never takes: loopback, CNIs' and kube-proxy's own
/// devices, container and VM bridges (Cilium's list and what Calico,
/// Flannel, Weave, kube-router, Docker and libvirt create).
pub const EXCLUDED_PREFIXES: [&str; 17] = [
    "lo",
    "cilium_",
    "lxc",
    "cni",
    "docker",
    "flannel",
    "vxlan",
    "kube-ipvs",
    "kube-bridge",
    "kube-dummy",
    "cali",
    "tunl",
    "weave",
    "genev_sys",
    "nodelocaldns",
    "virbr",
    "podman",
];

/// Upper devices followed at most (a VLAN on a bond in a bridge is three).
const MAX_DEPTH: usize = 4;
/// Devices left out that the "nothing found" message names at most.
const SAID_AT_MOST: usize = 8;

/// `*` matches any run of characters, `?` one character; everything else itself.
pub fn glob(pattern: &str, name: &str) -> bool {
    fn m(p: &[u8], n: &[u8]) -> bool {
        match (p.first(), n.first()) {
            (None, None) => true,
            (Some(b'*'), _) => m(&p[1..], n) || (!n.is_empty() && m(p, &n[1..])),
            (Some(b'?'), Some(_)) => m(&p[1..], &n[1..]),
            (Some(a), Some(b)) if a == b => m(&p[1..], &n[1..]),
            _ => false,
        }
    }
    m(pattern.as_bytes(), name.as_bytes())
}

/// What `--interface` asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ask {
    pub auto: bool,
    /// Names and globs, taken as named.
    pub patterns: Vec<String>,
    /// Never uplinks: the LB IPs' own interfaces (`--lb-ips-from`).
    pub exclude: Vec<String>,
}

impl Ask {
    /// From `--interface`'s values (`auto` among them or not).
    pub fn new(values: &[String], exclude: &[String]) -> Ask {
        Ask {
            auto: values.iter().any(|v| v == AUTO),
            patterns: values.iter().filter(|v| *v != AUTO).cloned().collect(),
            exclude: exclude.to_vec(),
        }
    }
}

/// A name rule of an announcer's object.
#[derive(Debug, Clone)]
pub enum NameRule {
    /// MetalLB's `interfaces`: names.
    Exact(String),
    /// Cilium's `interfaces`: Go regular expressions, matched anywhere in
    /// the name (Go's `MatchString`, as the Cilium agent does).
    Regex(regex::Regex),
}

impl PartialEq for NameRule {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (NameRule::Exact(a), NameRule::Exact(b)) => a == b,
            (NameRule::Regex(a), NameRule::Regex(b)) => a.as_str() == b.as_str(),
            _ => false,
        }
    }
}

impl NameRule {
    pub fn matches(&self, name: &str) -> bool {
        match self {
            NameRule::Exact(n) => n == name,
            NameRule::Regex(r) => r.is_match(name),
        }
    }
}

/// Interfaces an announcer's object names.
#[derive(Debug, Clone, PartialEq)]
pub struct Named {
    /// The object, as said: `L2Advertisement metallb-system/l2`.
    pub by: String,
    pub rules: Vec<NameRule>,
}

/// What the cluster says that points at uplinks.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Hints {
    /// The Node's InternalIP and ExternalIP addresses; None: not read (yet,
    /// or no API): the routes decide alone.
    pub node_ips: Option<Vec<IpAddr>>,
    pub named: Vec<Named>,
}

/// Why an interface is an uplink.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Why {
    /// `--interface` names it (the pattern).
    Interface(String),
    /// A default route leaves through it.
    DefaultRoute,
    /// It holds the Node's address.
    NodeIp(IpAddr),
    /// An announcer's object names it.
    Announcer(String),
    /// Chosen before; it is still there and qualifies.
    Kept,
    /// Its slave `slave` was chosen for `why`: the upper device is guarded.
    Upper { slave: String, why: Box<Why> },
}

impl Why {
    /// The metric's `chosen_by` label: one word per kind of reason.
    pub fn label(&self) -> &'static str {
        match self {
            Why::Interface(_) => "interface",
            Why::DefaultRoute => "default-route",
            Why::NodeIp(_) => "node-ip",
            Why::Announcer(_) => "announcer",
            Why::Kept => "kept",
            Why::Upper { why, .. } => why.label(),
        }
    }

    fn is_auto(&self) -> bool {
        !matches!(self, Why::Interface(_))
    }

    fn is_kept(&self) -> bool {
        match self {
            Why::Kept => true,
            Why::Upper { why, .. } => why.is_kept(),
            _ => false,
        }
    }
}

impl std::fmt::Display for Why {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Why::Interface(p) => write!(f, "--interface {p}"),
            Why::DefaultRoute => f.write_str("default route"),
            Why::NodeIp(ip) => write!(f, "holds the node's address {ip}"),
            Why::Announcer(by) => write!(f, "named by {by}"),
            Why::Kept => f.write_str("chosen before, still qualifies"),
            Why::Upper { slave, why } => write!(f, "upper device of {slave} ({why})"),
        }
    }
}

/// One uplink chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uplink {
    pub ifindex: u32,
    /// Sorted, each reason once.
    pub why: Vec<Why>,
}

impl Uplink {
    /// Its reasons as one phrase: `default route; holds the node's address ...`.
    pub fn because(&self) -> String {
        (self.why.iter().map(Why::to_string))
            .collect::<Vec<_>>()
            .join("; ")
    }

    fn by_auto(&self) -> bool {
        self.why.iter().any(Why::is_auto)
    }
}

/// The uplinks, and what was left out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Choice {
    /// Name -> the uplink.
    pub uplinks: BTreeMap<String, Uplink>,
    /// `--interface` patterns that match no interface (yet).
    pub missing: Vec<String>,
    /// Devices `auto` was pointed at and left out, with why.
    pub left_out: BTreeMap<String, String>,
    /// With `auto` and no uplink found: what was looked at and the fix.
    pub none_found: Option<String>,
}

impl Choice {
    pub fn names(&self) -> Vec<String> {
        self.uplinks.keys().cloned().collect()
    }
}

/// An owner that cannot be heard: this node owns `owned` LB IPs and every
/// uplink it is attached to (`carrier`: name -> has carrier) has lost
/// carrier. One uplink with carrier is enough to answer; no uplink at all
/// is NotReady, said elsewhere.
pub fn link_down(
    carrier: &std::collections::BTreeMap<String, bool>,
    owned: usize,
) -> Option<guard_wire::status::LinkDown> {
    (owned > 0 && !carrier.is_empty() && carrier.values().all(|c| !c)).then(|| {
        guard_wire::status::LinkDown {
            interfaces: carrier.keys().cloned().collect(),
            owned,
        }
    })
}

/// The uplinks `ask` gives on `table` with `hints`; `before` is the last
/// choice (what `auto` chose there stays while it qualifies).
pub fn choose(ask: &Ask, table: &AddrTable, hints: &Hints, before: &Choice) -> Choice {
    let mut chosen: BTreeMap<u32, BTreeSet<Why>> = BTreeMap::new();
    let mut out = Choice::default();
    for (name, i) in table.links.iter().filter(|(n, _)| !ask.exclude.contains(n)) {
        for p in ask.patterns.iter().filter(|p| glob(p, name)) {
            chosen
                .entry(*i)
                .or_default()
                .insert(Why::Interface(p.clone()));
        }
    }
    out.missing = (ask.patterns.iter())
        .filter(|p| {
            !table
                .links
                .keys()
                .any(|n| !ask.exclude.contains(n) && glob(p, n))
        })
        .cloned()
        .collect();
    if ask.auto {
        for (i, why) in pointed_at(table, hints, before) {
            // A veth counts where something more than a route points at it.
            let pointed = matches!(why, Why::Announcer(_) | Why::NodeIp(_));
            let (top, why) = upper(table, i, why);
            match qualifies(ask, table, top, pointed) {
                Ok(()) => {
                    chosen.entry(top).or_default().insert(why);
                }
                Err(reason) => {
                    let name = table.name_of(top).unwrap_or("?").to_owned();
                    out.left_out.insert(name, reason);
                }
            }
        }
    }
    for (i, mut why) in chosen {
        // "Kept" is said only where nothing else points at it any more.
        if why.iter().any(|w| !w.is_kept()) {
            why.retain(|w| !w.is_kept());
        }
        if let Some(name) = table.name_of(i) {
            out.left_out.remove(name);
            let why = why.into_iter().collect();
            out.uplinks
                .insert(name.to_owned(), Uplink { ifindex: i, why });
        }
    }
    if ask.auto && !out.uplinks.values().any(Uplink::by_auto) {
        out.none_found = Some(nothing_found(table, hints, &out.left_out));
    }
    out
}

/// The devices the node's facts point at, each with why (slaves included:
/// [`upper`] lifts them).
fn pointed_at(table: &AddrTable, hints: &Hints, before: &Choice) -> Vec<(u32, Why)> {
    let mut out = Vec::new();
    for oifs in table.default_routes.values() {
        out.extend(oifs.iter().map(|i| (*i, Why::DefaultRoute)));
    }
    for ip in hints.node_ips.iter().flatten() {
        out.extend(
            table
                .holding(*ip)
                .into_iter()
                .map(|i| (i, Why::NodeIp(*ip))),
        );
    }
    for named in &hints.named {
        for (name, i) in &table.links {
            if named.rules.iter().any(|r| r.matches(name)) {
                out.push((*i, Why::Announcer(named.by.clone())));
            }
        }
    }
    // By ifindex: the same device under a new name is still the one chosen.
    for up in before.uplinks.values().filter(|u| u.by_auto()) {
        if table.devices.contains_key(&up.ifindex) {
            out.push((up.ifindex, Why::Kept));
        }
    }
    out
}

/// The device frames of `i` really leave through: its bond's or bridge's
/// (and theirs), with the reason carried along.
fn upper(table: &AddrTable, i: u32, why: Why) -> (u32, Why) {
    let (mut top, mut why) = (i, why);
    for _ in 0..MAX_DEPTH {
        let Some(up) = table.devices.get(&top).and_then(|d| d.controller) else {
            break;
        };
        let slave = table.name_of(top).unwrap_or("?").to_owned();
        why = Why::Upper {
            slave,
            why: Box::new(why),
        };
        top = up;
    }
    (top, why)
}

/// Whether `auto` may take device `i` (`pointed`: it holds the Node's
/// address or an announcer names it, which a veth needs where it carries
/// no default route); Err: why not.
fn qualifies(ask: &Ask, table: &AddrTable, i: u32, pointed: bool) -> Result<(), String> {
    let name = table.name_of(i).ok_or("gone")?;
    if ask.exclude.iter().any(|e| e == name) {
        return Err("an --lb-ips-from interface".into());
    }
    if let Some(p) = EXCLUDED_PREFIXES.iter().find(|p| name.starts_with(**p)) {
        return Err(format!("a CNI's or kube-proxy's device (name {p}*)"));
    }
    let d = table
        .devices
        .get(&i)
        .ok_or("not described by the kernel yet")?;
    if d.loopback || !d.ether {
        return Err("no Ethernet address (no ARP or NDP on it)".into());
    }
    match &d.kind {
        DeviceKind::Tunnel(k) => Err(format!("a tunnel ({k})")),
        DeviceKind::Dummy => Err("a dummy device".into()),
        DeviceKind::Veth if !pointed && !table.has_default_route(i) => {
            Err("a veth without a default route (a Pod's)".into())
        }
        _ => Ok(()),
    }
}

/// The one message of a node where `auto` found nothing: what it looked
/// at, what it left out, and the fix.
fn nothing_found(table: &AddrTable, hints: &Hints, left_out: &BTreeMap<String, String>) -> String {
    let names = |ids: &mut dyn Iterator<Item = u32>| -> String {
        let mut v: Vec<&str> = ids.filter_map(|i| table.name_of(i)).collect();
        v.sort_unstable();
        v.dedup();
        if v.is_empty() {
            "none".into()
        } else {
            v.join(", ")
        }
    };
    let routes = names(&mut table.default_routes.values().flatten().copied());
    let node = match &hints.node_ips {
        None => "not known (the Node object was not read)".to_owned(),
        Some(ips) if ips.is_empty() => "none in the Node object".to_owned(),
        Some(ips) => {
            let on = names(&mut ips.iter().flat_map(|ip| table.holding(*ip)));
            let ips: Vec<String> = ips.iter().map(IpAddr::to_string).collect();
            format!("{} on {on}", ips.join(", "))
        }
    };
    let named = if hints.named.is_empty() {
        "none".to_owned()
    } else {
        (hints.named.iter().map(|n| n.by.as_str()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut out = format!(
        "--interface auto found no uplink: default routes via {routes}; the node's address {node}; \
         announcers' interfaces {named}"
    );
    if !left_out.is_empty() {
        let said: Vec<String> = (left_out.iter().take(SAID_AT_MOST))
            .map(|(n, why)| format!("{n} ({why})"))
            .collect();
        out.push_str(&format!("; left out: {}", said.join(", ")));
        if left_out.len() > SAID_AT_MOST {
            out.push_str(&format!(" and {} more", left_out.len() - SAID_AT_MOST));
        }
    }
    out.push_str(
        "; name the uplink with INTERFACE= in the arp-guard ConfigMap (or --interface NAME)",
    );
    out
}

#[cfg(test)]
#[path = "uplinks_tests.rs"]
mod tests;
