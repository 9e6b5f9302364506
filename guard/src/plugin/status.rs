//! `kubectl arp-guard status`: one row per LB IP for the whole cluster,
//! merged from what the API server holds and what each guard says of
//! itself (`arp-guard status --brief -o json`: the IPs it owns, those in
//! conflict, those whose clients still send to it). Pure: the reads and
//! the answers in, the document out.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use guard_common::Ownership;
use serde::Serialize;

use super::{
    cluster::ClusterReads,
    fanout::{NodeAnswer, Unanswered},
};
use crate::{
    api::types::StatusDoc, model::takeover::TakeoverRecord, telemetry::status::InterfaceState,
};

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
}

/// One LB IP.
#[derive(Debug, Clone, Default, Serialize)]
pub struct IpStatus {
    pub ip: Option<IpAddr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    /// The owner the announcer named, as the guards see it (None: no guard
    /// that answered names one).
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
}

/// Clients of an LB IP still sending to one node: all, and the stale ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ClientCount {
    pub sending: usize,
    pub stale: usize,
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
    pub version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Why it has no answer (None: it answered).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unanswered: Option<Unanswered>,
    /// The interfaces it guards, each with why: `eno1 (default route)`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub uplinks: Vec<String>,
    /// Why it says it is not ready (an uplink not found, its feed not synced).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_ready: Vec<String>,
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

/// Merge the reads and the answers; `only`: one LB IP; `reference`: a
/// full status of one guard, for owners no brief answer names.
pub fn merge(
    reads: &ClusterReads,
    answers: &[NodeAnswer<StatusDoc>],
    reference: Option<&StatusDoc>,
    only: Option<IpAddr>,
) -> ClusterStatus {
    let docs: Vec<(&str, &StatusDoc)> = (answers.iter())
        .filter_map(|a| a.answer.as_ref().ok().map(|(d, _)| (a.node.as_str(), d)))
        .collect();
    let mut ips: BTreeSet<IpAddr> = reads.services.keys().copied().collect();
    for (_, d) in &docs {
        ips.extend(d.ips.iter().map(|r| r.ip));
        ips.extend(d.conflicts.iter().map(|c| c.ip));
        ips.extend(d.clients.iter().map(|c| c.ip));
    }
    if let Some(ip) = only {
        ips.retain(|i| *i == ip);
        ips.insert(ip);
    }
    let macs = mac_owners(reads);
    let guards = guards(reads, answers);
    let rows = ips
        .into_iter()
        .map(|ip| ip_status(ip, reads, &docs, reference, &macs, &guards))
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
    }
}

/// Every MAC the presence records list, and whose it is.
fn mac_owners(reads: &ClusterReads) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for r in reads.records.values() {
        for i in r.interfaces.iter().chain(&r.other) {
            out.insert(i.mac.to_ascii_lowercase(), r.node.clone());
        }
    }
    out
}

fn guards(reads: &ClusterReads, answers: &[NodeAnswer<StatusDoc>]) -> Vec<GuardStatus> {
    (answers.iter())
        .map(|a| {
            let rec = reads.records.get(&a.node);
            let doc = a.answer.as_ref().ok().map(|(d, _)| d);
            let mode = (doc.and_then(|d| d.status.as_ref()).map(|s| s.mode.clone()))
                .or(rec.map(|r| r.mode.clone()));
            let version = (doc.map(|d| d.version.clone()).filter(|v| !v.is_empty()))
                .or(rec.map(|r| r.version.clone()));
            GuardStatus {
                node: a.node.clone(),
                ready: a.ready,
                mode,
                version,
                image: reads.pods.get(&a.node).and_then(|p| p.image.clone()),
                unanswered: a.answer.as_ref().err().cloned(),
                uplinks: doc.map(uplinks).unwrap_or_default(),
                not_ready: doc.map(|d| d.not_ready.clone()).unwrap_or_default(),
            }
        })
        .collect()
}

