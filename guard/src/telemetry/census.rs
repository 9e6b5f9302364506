//! The responder census kept current for the API, the metrics and the log:
//! every period the kernel's table is read (off the main loop: a full table
//! is 16,384 lookups), judged against this node's ownership (pure:
//! `model::census`), and published. A conflict is logged once when it
//! begins and once when it ends, and goes to `/events` subscribers.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::Ipv4Addr,
    sync::Arc,
    time::Duration,
};

use guard_common::{Ownership, MAX_RESPONDERS};
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

use crate::{
    datapath::{census::CensusReader, sys::monotonic_ns},
    model::census::{assess, conflicts, Census, Context, Reason},
};

/// The census as the API serves it (`/responders`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CensusDoc {
    /// Claims older than this are history.
    pub window_seconds: u64,
    /// Entries in the kernel table, and its capacity (LRU: the least recently
    /// claimed make room).
    pub entries: usize,
    pub capacity: u32,
    /// Census totals from the kernel (arp, claims, insert_failed).
    pub totals: BTreeMap<String, u64>,
    /// The table could not be read (the last good census is kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Every LB IP with a claim.
    pub ips: Census,
}

/// One conflict, as an `/events` line and in the status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConflictEvent {
    pub time: String,
    /// `responder_conflict` when it begins, `responder_conflict_resolved` when it ends.
    pub event: String,
    pub lb_ip: Ipv4Addr,
    pub reason: Reason,
    /// The MACs that claimed it within the window.
    pub macs: Vec<String>,
}

/// What the task needs from the daemon: which IPs this node owns and since
/// when (Unix seconds), read from the state the main loop publishes.
pub type OwnedSince = Box<dyn Fn() -> BTreeMap<Ipv4Addr, u64> + Send + Sync>;

pub struct CensusTask {
    pub reader: CensusReader,
    pub window: Duration,
    pub period: Duration,
    pub owned: OwnedSince,
    pub publish: Box<dyn Fn(CensusDoc) + Send + Sync>,
    pub events: broadcast::Sender<String>,
}

/// Read, judge and publish until the process ends.
pub async fn run(task: CensusTask) {
    let reader = Arc::new(task.reader);
    let mut tick = tokio::time::interval(task.period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last = CensusDoc::default();
    let mut in_conflict: BTreeMap<Ipv4Addr, Reason> = BTreeMap::new();
    let mut read_failing = false;
    loop {
        tick.tick().await;
        let r = reader.clone();
        let read =
            tokio::task::spawn_blocking(move || Ok::<_, anyhow::Error>((r.claims()?, r.stats()?)))
                .await;
        let (claims, stats) = match read {
            Ok(Ok(v)) => {
                read_failing = false;
                v
            }
            Ok(Err(e)) => {
                if !read_failing {
                    tracing::warn!(error = %format!("{e:#}"), "cannot read the responder census; keeping the last one");
                }
                read_failing = true;
                last.error = Some(format!("{e:#}"));
                (task.publish)(last.clone());
                continue;
            }
            Err(_) => continue,
        };
        let now_ns = monotonic_ns();
        let now_unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let cx = Context {
            now_ns,
            window: task.window,
            owned_since: (task.owned)()
                .into_iter()
                .map(|(ip, since)| {
                    let ago = now_unix.saturating_sub(since).saturating_mul(1_000_000_000);
                    (ip, now_ns.saturating_sub(ago))
                })
                .collect(),
            local_macs: local_macs(),
            ifnames: claims
                .iter()
                .map(|c| c.ifindex)
                .collect::<BTreeSet<u32>>()
                .into_iter()
                .map(|i| (i, super::interface_name(i)))
                .collect(),
        };
        let census = assess(&claims, &cx);
        let now = conflicts(&census);
        report_changes(&in_conflict, &now, &census, &task.events);
        in_conflict = now;
        last = CensusDoc {
            window_seconds: task.window.as_secs(),
            entries: claims.len(),
            capacity: MAX_RESPONDERS,
            totals: stats.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
            error: None,
            ips: census,
        };
        (task.publish)(last.clone());
    }
}

/// A log line and an event for each conflict that began or ended.
fn report_changes(
    before: &BTreeMap<Ipv4Addr, Reason>,
    now: &BTreeMap<Ipv4Addr, Reason>,
    census: &Census,
    events: &broadcast::Sender<String>,
) {
    let macs = |ip: &Ipv4Addr| -> Vec<String> {
        census.get(ip).map_or_else(Vec::new, |c| {
            c.responders
                .iter()
                .filter(|r| r.active)
                .map(|r| r.mac.clone())
                .collect()
        })
    };
    let send = |event: &str, ip: Ipv4Addr, reason: Reason, macs: Vec<String>| {
        let e = ConflictEvent {
            time: crate::telemetry::events::unix_time_millis(),
            event: event.into(),
            lb_ip: ip,
            reason,
            macs,
        };
        if let Ok(line) = serde_json::to_string(&e) {
            // No subscriber is fine.
            let _ = events.send(line);
        }
    };
    for (ip, reason) in now {
        if before.get(ip) == Some(reason) {
            continue;
        }
        let m = macs(ip);
        tracing::warn!(
            target: "arp_guard::census",
            lb_ip = %ip, reason = reason.as_str(), macs = ?m,
            "responder conflict: {}",
            match reason {
                Reason::Contested => "more than one MAC claims this LB IP at the same time (split brain, stale speaker, or nodes answering that should not)",
                Reason::ClaimedElsewhere => "this node owns the LB IP and another MAC claims it (a rogue host or a speaker that did not step down)",
            }
        );
        send("responder_conflict", *ip, *reason, m);
    }
    for (ip, reason) in before {
        if !now.contains_key(ip) {
            tracing::info!(target: "arp_guard::census", lb_ip = %ip, reason = reason.as_str(), "responder conflict resolved");
            send("responder_conflict_resolved", *ip, *reason, macs(ip));
        }
    }
}

/// This node's own MACs (every interface in its network namespace).
fn local_macs() -> BTreeSet<[u8; 6]> {
    crate::datapath::sys::link_macs().into_iter().collect()
}

/// The owned IPs of an IP table, with since when (for [`CensusTask::owned`]).
pub fn owned_since<'a>(
    ips: impl Iterator<Item = (&'a Ipv4Addr, Ownership, u64)>,
) -> BTreeMap<Ipv4Addr, u64> {
    ips.filter(|(_, s, _)| *s == Ownership::Owned)
        .map(|(ip, _, since)| (*ip, since))
        .collect()
}
