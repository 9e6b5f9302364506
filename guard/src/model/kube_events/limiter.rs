//! The rate limits of Events from one node (`Limiter`), per stream (a
//! Service and a reason) and in all.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use super::{Occurrence, Reason};

/// How often Events may be published from one node.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// At most one per Service and reason this often.
    pub per_stream: Duration,
    /// At most this many per minute in all.
    pub per_minute: u32,
}

/// One Event stream: a Service (namespace/name) and a reason.
pub type StreamKey = (String, Reason);

/// At most this many streams wait for their turn; more are dropped.
pub const MAX_PENDING: usize = 1024;

/// The rate limits: an occurrence is published at once when its stream and
/// the node's budget allow it; otherwise it waits (the latest of a stream
/// replaces the one waiting) and goes when they do. A flapping IP costs the
/// API server one Event (or one series update) per stream and period.
#[derive(Debug)]
pub struct Limiter {
    limits: Limits,
    last: BTreeMap<StreamKey, Instant>,
    pending: BTreeMap<StreamKey, Occurrence>,
    minute: (Instant, u32),
}

/// What became of an occurrence offered to the limiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offered {
    /// Waiting for its turn (possibly replacing an earlier one).
    Waiting,
    /// Dropped: too many streams wait already.
    Dropped,
}

impl Limiter {
    pub fn new(limits: Limits, now: Instant) -> Self {
        Limiter {
            limits,
            last: BTreeMap::new(),
            pending: BTreeMap::new(),
            minute: (now, 0),
        }
    }

    pub fn offer(&mut self, key: StreamKey, o: Occurrence) -> Offered {
        if self.pending.len() >= MAX_PENDING && !self.pending.contains_key(&key) {
            return Offered::Dropped;
        }
        self.pending.insert(key, o);
        Offered::Waiting
    }

    /// The occurrences whose turn has come, taken out.
    pub fn due(&mut self, now: Instant) -> Vec<(StreamKey, Occurrence)> {
        if now.duration_since(self.minute.0) >= Duration::from_secs(60) {
            self.minute = (now, 0);
        }
        let per = self.limits.per_stream;
        self.last
            .retain(|k, t| now.duration_since(*t) < k.1.interval(per));
        let ready: Vec<StreamKey> = (self.pending.keys())
            .filter(|k| !self.last.contains_key(*k))
            .take(self.limits.per_minute.saturating_sub(self.minute.1) as usize)
            .cloned()
            .collect();
        let mut out = Vec::with_capacity(ready.len());
        for k in ready {
            if let Some(o) = self.pending.remove(&k) {
                self.last.insert(k.clone(), now);
                self.minute.1 += 1;
                out.push((k, o));
            }
        }
        out
    }

    #[cfg(test)]
    pub fn waiting(&self) -> usize {
        self.pending.len()
    }
}
