//! `kubectl arp-guard status`: one row per LB IP for the whole cluster,
//! merged from what the API server holds (the LoadBalancer Services,
//! arp-guard's Events) and what each node says of itself: its ArpGuardNode
//! (by default) or its guard's answer (`--live`), both as a
//! [`NodeView`]. Pure: the reads and the views in, the document out.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use serde::Serialize;

use super::{
    cluster::ClusterReads,
    fanout::Unanswered,
    node_view::{ClientCount, NodeView},
};
use guard_wire::takeover::TakeoverRecord;

/// The whole cluster's status.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterStatus {
    pub ips: Vec<IpStatus>,
    pub guards: Vec<GuardStatus>,
    /// Guards by the version they run (a rolling update shows two).
    pub versions: BTreeMap<String, usize>,
    /// Why the cluster's Nodes could not be read (nodes without a guard
    /// Pod are then not listed; the table's reader is told on stderr, as
    /// every view's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nodes_unread: Option<String>,
    /// Where the nodes' findings come from.
    pub source: Source,
}

/// `api`: each node's ArpGuardNode, as of its last write; `live`: each
/// guard asked now (pods/exec).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    Api,
    Live,
}

/// One LB IP.
#[derive(Debug, Clone, Default, Serialize)]
pub struct IpStatus {
    pub ip: Option<IpAddr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    /// The owner the announcer named, as the guards see it (None: no guard
    /// names one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// More than one guard says it owns the IP (their feeds disagree).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub also_owned_by: Vec<String>,
    /// The owner's guard: `mode/health`, its version, whether it answered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner_guard: Option<OwnerGuard>,
    /// Who else claims the IP on the wire (a node, or a MAC no guard
    /// lists), with the census's reason.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub claimants: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conflict: Option<String>,
    /// The owner's last takeover of the IP.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub takeover: Option<TakeoverRecord>,
    /// Clients still sending to nodes that do not own it, by node.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub clients: BTreeMap<String, ClientCount>,
    /// arp-guard's Warning Events on its Service within the window, by
    /// reason.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub warnings: BTreeMap<String, i32>,
    /// How fresh the row is: the oldest write (Unix seconds) of the
    /// objects it comes from (None: asked live, or no node says anything
    /// of it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub as_of: Option<u64>,
    /// The guards it comes from whose Pod is not Ready now: their word may
    /// be old.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub from_guards_not_ready: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct OwnerGuard {
    pub mode: String,
    pub health: String,
    pub version: String,
    pub answered: bool,
}

/// One node's guard.
#[derive(Debug, Clone, Serialize)]
pub struct GuardStatus {
    pub node: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ready: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub health: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Why it has no answer (None: it answered, or its object was read).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unanswered: Option<Unanswered>,
    /// The interfaces it guards, each with why: `eno1 (default route)`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub uplinks: Vec<String>,
    /// Why it says it is not ready (an uplink not found, its feed not synced).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_ready: Vec<String>,
    /// Its object's last write (Unix seconds; None: asked live).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub as_of: Option<u64>,
}

impl IpStatus {
    /// What makes the command exit 1.
    pub fn findings(&self) -> Vec<&'static str> {
        let mut f = Vec::new();
        if self.conflict.is_some() || !self.also_owned_by.is_empty() {
            f.push("conflict");
        }
        if self.clients.values().any(|c| c.stale > 0) {
            f.push("stale clients");
        }
        if self.takeover.as_ref().is_some_and(|t| t.silent) {
            f.push("silent takeover");
        }
        // Findings only Events carry (every guard sees a split alike, and
        // an owner without carrier may not reach the API until it returns).
        if self.warnings.contains_key("SplitElection") {
            f.push("split election");
        }
        if self.warnings.contains_key("OwnerLinkDown") {
            f.push("owner link down");
        }
        if !self.warnings.is_empty() {
            f.push("Warning Events");
        }
        f
    }
}

impl ClusterStatus {
    /// Problems found, for the exit code and the last line.
    pub fn findings(&self) -> usize {
        let ips = self.ips.iter().filter(|i| !i.findings().is_empty()).count();
        let guards = (self.guards.iter())
            .filter(|g| {
                g.unanswered.as_ref().is_some_and(Unanswered::is_finding) || g.ready == Some(false)
            })
            .count();
        ips + guards
    }
}

