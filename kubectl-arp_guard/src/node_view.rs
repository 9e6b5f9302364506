//! One node's findings as the status merges them, from either source: its
//! ArpGuardNode in the API (what every view reads by default: one list,
//! read-only) or its guard's own answer over pods/exec (`--live`). Pure.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use guard_common::Ownership;
use guard_wire::{
    api::StatusDoc,
    node::{ArpGuardNode, NodeReport},
    presence::Record,
    status::InterfaceState,
    takeover::TakeoverRecord,
};

use super::fanout::{NodeAnswer, Unanswered};

/// Clients of an LB IP still sending to one node: all, and the stale ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct ClientCount {
    pub sending: usize,
    pub stale: usize,
}

/// An LB IP a node owns.
#[derive(Debug, Clone, PartialEq)]
pub struct Owned {
    pub ip: IpAddr,
    pub service: Option<String>,
    pub takeover: Option<TakeoverRecord>,
}

/// An LB IP in conflict as a node's census sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct InConflict {
    pub ip: IpAddr,
    pub reason: String,
    /// Named by node where a guard lists the MAC.
    pub claimants: Vec<String>,
}

/// What one node says.
#[derive(Debug, Clone, Default)]
pub struct NodeView {
    pub node: String,
    /// Its guard Pod is Ready (None: no Pod).
    pub ready: Option<bool>,
    /// Why it says nothing (no Pod, not running, no answer, no object).
    pub unanswered: Option<Unanswered>,
    pub mode: Option<String>,
    pub health: Option<String>,
    pub version: Option<String>,
    /// Its uplinks, each with why: `eno1 (default route)`.
    pub uplinks: Vec<String>,
    pub not_ready: Vec<String>,
    pub owned: Vec<Owned>,
    /// IPs whose owner this guard's feed names (a live answer's full
    /// status; an object names only the node's own).
    pub named: BTreeMap<IpAddr, String>,
    /// Services of IPs as its feed knows them.
    pub services: BTreeMap<IpAddr, String>,
    pub conflicts: Vec<InConflict>,
    pub clients: BTreeMap<IpAddr, ClientCount>,
    /// When it said so (Unix seconds): its object's last write; None:
    /// asked now (`--live`).
    pub as_of: Option<u64>,
}

/// An RFC 3339 time as Unix seconds.
fn unix(t: &str) -> Option<u64> {
    let t: jiff::Timestamp = t.parse().ok()?;
    u64::try_from(t.as_second()).ok()
}

/// A node's object, read from the API; `ready`: its guard Pod's readiness
/// (None: no Pod).
pub fn of_report(o: &ArpGuardNode, ready: Option<bool>) -> NodeView {
    let r: &NodeReport = &o.status;
    let uplinks = (r.uplinks.iter())
        .map(|u| match u.chosen_by.is_empty() {
            true => u.name.clone(),
            false => format!("{} ({})", u.name, u.chosen_by.join("; ")),
        })
        .collect();
    let owned: Vec<Owned> = (r.owned.iter())
        .map(|o| Owned {
            ip: o.ip,
            service: o.service.clone(),
            takeover: o.takeover.as_ref().and_then(|t| {
                Some(TakeoverRecord {
                    at_unix: unix(&t.at)?,
                    first_announcement_ms: t.first_announcement_ms,
                    via: None,
                    silent: t.silent,
                })
            }),
        })
        .collect();
    NodeView {
        node: o.metadata.name.clone(),
        ready,
        unanswered: None,
        mode: Some(r.mode.clone()),
        health: Some(r.health.clone()),
        version: Some(r.version.clone()),
        uplinks,
        not_ready: r.not_ready.clone(),
        named: (owned.iter())
            .map(|x| (x.ip, o.metadata.name.clone()))
            .collect(),
        services: (owned.iter())
            .filter_map(|o| Some((o.ip, o.service.clone()?)))
            .collect(),
        owned,
        conflicts: (r.conflicts.iter())
            .map(|c| InConflict {
                ip: c.ip,
                reason: c.reason.clone(),
                claimants: c.claimants.clone(),
            })
            .collect(),
        clients: (r.clients.iter())
            .map(|c| {
                let count = ClientCount {
                    sending: c.sending,
                    stale: c.stale,
                };
                (c.ip, count)
            })
            .collect(),
        as_of: r.updated.as_deref().and_then(unix),
    }
}

/// Every MAC the presence records list, and whose it is.
fn mac_owners(records: &BTreeMap<String, Record>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for r in records.values() {
        for i in r.interfaces.iter().chain(&r.other) {
            out.insert(i.mac.to_ascii_lowercase(), r.node.clone());
        }
    }
    out
}

/// A guard's answer over pods/exec (`status --brief -o json`, `--live`),
/// the claimants' MACs named by node through the presence `records`.
pub fn of_answer(a: &NodeAnswer<StatusDoc>, records: &BTreeMap<String, Record>) -> NodeView {
    let rec = records.get(&a.node);
    let mut v = NodeView {
        node: a.node.clone(),
        ready: a.ready,
        unanswered: a.answer.as_ref().err().cloned(),
        mode: rec.map(|r| r.mode.clone()),
        health: rec.map(|r| r.health.clone()),
        version: rec.map(|r| r.version.clone()),
        ..Default::default()
    };
    let Ok((d, _)) = &a.answer else {
        return v;
    };
    v.absorb(d, &mac_owners(records));
    v
}

impl NodeView {
    /// What a guard's status document says (`macs`: whose each MAC is).
    pub fn absorb(&mut self, d: &StatusDoc, macs: &BTreeMap<String, String>) {
        if let Some(s) = &d.status {
            self.mode = Some(s.mode.clone());
            self.uplinks = (s.interfaces.iter())
                .filter(|i| i.state == InterfaceState::Attached)
                .map(|i| {
                    let why: Vec<&str> = i.chosen_by.iter().map(|c| c.text.as_str()).collect();
                    match why.is_empty() {
                        true => i.name.clone(),
                        false => format!("{} ({})", i.name, why.join("; ")),
                    }
                })
                .collect();
        }
        if !d.version.is_empty() {
            self.version = Some(d.version.clone());
        }
        self.not_ready = d.not_ready.clone();
        for r in &d.ips {
            if r.entry.state == Ownership::Owned {
                self.owned.push(Owned {
                    ip: r.ip,
                    service: r.entry.service.clone(),
                    takeover: r.takeover.clone(),
                });
            }
            if let Some(o) = &r.entry.owner {
                self.named.insert(r.ip, o.clone());
            }
            if let Some(s) = &r.entry.service {
                self.services.insert(r.ip, s.clone());
            }
        }
        for c in &d.conflicts {
            let claimants: BTreeSet<String> = (c.macs.iter())
                .map(|m| match macs.get(&m.to_ascii_lowercase()) {
                    Some(node) => node.clone(),
                    None => format!("{m} (no guard lists it)"),
                })
                .collect();
            self.conflicts.push(InConflict {
                ip: c.ip,
                reason: c.reason.as_str().to_owned(),
                claimants: claimants.into_iter().collect(),
            });
        }
        for c in &d.clients {
            let count = ClientCount {
                sending: c.sending,
                stale: c.stale,
            };
            self.clients.insert(c.ip, count);
        }
    }
}
