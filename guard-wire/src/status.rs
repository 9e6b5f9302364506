//! A guard's state in one document (`/status`, `--status-file`): what the
//! daemon serves and writes, what its CLI and `kubectl arp-guard` read back
//! with these same types. How the daemon fills it is its own
//! (`guard::telemetry::status`).

use serde::{Deserialize, Serialize};

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
    pub memory: Option<crate::memory::MemoryStatus>,
    /// This node owns LB IPs and none of its uplinks has carrier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_link_down: Option<LinkDown>,
}

/// An owner that cannot be heard: every uplink without carrier.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkDown {
    /// The uplinks, each without carrier.
    pub interfaces: Vec<String>,
    /// LB IPs this node owns.
    pub owned: usize,
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
    /// Attached, and whether the device has carrier (absent: not attached).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub carrier: Option<bool>,
    /// Why it is an uplink (`--interface` named it, a default route ...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chosen_by: Vec<ChosenBy>,
}

/// One reason an interface is an uplink (the daemon's `model::uplinks::Why`).
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
    /// LB IPs shared by Services whose records name different nodes (a
    /// split election), and those of them settled on one node.
    #[serde(default)]
    pub split: usize,
    #[serde(default)]
    pub split_settled: usize,
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
/// itself is the daemon's `sources::cluster::feed::Feed`.
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
    /// and this node's name is none of them (the daemon's
    /// `telemetry::status::node_unmatched`).
    #[serde(default)]
    pub node_unmatched: bool,
}

/// One stream's health, as shown in the status and metrics.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamStatus {
    pub name: String,
    /// Listed at least once.
    pub synced: bool,
    /// Delivering: no error and no missed deadline since its last progress.
    pub healthy: bool,
    /// The last error, while failing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Objects whose latest version cannot be decoded (skipped; the rest of
    /// the stream is read).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub undecodable: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}