/// A guard's attached interfaces, each with why it chose it.
fn uplinks(d: &StatusDoc) -> Vec<String> {
    let interfaces = d
        .status
        .as_ref()
        .map(|s| s.interfaces.as_slice())
        .unwrap_or_default();
    (interfaces.iter())
        .filter(|i| i.state == InterfaceState::Attached)
        .map(|i| {
            let why: Vec<&str> = i.chosen_by.iter().map(|c| c.text.as_str()).collect();
            if why.is_empty() {
                i.name.clone()
            } else {
                format!("{} ({})", i.name, why.join("; "))
            }
        })
        .collect()
}

fn ip_status(
    ip: IpAddr,
    reads: &ClusterReads,
    docs: &[(&str, &StatusDoc)],
    reference: Option<&StatusDoc>,
    macs: &BTreeMap<String, String>,
    guards: &[GuardStatus],
) -> IpStatus {
    let rows: Vec<(&str, &crate::api::types::IpRow)> = (docs.iter())
        .flat_map(|(n, d)| d.ips.iter().filter(|r| r.ip == ip).map(move |r| (*n, r)))
        .collect();
    let owners: Vec<&str> = (rows.iter())
        .filter(|(_, r)| r.entry.state == Ownership::Owned)
        .map(|(n, _)| *n)
        .collect();
    let named = (rows.iter())
        .find_map(|(_, r)| r.entry.owner.clone())
        .or_else(|| {
            let r = reference?.ips.iter().find(|r| r.ip == ip)?;
            r.entry.owner.clone()
        });
    let owner = owners.first().map(|s| s.to_string()).or(named);
    let service = (reads.services.get(&ip).cloned())
        .or_else(|| rows.iter().find_map(|(_, r)| r.entry.service.clone()));
    let owner_row = owner
        .as_deref()
        .and_then(|o| rows.iter().find(|(n, _)| *n == o));
    let owner_guard = owner.as_deref().and_then(|o| {
        let g = guards.iter().find(|g| g.node == o)?;
        let rec = reads.records.get(o);
        Some(OwnerGuard {
            mode: g.mode.clone().unwrap_or_else(|| "-".into()),
            health: rec.map_or_else(|| "-".into(), |r| r.health.clone()),
            version: g.version.clone().unwrap_or_else(|| "-".into()),
            answered: g.unanswered.is_none(),
        })
    });
    let mut claimants = BTreeSet::new();
    let mut conflict = None;
    for (_, d) in docs {
        for c in d.conflicts.iter().filter(|c| c.ip == ip) {
            conflict.get_or_insert_with(|| c.reason.as_str().to_owned());
            for m in &c.macs {
                let who = macs.get(&m.to_ascii_lowercase()).cloned();
                claimants.insert(who.unwrap_or_else(|| format!("{m} (no guard lists it)")));
            }
        }
    }
    let mut clients = BTreeMap::new();
    for (n, d) in docs {
        for c in d.clients.iter().filter(|c| c.ip == ip) {
            let count = ClientCount {
                sending: c.sending,
                stale: c.stale,
            };
            clients.insert(n.to_string(), count);
        }
    }
    let mut warnings = BTreeMap::new();
    for e in &reads.events {
        if Some(&e.service) == service.as_ref() && e.kind == "Warning" {
            *warnings.entry(e.reason.clone()).or_default() += e.count;
        }
    }
    IpStatus {
        ip: Some(ip),
        service,
        also_owned_by: owners.iter().skip(1).map(|s| s.to_string()).collect(),
        owner,
        owner_guard,
        claimants: claimants.into_iter().collect(),
        conflict,
        takeover: owner_row.and_then(|(_, r)| r.takeover.clone()),
        clients,
        warnings,
    }
}

