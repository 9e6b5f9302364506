//! `/cluster`: every guard of the cluster, as the presence records say
//! (`model::presence`), and the nodes without one (coverage).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::model::presence::{Iface, Seen};

/// One guard's record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuardRow {
    pub node: String,
    pub mode: String,
    pub health: String,
    pub version: String,
    pub interfaces: Vec<Iface>,
    /// Seconds since its last renewal.
    pub age_s: i64,
    /// Not renewed within its duration: its guard is gone or cut off.
    pub expired: bool,
}

/// `/cluster`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterDoc {
    /// Presence runs on this guard (`--presence-period`, and an API to use).
    pub enabled: bool,
    pub namespace: String,
    /// This guard's own record was written at least once.
    pub published: bool,
    /// Seconds since the records were last listed (None: never yet).
    pub read_age_s: Option<i64>,
    /// Live records first, then expired ones; by node.
    pub guards: Vec<GuardRow>,
    /// The cluster's nodes without a live guard (None: the nodes cannot be
    /// read, see `nodes_error`, or were not read yet).
    pub uncovered: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes_error: Option<String>,
    /// Presence Leases skipped (malformed, too large, past the bound).
    pub skipped: usize,
    /// Requests failing now (`write`, `list`, `nodes`) and why.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub errors: BTreeMap<String, String>,
}

impl ClusterDoc {
    /// The document from what presence last saw, at `now_unix`.
    pub fn of(seen: Option<&Seen>, now_unix: i64) -> ClusterDoc {
        let Some(s) = seen else {
            return ClusterDoc::default();
        };
        let mut guards: Vec<GuardRow> = (s.table.nodes.values())
            .map(|e| GuardRow {
                node: e.record.node.clone(),
                mode: e.record.mode.clone(),
                health: e.record.health.clone(),
                version: e.record.version.clone(),
                interfaces: e.record.interfaces.clone(),
                age_s: now_unix.saturating_sub(e.renew_unix).max(0),
                expired: e.expired(now_unix),
            })
            .collect();
        guards.sort_by(|a, b| (a.expired, &a.node).cmp(&(b.expired, &b.node)));
        let live: BTreeSet<&str> = (guards.iter())
            .filter(|g| !g.expired)
            .map(|g| g.node.as_str())
            .collect();
        let (uncovered, nodes_error) = match &s.nodes {
            Some(Ok(nodes)) => (
                Some(
                    (nodes.iter())
                        .filter(|n| !live.contains(n.as_str()))
                        .cloned()
                        .collect(),
                ),
                None,
            ),
            Some(Err(e)) => (None, Some(format!("cannot read the cluster's nodes: {e}"))),
            None => (None, None),
        };
        ClusterDoc {
            enabled: true,
            namespace: s.namespace.clone(),
            published: s.published,
            read_age_s: s.read_unix.map(|t| now_unix.saturating_sub(t)),
            guards,
            uncovered,
            nodes_error,
            skipped: s.table.skipped,
            errors: s.errors.clone(),
        }
    }
}