/// Merge the reads and the nodes' views; `only`: one LB IP; `reference`:
/// one guard's full view, for owners no other view names (`--live`).
pub fn merge(
    reads: &ClusterReads,
    views: &[NodeView],
    reference: Option<&NodeView>,
    only: Option<IpAddr>,
    source: Source,
) -> ClusterStatus {
    let by = ByIp::of(views, reference);
    let mut ips: BTreeSet<IpAddr> = reads.services.keys().copied().collect();
    ips.extend(
        by.owners
            .keys()
            .chain(by.conflicts.keys())
            .chain(by.clients.keys()),
    );
    if let Some(ip) = only {
        ips.retain(|i| *i == ip);
        ips.insert(ip);
    }
    let guards = guards(views);
    let rows = ips
        .into_iter()
        .map(|ip| ip_status(ip, reads, &by))
        .collect();
    let mut versions = BTreeMap::new();
    for g in &guards {
        if let Some(v) = &g.version {
            *versions.entry(v.clone()).or_default() += 1;
        }
    }
    ClusterStatus {
        ips: rows,
        guards,
        versions,
        nodes_unread: reads.nodes_unread.clone(),
        source,
    }
}

fn guards(views: &[NodeView]) -> Vec<GuardStatus> {
    (views.iter())
        .map(|v| GuardStatus {
            node: v.node.clone(),
            ready: v.ready,
            mode: v.mode.clone(),
            health: v.health.clone(),
            version: v.version.clone(),
            unanswered: v.unanswered.clone(),
            uplinks: v.uplinks.clone(),
            not_ready: v.not_ready.clone(),
            as_of: v.as_of,
        })
        .collect()
}

/// The views indexed by LB IP, once: the merge is linear in what the
/// nodes say, not in nodes times IPs (5,000 of each).
#[derive(Default)]
struct ByIp<'a> {
    owners: BTreeMap<IpAddr, Vec<&'a NodeView>>,
    /// The owner some guard's feed names (its own, or others').
    named: BTreeMap<IpAddr, &'a str>,
    services: BTreeMap<IpAddr, &'a str>,
    conflicts: BTreeMap<IpAddr, Vec<(&'a NodeView, &'a super::node_view::InConflict)>>,
    clients: BTreeMap<IpAddr, Vec<(&'a NodeView, ClientCount)>>,
    nodes: BTreeMap<&'a str, &'a NodeView>,
}

impl<'a> ByIp<'a> {
    fn of(views: &'a [NodeView], reference: Option<&'a NodeView>) -> Self {
        let mut by = ByIp::default();
        for v in views {
            by.nodes.insert(v.node.as_str(), v);
            for o in &v.owned {
                by.owners.entry(o.ip).or_default().push(v);
            }
            for c in &v.conflicts {
                by.conflicts.entry(c.ip).or_default().push((v, c));
            }
            for (ip, c) in &v.clients {
                by.clients.entry(*ip).or_default().push((v, *c));
            }
        }
        for v in views.iter().chain(reference) {
            for (ip, o) in &v.named {
                by.named.entry(*ip).or_insert(o.as_str());
            }
            for (ip, s) in &v.services {
                by.services.entry(*ip).or_insert(s.as_str());
            }
        }
        by
    }
}

