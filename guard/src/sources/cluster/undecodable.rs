//! Objects the API serves that the guard cannot decode: each is counted
//! (`arp_guard_feed_undecodable_objects_total`), logged once while it stays
//! unreadable (at most [`LOG_MAX`] lines until every stream reads cleanly
//! again), and shown per stream in the status. What the store does with
//! them is `apply`'s.

use super::per_stream::StreamId;
use super::{decode::Bad, feed::Feed, store::Key, stream::Stream};

/// Distinct undecodable objects logged one by one; past it, one line says
/// that more are not.
pub const LOG_MAX: usize = 20;

/// What an unreadable object of this stream means for the guard.
fn consequence(s: Option<&Stream>) -> &'static str {
    match s {
        Some(Stream::Leases) => {
            "the IPs of the Services it decides are not trusted until it can be read \
             (this node keeps an IP it holds; another holder's is judged unknown)"
        }
        Some(Stream::Services) => {
            "its last good version is kept, not trusted (a Service never read is not guarded: its frames pass)"
        }
        _ => "its last good version is kept, not trusted",
    }
}

impl Feed {
    /// `stream` delivered an object it cannot decode.
    pub(super) fn undecodable(&mut self, stream: StreamId, key: Option<&Key>, b: &Bad) {
        self.ops.feed_undecodable(&self.streams[stream].name);
        let new = match (key, self.streams.get_mut(stream)) {
            (Some(k), Some(s)) => s.unreadable.insert(k.clone()),
            _ => true,
        };
        if !new {
            return;
        }
        if self.bad_log.logged < LOG_MAX {
            self.bad_log.logged += 1;
            let object = key.map_or_else(|| "(no readable name)".to_owned(), Key::to_string);
            tracing::warn!(
                stream = %self.streams[stream].name,
                object = %object,
                resource_version = b.resource_version.as_deref().unwrap_or(""),
                error = %b.error,
                consequence = consequence(self.streams.get(stream).map(|s| &s.kind)),
                "an object from the Kubernetes API cannot be decoded: skipped, the rest of the stream is read"
            );
        } else if !std::mem::replace(&mut self.bad_log.muted, true) {
            tracing::warn!(
                logged = LOG_MAX,
                "more objects from the Kubernetes API cannot be decoded; not logged one by one \
                 (arp_guard_feed_undecodable_objects_total counts them, the status shows how many per stream)"
            );
        }
    }

    /// `stream` read the object `key` (or saw it deleted): no longer unreadable.
    pub(super) fn readable(&mut self, stream: StreamId, key: &Key) {
        let Some(s) = self.streams.get_mut(stream) else {
            return;
        };
        if s.unreadable.is_empty() || !s.unreadable.remove(key) {
            return;
        }
        tracing::info!(stream = %self.streams[stream].name, object = %key, "the object can be read again");
        if self.streams.iter().all(|s| s.unreadable.is_empty()) {
            (self.bad_log.logged, self.bad_log.muted) = (0, false);
        }
    }
}
