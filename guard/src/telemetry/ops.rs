//! The daemon's own operation counters (feed events, map writes, errors),
//! counted where things happen and exported by /metrics.

use std::{
    collections::BTreeMap,
    sync::{atomic::AtomicU64, Mutex},
};

/// Operation counters of the daemon itself.
#[derive(Debug, Default)]
pub struct Ops {
    pub feed_events: Mutex<BTreeMap<String, u64>>,
    pub map_writes: AtomicU64,
    pub map_removes: AtomicU64,
    pub errors: Mutex<BTreeMap<&'static str, u64>>,
    /// Kubernetes streams rebuilt (relisted), by stream and reason.
    pub feed_rebuilds: Mutex<BTreeMap<(String, &'static str), u64>>,
    /// Objects from the Kubernetes API that could not be decoded, by stream.
    pub feed_undecodable: Mutex<BTreeMap<String, u64>>,
    /// New objects not taken in under memory pressure, by stream.
    pub feed_not_admitted: Mutex<BTreeMap<String, u64>>,
    /// Kubernetes Events, by reason and outcome (published, failed,
    /// timeout, dropped).
    pub kube_events: Mutex<BTreeMap<(String, &'static str), u64>>,
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

impl Ops {
    pub fn error(&self, cause: &'static str) {
        *self
            .errors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(cause)
            .or_default() += 1;
    }
    pub fn feed_rebuild(&self, stream: &str, reason: &'static str) {
        *self
            .feed_rebuilds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry((stream.to_owned(), reason))
            .or_default() += 1;
    }
    pub fn feed_event(&self, source: &str) {
        bump(&self.feed_events, source);
    }
    pub fn feed_undecodable(&self, stream: &str) {
        bump(&self.feed_undecodable, stream);
    }
    pub fn kube_event(&self, reason: &str, outcome: &'static str) {
        *self
            .kube_events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry((reason.to_owned(), outcome))
            .or_default() += 1;
    }
    pub fn feed_not_admitted(&self, stream: &str) {
        bump(&self.feed_not_admitted, stream);
    }
}

/// The daemon's operation counters (one process, one set).
pub static OPS: std::sync::LazyLock<Ops> = std::sync::LazyLock::new(Ops::default);