fn ip_status(ip: IpAddr, reads: &ClusterReads, by: &ByIp<'_>) -> IpStatus {
    let owners = by.owners.get(&ip).map(Vec::as_slice).unwrap_or_default();
    let owner = (owners.first().map(|v| v.node.clone()))
        .or_else(|| by.named.get(&ip).map(|s| s.to_string()));
    let service =
        (reads.services.get(&ip).cloned()).or_else(|| by.services.get(&ip).map(|s| s.to_string()));
    let owner_view = owner.as_deref().and_then(|o| by.nodes.get(o).copied());
    let owner_guard = owner_view.map(|v| OwnerGuard {
        mode: v.mode.clone().unwrap_or_else(|| "-".into()),
        health: v.health.clone().unwrap_or_else(|| "-".into()),
        version: v.version.clone().unwrap_or_else(|| "-".into()),
        answered: v.unanswered.is_none(),
    });
    let mut from: Vec<&NodeView> = owners.to_vec();
    let mut claimants = BTreeSet::new();
    let mut conflict = None;
    for (v, c) in by.conflicts.get(&ip).into_iter().flatten() {
        conflict.get_or_insert_with(|| c.reason.clone());
        claimants.extend(c.claimants.iter().cloned());
        from.push(v);
    }
    let mut clients = BTreeMap::new();
    for (v, c) in by.clients.get(&ip).into_iter().flatten() {
        clients.insert(v.node.clone(), *c);
        from.push(v);
    }
    let mut warnings = BTreeMap::new();
    let of_service = || (reads.events.iter()).filter(|e| Some(&e.service) == service.as_ref());
    for e in of_service().filter(|e| e.kind == "Warning") {
        // Ended by its Normal Event since (carrier back, the records
        // agreeing again): history for `events`, not a finding.
        let normals =
            (of_service().filter(|n| n.kind == "Normal")).map(|n| (n.reason.as_str(), n.age_s));
        if guard_wire::events::is_ended(&e.reason, e.age_s, normals) {
            continue;
        }
        *warnings.entry(e.reason.clone()).or_default() += e.count;
    }
    let mut not_ready: Vec<String> = (from.iter())
        .filter(|v| v.ready != Some(true))
        .map(|v| v.node.clone())
        .collect();
    not_ready.sort();
    not_ready.dedup();
    IpStatus {
        ip: Some(ip),
        service,
        also_owned_by: owners.iter().skip(1).map(|v| v.node.clone()).collect(),
        owner,
        owner_guard,
        claimants: claimants.into_iter().collect(),
        conflict,
        takeover: (owner_view.into_iter())
            .flat_map(|v| v.owned.iter())
            .find(|o| o.ip == ip)
            .and_then(|o| o.takeover.clone()),
        clients,
        warnings,
        as_of: from.iter().filter_map(|v| v.as_of).min(),
        from_guards_not_ready: not_ready,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{cluster::EventRow, node_view::of_report};
    use guard_wire::node::ArpGuardNode;

    fn object(json: serde_json::Value) -> ArpGuardNode {
        serde_json::from_value(json).unwrap()
    }

    /// The owner's object names the IP and its takeover; another node's
    /// census sees a conflict and a third still has a stale client: one
    /// row says all of it, as old as its oldest object, naming the guard
    /// that is not Ready.
    #[test]
    fn one_row_from_every_node_s_object() {
        let ip: IpAddr = "198.51.100.100".parse().unwrap();
        let a = object(
            serde_json::json!({"metadata": {"name": "node-a"}, "status": {
            "mode": "enforce", "health": "enforcing", "version": "0.1.0",
            "owned": [{"ip": ip, "service": "default/web",
                       "takeover": {"at": "2026-12-06T10:00:00Z", "firstAnnouncementMs": 9}}],
            "updated": "2026-12-06T10:00:05Z"}}),
        );
        let b = object(
            serde_json::json!({"metadata": {"name": "node-b"}, "status": {
            "conflicts": [{"ip": ip, "reason": "contested", "claimants": ["node-a", "node-c"]}],
            "updated": "2026-12-06T09:00:00Z"}}),
        );
        let c = object(
            serde_json::json!({"metadata": {"name": "node-c"}, "status": {
            "clients": [{"ip": ip, "sending": 2, "stale": 1}],
            "updated": "2026-12-06T10:01:00Z"}}),
        );
        let views = [
            of_report(&a, Some(true)),
            of_report(&b, Some(true)),
            of_report(&c, Some(false)),
        ];
        let s = merge(&ClusterReads::default(), &views, None, None, Source::Api);
        assert_eq!(s.source, Source::Api);
        let row = &s.ips[0];
        assert_eq!(row.owner.as_deref(), Some("node-a"));
        assert_eq!(row.service.as_deref(), Some("default/web"));
        assert_eq!(row.claimants, ["node-a", "node-c"]);
        assert_eq!(row.clients["node-c"].stale, 1);
        assert_eq!(
            row.takeover.as_ref().unwrap().first_announcement_ms,
            Some(9)
        );
        let oldest: jiff::Timestamp = "2026-12-06T09:00:00Z".parse().unwrap();
        assert_eq!(row.as_of, Some(oldest.as_second() as u64));
        assert_eq!(row.from_guards_not_ready, ["node-c"]);
        assert_eq!(row.findings(), ["conflict", "stale clients"]);
    }

    /// An owner's link went down and came back: the Warning ended by the
    /// Normal Event after it is no finding; down again after that, it is.
    #[test]
    fn a_warning_ended_since_is_not_a_finding() {
        let ip: IpAddr = "198.51.100.100".parse().unwrap();
        let row = |kind: &str, reason: &str, age_s: i64| EventRow {
            service: "default/web".into(),
            kind: kind.into(),
            reason: reason.into(),
            note: String::new(),
            node: "node-a".into(),
            count: 1,
            age_s,
        };
        let mut reads = ClusterReads::default();
        reads.services.insert(ip, "default/web".into());
        reads.events = vec![
            row("Warning", "OwnerLinkDown", 30),
            row("Normal", "OwnerLinkRestored", 20),
        ];
        let s = merge(&reads, &[], None, None, Source::Api);
        assert!(s.ips[0].warnings.is_empty(), "{:?}", s.ips[0].warnings);
        assert!(s.ips[0].findings().is_empty());
        reads.events.push(row("Warning", "OwnerLinkDown", 5));
        let s = merge(&reads, &[], None, None, Source::Api);
        assert_eq!(s.ips[0].findings(), ["owner link down", "Warning Events"]);
    }
}
