//! The daemon's state in one JSON document, written to `--status-file`
//! whenever it changes (atomically: write, then rename), so that an operator
//! (`kubectl exec ... cat`) or a probe can see what the guard is doing.

use std::path::Path;

use guard_common::Ownership;
use serde::Serialize;

use crate::{cluster::ClusterView, view::View};

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Status {
    pub node: String,
    pub mode: &'static str,
    pub interfaces: Vec<Interface>,
    pub lb_ips: Counts,
    /// Map entries that did not fit (full maps): those LB IPs are not guarded.
    pub not_enforced: usize,
    /// Kernel memory held by the program's maps (memlock), in bytes.
    pub map_memory_bytes: u64,
    /// Present when an announcer reads the Kubernetes API.
    pub feed: Option<Feed>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Interface {
    /// A name, or a --interface pattern that matches nothing.
    pub name: String,
    /// `attached`, `missing` (nothing matches yet) or `failed`.
    pub state: &'static str,
    /// tcx or netlink-clsact when attached; the error when failed.
    pub detail: String,
}

impl Interface {
    pub fn of(a: &crate::interfaces::Attachments) -> Vec<Interface> {
        let attached = a.attached.iter().map(|(n, (_, how))| Interface {
            name: n.clone(),
            state: "attached",
            detail: (*how).into(),
        });
        let missing = a.missing.iter().map(|p| Interface {
            name: p.clone(),
            state: "missing",
            detail: String::new(),
        });
        let failed = a.failed.iter().map(|(n, why)| Interface {
            name: n.clone(),
            state: "failed",
            detail: why.clone(),
        });
        attached.chain(missing).chain(failed).collect()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Counts {
    pub total: usize,
    pub owned: usize,
    pub foreign: usize,
    pub unknown: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Feed {
    pub announcers: Vec<&'static str>,
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
    pub streams: Vec<crate::cluster::feed::StreamStatus>,
}

impl Counts {
    pub fn of(view: &View) -> Self {
        Counts {
            total: view.lb.len(),
            owned: view.count(Ownership::Owned),
            foreign: view.count(Ownership::Foreign),
            unknown: view.count(Ownership::Unknown),
        }
    }
}

impl Feed {
    pub fn of(announcers: Vec<&'static str>, c: &ClusterView) -> Self {
        Feed {
            announcers,
            synced: c.synced,
            degraded: c.degraded,
            blind: c.failing_since.is_some(),
            unconfirmed_leases: c.unconfirmed,
            threshold_seconds: c.threshold.as_secs(),
            streams: c.streams.clone(),
        }
    }
}

/// Write `status` to `path` if it differs from `last`; remembers what was written.
pub fn publish(path: &Path, status: &Status, last: &mut Option<Status>) {
    if last.as_ref() == Some(status) {
        return;
    }
    let tmp = path.with_extension("tmp");
    let text = match serde_json::to_string_pretty(status) {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(error = %e, "cannot encode the status");
            return;
        }
    };
    match std::fs::write(&tmp, text + "\n").and_then(|()| std::fs::rename(&tmp, path)) {
        Ok(()) => *last = Some(status.clone()),
        Err(e) => {
            tracing::warn!(file = %path.display(), error = %e, "cannot write the status file")
        }
    }
}
