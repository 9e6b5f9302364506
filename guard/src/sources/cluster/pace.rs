//! The pace of a stream's retries: the back-off between failed attempts,
//! the spread of watch timeouts, how long a watch may be silent, and the handle through which the feed cuts
//! a back-off short or sees a request hang.

use std::{
    sync::atomic::{AtomicU64, Ordering::Relaxed},
    time::{Duration, Instant},
};

/// A stream that has not shown the server's heartbeat shows progress at
/// least at its watch's end (the server ends it, after a bookmark); this
/// much later it is stuck.
pub const IDLE_MARGIN: Duration = Duration::from_secs(10);
/// A stream that has shown the server's periodic bookmarks (about one a
/// minute) and then shows nothing at all for this long is stuck.
pub const HEARTBEAT_SILENCE: Duration = Duration::from_secs(90);

/// Back-off between failed attempts: doubling from `base` up to 30 s, with
/// jitter so that a fleet of guards does not come back in step after an API
/// outage.
pub fn backoff(base: Duration, attempt: u32) -> Duration {
    let d = (base * 2u32.saturating_pow(attempt.min(8))).min(Duration::from_secs(30));
    let jitter = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos())
        % 1000;
    d + d * jitter / 4000
}

/// Whether the server sends bookmarks through a watch (a heartbeat, about
/// one a minute), not only at its end: a stream that has shown one is
/// judged by them, stuck after [`HEARTBEAT_SILENCE`] of nothing; one that
/// has not, after its watch's time and [`IDLE_MARGIN`].
#[derive(Debug, Default)]
pub struct Heartbeat(bool);

impl Heartbeat {
    /// The idle deadline of a watch that asked for `timeout`.
    pub fn idle(&self, timeout: Duration) -> Duration {
        let end = timeout + IDLE_MARGIN;
        if self.0 {
            end.min(HEARTBEAT_SILENCE)
        } else {
            end
        }
    }

    /// A bookmark `at` into a watch that asked for `timeout`: true when it
    /// shows the heartbeat first (well before the watch's end, where every
    /// server sends one), so that the deadline shrinks.
    pub fn bookmark(&mut self, at: Duration, timeout: Duration) -> bool {
        let first = !self.0 && at + IDLE_MARGIN < timeout;
        self.0 |= first;
        first
    }

    /// The stream was judged silent: learned again on the next watch. A
    /// server that stopped sending bookmarks (another replica behind the
    /// same address) would otherwise be judged silent, and relisted, every
    /// [`HEARTBEAT_SILENCE`] for ever.
    pub fn went_idle(&mut self) {
        self.0 = false;
    }
}

/// Shared between a stream's task and the feed: the feed can cut a back-off
/// short (the API answers again) and can tell a task waiting in back-off from
/// one stuck in a request.
#[derive(Default)]
pub struct StreamCtl {
    kick: tokio::sync::Notify,
    /// When the request in flight (a list page, or a watch being opened)
    /// started, in ms of [`mono_ms`]; 0 while none is.
    busy_since: AtomicU64,
}

/// Milliseconds since the first call, plus one (0 means "none" in an atomic).
fn mono_ms() -> u64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1
}

impl StreamCtl {
    /// Run `f` as a request: seen as busy meanwhile.
    pub(super) async fn request<T>(&self, f: impl std::future::Future<Output = T>) -> T {
        self.busy_since.store(mono_ms(), Relaxed);
        let r = f.await;
        self.busy_since.store(0, Relaxed);
        r
    }

    /// Wait out a back-off, unless kicked.
    pub(super) async fn pause(&self, d: Duration) {
        tokio::select! {
            _ = tokio::time::sleep(d) => {}
            _ = self.kick.notified() => {}
        }
    }

    /// End a back-off now.
    pub fn kick(&self) {
        self.kick.notify_one();
    }

    /// How long the request in flight has been going.
    pub fn busy_for(&self) -> Option<Duration> {
        match self.busy_since.load(Relaxed) {
            0 => None,
            t => Some(Duration::from_millis(mono_ms().saturating_sub(t))),
        }
    }
}

/// A time in [`min`, 2 × `min`): each watch its own, so that a fleet of
/// guards started together does not come back in step.
pub(super) fn spread(min: Duration) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    // The low bits of the clock's nanoseconds vary from call to call.
    let share = u64::from(nanos.wrapping_mul(2_654_435_761) >> 22) % 1000;
    let secs = min.as_secs();
    Duration::from_secs(secs + secs * share / 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A heartbeat shrinks the deadline; a stream judged silent forgets it,
    /// so that a server without bookmarks is not relisted every
    /// HEARTBEAT_SILENCE; a bookmark at a watch's end shows nothing.
    #[test]
    fn the_heartbeat_is_learned_per_run_of_watches() {
        let timeout = Duration::from_secs(480);
        let mut h = Heartbeat::default();
        assert_eq!(h.idle(timeout), timeout + IDLE_MARGIN);
        assert!(!h.bookmark(timeout - IDLE_MARGIN, timeout), "at the end");
        assert!(h.bookmark(Duration::from_secs(60), timeout));
        assert!(!h.bookmark(Duration::from_secs(120), timeout), "once");
        assert_eq!(h.idle(timeout), HEARTBEAT_SILENCE);
        h.went_idle();
        assert_eq!(h.idle(timeout), timeout + IDLE_MARGIN);
    }
}
