//! The daemon's state in one document: served by the API (`/status`),
//! written to `--status-file`, read by `/metrics`, and shown by the CLI
//! (which reads it back with these same types).

use guard_common::Ownership;
use serde::{Deserialize, Serialize};

use crate::model::{
    cluster::{ClusterView, StreamStatus},
    view::View,
};

/// The daemon's state (`/status`, `--status-file`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DaemonStatus {
    pub node: String,
    /// `enforce` or `monitor`.
    pub mode: String,
    pub interfaces: Vec<Interface>,
    pub lb_ips: Counts,
    /// Map entries that did not fit (full maps): those LB IPs are not guarded.
    pub not_enforced: usize,
    /// Kernel memory held by the program's maps (memlock), in bytes.
    pub map_memory_bytes: u64,
    /// Present when an announcer reads the Kubernetes API.
    pub feed: Option<FeedHealth>,
    /// The daemon's memory against its cgroup's limit (docs/sizing.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<super::memory::MemoryStatus>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InterfaceState {
    Attached,
    /// A --interface pattern that matches nothing (yet), or `auto` that
    /// found no uplink.
    Missing,
    Failed,
    /// Pointed at by `--interface auto` (a route, the Node's address, an
    /// announcer) and left out: a tunnel, a CNI's device, a Pod's veth ...
    Skipped,
}

impl InterfaceState {
    pub fn as_str(self) -> &'static str {
        match self {
            InterfaceState::Attached => "attached",
            InterfaceState::Missing => "missing",
            InterfaceState::Failed => "failed",
            InterfaceState::Skipped => "skipped",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Interface {
    /// A name, or a --interface pattern that matches nothing.
    pub name: String,
    pub state: InterfaceState,
    /// tcx or netlink-clsact when attached; the error when failed.
    pub detail: String,
    /// How the responder census is attached to its ingress (absent: it is not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub census: Option<String>,
    /// Why it is an uplink (`--interface` named it, a default route ...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chosen_by: Vec<ChosenBy>,
}

/// One reason an interface is an uplink (`model::uplinks::Why`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChosenBy {
    /// The metric's `chosen_by` label: interface, default-route, node-ip,
    /// announcer, kept.
    pub kind: String,
    /// As said: `upper device of eno1 (default route)`.
    pub text: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Counts {
    pub total: usize,
    pub owned: usize,
    pub foreign: usize,
    pub unknown: usize,
    /// Of these, the IPv6 LB IPs (guarded in Neighbor Discovery).
    #[serde(default)]
    pub ipv6: FamilyCounts,
}

/// The LB IPs of one family, by state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FamilyCounts {
    pub total: usize,
    pub owned: usize,
    pub foreign: usize,
    pub unknown: usize,
}

/// The Kubernetes feed's health, as `/status` shows it (`feed`); the feed
/// itself is `sources::cluster::feed::Feed`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FeedHealth {
    pub announcers: Vec<String>,
    /// Every stream has completed its first list.
    pub synced: bool,
    /// Blind for longer than the threshold: foreign is enforced as unknown.
    pub degraded: bool,
    /// Blind now: a stream failing or stuck, or a Lease expiry the API has
    /// not confirmed (IPs this node owns stay owned meanwhile).
    pub blind: bool,
    /// Leases in use past their deadline, not confirmed by the API.
    pub unconfirmed_leases: usize,
    /// Blind this long, foreign is enforced as unknown.
    pub threshold_seconds: u64,
    pub streams: Vec<StreamStatus>,
    /// The guard cannot read the API for a reason of its own (401, 403, a
    /// server certificate it does not trust), with what to fix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
    /// The feed has synced and names Lease holders or announcing nodes,
    /// and this node's name is none of them ([`node_unmatched`]).
    #[serde(default)]
    pub node_unmatched: bool,
}

/// Whether `node` is none of the Lease holders and announcing nodes the
/// synced feed names (and it names some), and, where presence tells the
/// names the guards run under (`guards`), some holder is none of them: a
/// `--node-name` (`NODE_NAME`) other than the name the announcer uses.
/// Without presence a node that holds no LB IP now looks the same. With
/// this node's own announcer's frames of IPs held by others
/// (`arp_guard_announce_total{outcome="expired"}`) it is the
/// misconfiguration that makes the guard stop its own owner
/// (ArpGuardDroppingOwnedIP); with presence, a split-brain speaker on a node
/// that holds nothing is not taken for it (every holder has its guard).
pub fn node_unmatched(
    c: &ClusterView,
    node: &str,
    guards: Option<&crate::model::presence::Table>,
) -> bool {
    let unguarded_holder = || match guards {
        Some(t) if !t.nodes.is_empty() => c.holders.iter().any(|h| !t.nodes.contains_key(h)),
        _ => true,
    };
    c.synced && !c.holders.is_empty() && !c.holders.contains(node) && unguarded_holder()
}

impl Counts {
    pub fn of(view: &View) -> Self {
        Counts {
            total: view.lb.len(),
            owned: view.count(Ownership::Owned),
            foreign: view.count(Ownership::Foreign),
            unknown: view.count(Ownership::Unknown),
            ipv6: FamilyCounts::of(
                view.lb
                    .iter()
                    .filter(|(ip, _)| ip.is_ipv6())
                    .map(|(_, l)| l.state),
            ),
        }
    }
}

impl FamilyCounts {
    fn of(states: impl Iterator<Item = Ownership>) -> Self {
        let mut c = FamilyCounts::default();
        for s in states {
            c.total += 1;
            match s {
                Ownership::Owned => c.owned += 1,
                Ownership::Foreign => c.foreign += 1,
                Ownership::Unknown => c.unknown += 1,
            }
        }
        c
    }
}

impl FeedHealth {
    /// The feed's health as node `node` sees it.
    pub fn of(
        announcers: &[&str],
        c: &ClusterView,
        node: &str,
        guards: Option<&crate::model::presence::Table>,
    ) -> Self {
        FeedHealth {
            announcers: announcers.iter().map(|a| (*a).to_owned()).collect(),
            synced: c.synced,
            degraded: c.degraded,
            blind: c.failing_since.is_some(),
            unconfirmed_leases: c.unconfirmed,
            threshold_seconds: c.threshold.as_secs(),
            streams: c.streams.clone(),
            problem: c.problem.clone(),
            node_unmatched: node_unmatched(c, node, guards),
        }
    }
}