/// The table (`wide`: the owner guard's version and every node's clients).
pub fn table(s: &ClusterStatus, wide: bool, now_unix: u64) -> String {
    let mut out = String::new();
    let mut head = vec![
        "LB IP",
        "SERVICE",
        "OWNER",
        "OWNER'S GUARD",
        "CLAIMED BY",
        "LAST TAKEOVER",
        "STALE CLIENTS",
        "WARNINGS (1H)",
    ];
    if wide {
        head.push("VERSION");
    }
    let mut rows = vec![head.iter().map(|s| s.to_string()).collect::<Vec<_>>()];
    for i in &s.ips {
        let mut r = vec![
            i.ip.map_or_else(|| "-".into(), |ip| ip.to_string()),
            i.service.clone().unwrap_or_else(|| "-".into()),
            owner_cell(i),
            (i.owner_guard.as_ref()).map_or_else(
                || "-".into(),
                |g| {
                    if g.answered {
                        format!("{}/{}", g.mode, g.health)
                    } else {
                        "not answering".into()
                    }
                },
            ),
            claimed_cell(i),
            i.takeover
                .as_ref()
                .map_or_else(|| "-".into(), |t| takeover_cell(t, now_unix)),
            clients_cell(i, wide),
            warnings_cell(i),
        ];
        if wide {
            r.push(
                i.owner_guard
                    .as_ref()
                    .map_or_else(|| "-".into(), |g| g.version.clone()),
            );
        }
        rows.push(r);
    }
    out.push_str(&super::output::columns(&rows));
    out.push('\n');
    out.push_str(&guards_summary(s, wide));
    out
}

fn owner_cell(i: &IpStatus) -> String {
    match (&i.owner, i.also_owned_by.is_empty()) {
        (None, _) => "?".into(),
        (Some(o), true) => o.clone(),
        (Some(o), false) => format!("{o} + {} (split view)", i.also_owned_by.join(",")),
    }
}

fn claimed_cell(i: &IpStatus) -> String {
    match &i.conflict {
        None => i.owner.clone().unwrap_or_else(|| "-".into()),
        Some(reason) => format!("{} ({reason})", i.claimants.join(", ")),
    }
}

fn takeover_cell(t: &TakeoverRecord, now_unix: u64) -> String {
    let ago = super::output::ago(now_unix.saturating_sub(t.at_unix));
    match (t.first_announcement_ms, t.silent) {
        (Some(ms), false) => format!("{ago} ago, announced in {ms} ms"),
        (Some(ms), true) => format!("{ago} ago, SILENT (announced after {} s)", ms / 1000),
        (None, true) => format!("{ago} ago, SILENT"),
        (None, false) => format!("{ago} ago, waiting"),
    }
}

fn clients_cell(i: &IpStatus, wide: bool) -> String {
    let stale: Vec<String> = (i.clients.iter())
        .filter(|(_, c)| c.stale > 0 || (wide && c.sending > 0))
        .map(|(n, c)| {
            if wide {
                format!("{}/{} on {n}", c.stale, c.sending)
            } else {
                format!("{} on {n}", c.stale)
            }
        })
        .collect();
    if stale.is_empty() {
        "-".into()
    } else {
        stale.join(", ")
    }
}

fn warnings_cell(i: &IpStatus) -> String {
    if i.warnings.is_empty() {
        return "-".into();
    }
    (i.warnings.iter())
        .map(|(r, n)| format!("{r} x{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The guards in a few lines: how many answered, on which versions, and
/// every one that did not, with why.
fn guards_summary(s: &ClusterStatus, wide: bool) -> String {
    let answered = s.guards.iter().filter(|g| g.unanswered.is_none()).count();
    let versions: Vec<String> = (s.versions.iter())
        .map(|(v, n)| format!("{v} x{n}"))
        .collect();
    let mut out = format!(
        "guards: {answered} of {} answered; versions: {}\n",
        s.guards.len(),
        if versions.is_empty() {
            "-".into()
        } else {
            versions.join(", ")
        }
    );
    if s.versions.len() > 1 {
        out.push_str("  more than one version runs (a rolling update, or one that stopped)\n");
    }
    for g in &s.guards {
        if let Some(u) = &g.unanswered {
            out.push_str(&format!("  {}: {u}\n", g.node));
        } else if g.ready == Some(false) || !g.not_ready.is_empty() {
            let why = if g.not_ready.is_empty() {
                String::new()
            } else {
                format!(": {}", g.not_ready.join("; "))
            };
            let who = if g.ready == Some(false) {
                "its Pod is not Ready"
            } else {
                "it says it is not ready"
            };
            out.push_str(&format!("  {}: answered, but {who}{why}\n", g.node));
        }
        if wide && g.unanswered.is_none() {
            let ups = if g.uplinks.is_empty() {
                "none".to_owned()
            } else {
                g.uplinks.join(", ")
            };
            out.push_str(&format!("  {}: guards {ups}\n", g.node));
        }
    }
    out
}
