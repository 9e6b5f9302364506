//! `ArpGuardNode` (`arp-guard.io/v1alpha1`, cluster-scoped, named after its
//! node): what one guard found, written by that guard into the API when it
//! changes, read by `kubectl arp-guard` and `kubectl get arpguardnodes`.
//! No guard reads another's: what every guard watches (the presence
//! records) stays small, and a finding costs the API server one write, not
//! one delivery per guard.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

pub const GROUP: &str = "arp-guard.io";
pub const VERSION: &str = "v1alpha1";
pub const KIND: &str = "ArpGuardNode";
pub const PLURAL: &str = "arpguardnodes";
/// `apiVersion` of the objects.
pub const API_VERSION: &str = "arp-guard.io/v1alpha1";
/// Rows of each list kept at most (owned IPs, conflicts, clients): an
/// object stays far below the API server's size limit whatever a node
/// owns; `truncated` says when rows were left out (the counts stay whole).
pub const MAX_ROWS: usize = 256;

/// The object as the API holds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ArpGuardNode {
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    pub metadata: Metadata,
    #[serde(default)]
    pub status: NodeReport,
}

/// The part of `metadata` arp-guard reads and writes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Metadata {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub owner_references: Vec<OwnerReference>,
}

/// The Node the object goes with (it is deleted with it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OwnerReference {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    pub uid: String,
}

impl OwnerReference {
    /// The Node `name` with `uid`.
    pub fn node(name: &str, uid: &str) -> Self {
        OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: name.into(),
            uid: uid.into(),
        }
    }
}

/// A guard's findings: what `kubectl arp-guard status` shows of a node.
/// Timestamps are RFC 3339 (what `kubectl get` prints as an age); every
/// field but `updated` is content: the guard writes when it differs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeReport {
    /// `enforce` or `monitor`.
    #[serde(default)]
    pub mode: String,
    /// `enforcing`, `monitoring` or `degraded` (not ready: `notReady` says why).
    #[serde(default)]
    pub health: String,
    #[serde(default)]
    pub version: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_ready: Vec<String>,
    /// The interfaces guarded, with why each was chosen.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub uplinks: Vec<Uplink>,
    /// The same names, comma-separated (a printer column).
    #[serde(default)]
    pub uplink_names: String,
    /// LB IPs this node owns, with their last takeover.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub owned: Vec<OwnedIp>,
    #[serde(default)]
    pub owned_count: usize,
    /// LB IPs claimed by more than one MAC as this node's census sees them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conflicts: Vec<Conflict>,
    #[serde(default)]
    pub conflict_count: usize,
    /// LB IPs whose clients still send to this node, which does not own them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clients: Vec<Clients>,
    /// Stale clients over all of them (a printer column).
    #[serde(default)]
    pub stale_clients: usize,
    /// The newest takeover among the owned IPs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_takeover: Option<String>,
    /// Some list held more than [`MAX_ROWS`] rows.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
    /// When the guard wrote this (not content: a write is made only when
    /// something else changed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated: Option<String>,
}

impl NodeReport {
    /// The same without `updated`: what is compared to decide a write.
    pub fn content(&self) -> NodeReport {
        NodeReport {
            updated: None,
            ..self.clone()
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Uplink {
    pub name: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chosen_by: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OwnedIp {
    pub ip: IpAddr,
    /// namespace/name of its Service, when the cluster says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub takeover: Option<Takeover>,
}

/// This node's last takeover of an IP.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Takeover {
    pub at: String,
    /// From the ownership change to the first announcement that left.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_announcement_ms: Option<u64>,
    /// No announcement within the threshold.
    #[serde(default)]
    pub silent: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Conflict {
    pub ip: IpAddr,
    /// The census's reason (`multiple_claimants`, `contested`, ...).
    pub reason: String,
    /// Who claims it: a node (its guard lists the MAC) or a MAC no guard lists.
    pub claimants: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Clients {
    pub ip: IpAddr,
    pub sending: usize,
    pub stale: usize,
    /// Since when this node no longer owns it (after a move).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
}
