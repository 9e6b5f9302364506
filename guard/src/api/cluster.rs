//! `/cluster`: every guard of the cluster, as the presence records say
//! (`model::presence`), and the nodes without one (coverage).

use std::collections::BTreeMap;

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
    /// Seconds since its guard last wrote it (a record is written when it
    /// changes, not renewed).
    pub age_s: i64,
    /// Its guard's Pod is Ready (None: the Pods cannot be read, and every
    /// record counts as live).
    pub ready: Option<bool>,
    /// Its guard counts as there: the census names its MACs, the active
    /// census shares the work with it.
    pub live: bool,
}

/// `/cluster`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterDoc {
    /// Presence runs on this guard (`--presence-period`, and an API to use).
    pub enabled: bool,
    pub namespace: String,
    /// This guard's own record was written at least once.
    pub published: bool,
    /// Seconds since the records and Pods were last known current (None:
    /// never yet).
    pub read_age_s: Option<i64>,
    /// Live records first, then the others; by node.
    pub guards: Vec<GuardRow>,
    /// The cluster's nodes without a live guard (None: the nodes cannot be
    /// read, see `nodes_error`, or were not read yet).
    pub uncovered: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes_error: Option<String>,
    /// Seconds since the Nodes were read (None: never on this guard).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes_age_s: Option<i64>,
    /// Presence Leases skipped (malformed, too large, past the bound).
    pub skipped: usize,
    /// Requests failing now (`write`, `records`, `pods`, `nodes`) and why.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub errors: BTreeMap<String, String>,
}

impl ClusterDoc {
    /// The document from what presence last saw, at `now_unix`.
    pub fn of(seen: Option<&Seen>, now_unix: i64) -> ClusterDoc {
        let Some(s) = seen else {
            return ClusterDoc::default();
        };
        let t = &s.table;
        let mut guards: Vec<GuardRow> = (t.nodes.values())
            .map(|e| GuardRow {
                node: e.record.node.clone(),
                mode: e.record.mode.clone(),
                health: e.record.health.clone(),
                version: e.record.version.clone(),
                interfaces: e.record.interfaces.clone(),
                age_s: now_unix.saturating_sub(e.written_unix).max(0),
                ready: (t.ready.as_ref()).map(|r| r.contains(&e.record.node)),
                live: t.is_live(&e.record.node),
            })
            .collect();
        guards.sort_by(|a, b| (!a.live, &a.node).cmp(&(!b.live, &b.node)));
        let nodes_error = match &s.nodes {
            Some(Err(e)) => Some(format!("cannot read the cluster's nodes: {e}")),
            _ => None,
        };
        let uncovered = s.uncovered();
        ClusterDoc {
            enabled: true,
            namespace: s.namespace.clone(),
            published: s.published,
            read_age_s: s.read_unix.map(|t| now_unix.saturating_sub(t)),
            guards,
            uncovered,
            nodes_error,
            nodes_age_s: s.nodes_unix.map(|t| now_unix.saturating_sub(t)),
            skipped: s.table.skipped(),
            errors: s.errors.clone(),
        }
    }
}
