//! The daemon's own operation counters (feed events, map writes, errors),
//! counted where things happen and exported by /metrics, and the one
//! signal the parts share: memory pressure, set by the memory watch and
//! read by the feed before it takes in a new object. One [`Ops`] per
//! daemon, made at start-up and handed (an `Arc`) to each part that counts:
//! the feed, the API, presence, the Kubernetes Events and the main loop.
//! The label values are typed here; `as_str` is the text /metrics exports.
//! Below every layer but `model`: whoever counts can reach it.

use std::{
    collections::BTreeMap,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering::Relaxed},
        Mutex,
    },
};

/// Why the daemon counted an error: the `cause` label of
/// `arp_guard_errors_total`. Declared in the order of their labels, so the
/// series come out sorted as before.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ErrorCause {
    /// The API's `accept` failed (EMFILE: out of file descriptors).
    ApiAccept,
    /// A connection evicted to make room for a new one.
    ApiConnectionEvicted,
    /// A connection refused: every slot is an event stream.
    ApiConnectionLimit,
    /// The main loop could not write its heartbeat.
    Heartbeat,
    /// A stream, the probe or a confirming GET of the Kubernetes feed failed.
    KubernetesFeed,
    /// Entries did not fit in a full map.
    MapFull,
    /// A map entry could not be written.
    MapWrite,
    /// This guard's presence Lease changed under it (409, 404).
    PresenceConflict,
    /// Listing the presence Leases failed.
    PresenceList,
    /// Listing the cluster's Nodes failed.
    PresenceNodes,
    /// A presence Lease that cannot be read was skipped.
    PresenceSkipped,
    /// Writing this guard's presence Lease failed.
    PresenceWrite,
    /// Writing this node's ArpGuardNode (its findings) failed.
    NodeReport,
}

impl ErrorCause {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCause::ApiAccept => "api_accept",
            ErrorCause::ApiConnectionEvicted => "api_connection_evicted",
            ErrorCause::ApiConnectionLimit => "api_connection_limit",
            ErrorCause::Heartbeat => "heartbeat",
            ErrorCause::KubernetesFeed => "kubernetes_feed",
            ErrorCause::MapFull => "map_full",
            ErrorCause::MapWrite => "map_write",
            ErrorCause::PresenceConflict => "presence_conflict",
            ErrorCause::PresenceList => "presence_list",
            ErrorCause::PresenceNodes => "presence_nodes",
            ErrorCause::PresenceSkipped => "presence_skipped",
            ErrorCause::PresenceWrite => "presence_write",
            ErrorCause::NodeReport => "node_report",
        }
    }
}

/// Why a Kubernetes stream was rebuilt (relisted): the `reason` label of
/// `arp_guard_feed_rebuilds_total` (in the order of their labels).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Rebuild {
    /// The API answers again and the stream's request has hung.
    ApiBack,
    /// No event, bookmark or end of watch within its deadline.
    Idle,
    /// Memory pressure is gone: take in the objects it skipped.
    Memory,
    /// A confirming GET showed a change the watch never delivered.
    Stuck,
}

impl Rebuild {
    pub fn as_str(self) -> &'static str {
        match self {
            Rebuild::ApiBack => "api_back",
            Rebuild::Idle => "idle",
            Rebuild::Memory => "memory",
            Rebuild::Stuck => "stuck",
        }
    }
}

/// What became of a Kubernetes Event: the `outcome` label of
/// `arp_guard_kube_events_total` (in the order of their labels).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum EventOutcome {
    /// Not sent: over the rate limit or the queue.
    Dropped,
    /// The API refused it.
    Failed,
    Published,
    /// The API did not answer in time.
    Timeout,
}

impl EventOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            EventOutcome::Dropped => "dropped",
            EventOutcome::Failed => "failed",
            EventOutcome::Published => "published",
            EventOutcome::Timeout => "timeout",
        }
    }
}

/// Operation counters of the daemon itself.
#[derive(Debug, Default)]
pub struct Ops {
    /// The datapath's hint to the feed: a speaker here announced an IP the
    /// feed calls foreign (a takeover it may have missed), so the API check
    /// is asked as soon as blindness would matter (`sources::cluster::hub`).
    pub api_hint: tokio::sync::Notify,
    /// Watch events received, by stream.
    pub feed_events: Mutex<BTreeMap<String, u64>>,
    pub map_writes: AtomicU64,
    pub map_removes: AtomicU64,
    pub errors: Mutex<BTreeMap<ErrorCause, u64>>,
    /// Kubernetes streams rebuilt (relisted), by stream and reason.
    pub feed_rebuilds: Mutex<BTreeMap<(String, Rebuild), u64>>,
    /// Objects from the Kubernetes API that could not be decoded, by stream.
    pub feed_undecodable: Mutex<BTreeMap<String, u64>>,
    /// New objects not taken in under memory pressure, by stream.
    pub feed_not_admitted: Mutex<BTreeMap<String, u64>>,
    /// Kubernetes Events, by reason and outcome.
    pub kube_events: Mutex<BTreeMap<(String, EventOutcome), u64>>,
    /// The memory watch found the daemon past 90 % of its limit: the feed
    /// takes in no new object until it is back under 75 %.
    memory_pressure: AtomicBool,
}

/// Count one more for `key` (allocating its name only the first time).
fn bump(m: &Mutex<BTreeMap<String, u64>>, key: &str) {
    let mut m = m.lock().unwrap_or_else(|p| p.into_inner());
    match m.get_mut(key) {
        Some(v) => *v += 1,
        None => {
            m.insert(key.to_owned(), 1);
        }
    }
}

/// Count one more for `key` in a map keyed by a typed label.
fn bump_by<K: Ord>(m: &Mutex<BTreeMap<K, u64>>, key: K) {
    *m.lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry(key)
        .or_default() += 1;
}

impl Ops {
    /// The memory watch's verdict.
    pub fn set_memory_pressure(&self, on: bool) {
        self.memory_pressure.store(on, Relaxed);
    }
    pub fn under_memory_pressure(&self) -> bool {
        self.memory_pressure.load(Relaxed)
    }
    pub fn error(&self, cause: ErrorCause) {
        bump_by(&self.errors, cause);
    }
    pub fn feed_rebuild(&self, stream: &str, reason: Rebuild) {
        bump_by(&self.feed_rebuilds, (stream.to_owned(), reason));
    }
    pub fn feed_event(&self, stream: &str) {
        bump(&self.feed_events, stream);
    }
    pub fn feed_undecodable(&self, stream: &str) {
        bump(&self.feed_undecodable, stream);
    }
    pub fn kube_event(&self, reason: &str, outcome: EventOutcome) {
        bump_by(&self.kube_events, (reason.to_owned(), outcome));
    }
    pub fn feed_not_admitted(&self, stream: &str) {
        bump(&self.feed_not_admitted, stream);
    }
}
