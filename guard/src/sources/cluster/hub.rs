//! What the streams' tasks and the feed's loop share: the [`Feed`] and what
//! was last published from it. A stream's task applies what it reads at
//! once, in its own task (a watch event is a read, a parse and an apply:
//! no channel between them), publishes the view when it changed, and wakes
//! the loop only for what the loop alone does: confirmations, the API check,
//! rebuilds, or a deadline sooner than the one it sleeps to. A renewal
//! that changes nothing wakes nothing.
//!
//! Everything runs on the feed's one thread; the lock is never contended
//! and never held across an await.

use std::{
    sync::{Mutex, MutexGuard},
    time::{Duration, Instant},
};

use tokio::sync::{watch, Notify};

use super::per_stream::{PerStream, StreamId};
use super::{cause::Failure, feed::Feed, stream::Msg};
use crate::model::cluster::ClusterView;

/// The API check (is the API there at all?): at most this often...
pub(super) const CHECK_EVERY: Duration = Duration::from_secs(2);
/// ...and, while the feed is healthy, only once nothing has shown the API
/// alive for this long: the API server sends a bookmark about once a
/// minute on every watch (and a stream's event or end of watch shows life
/// too), so at rest it never runs; it asks when the heartbeat is overdue.
/// A guard at rest sends no request of its own but a watch's renewal every
/// few minutes.
pub(super) const QUIET_AT_REST: Duration = Duration::from_secs(75);
/// ...or, once the datapath hinted that something may have moved unseen (a
/// speaker here announced an IP the feed calls foreign: a takeover the
/// feed may have missed), as soon as blindness would matter: its failure
/// makes the guard blind since that last sign of life, so the check runs
/// [`CHECK_TIMEOUT`] and a second before the staleness threshold and no
/// more often than every [`CHECK_QUIET_MIN`] (on a hint, blindness is seen
/// within the threshold, as the rule says).
const CHECK_QUIET_MIN: Duration = Duration::from_secs(5);
pub(super) const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// The task has no one to report to: the feed is gone, or the stream's
/// task was replaced.
pub(super) struct Closed;

/// The shared state and the loop's wake-up.
pub(super) struct Hub {
    core: Mutex<Core>,
    wake: Notify,
}

pub(super) struct Core {
    pub(super) feed: Feed,
    /// Each stream's current task (a replaced task's messages are dropped).
    pub(super) generations: PerStream<u64>,
    pub(super) next_check: Instant,
    /// An API check is out: not due again, nor waited for, until it answers
    /// (its answer wakes the loop).
    pub(super) checking: bool,
    /// A stream's task panicked (its name): the feed stops, as it did when
    /// its loop applied every message itself (the daemon exits and is
    /// restarted; its datapath fails open meanwhile), rather than go on
    /// with a stream that nothing drives.
    pub(super) panicked: Option<String>,
    /// The deadline the loop sleeps to.
    pub(super) armed: Instant,
    /// Until when the datapath's last hint stands (a staleness threshold
    /// after it): the API check is asked as soon as blindness would matter.
    pub(super) hinted_until: Option<Instant>,
    tx: watch::Sender<ClusterView>,
    was_degraded: bool,
    announced_sync: bool,
}

impl Hub {
    pub(super) fn new(feed: Feed, tx: watch::Sender<ClusterView>, now: Instant) -> Hub {
        Hub {
            core: Mutex::new(Core {
                generations: feed.streams.map(|_| 0),
                feed,
                next_check: now + CHECK_EVERY,
                checking: false,
                panicked: None,
                armed: now,
                hinted_until: None,
                tx,
                was_degraded: false,
                announced_sync: false,
            }),
            wake: Notify::new(),
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, Core> {
        // A stream's task that panics holding it stops the feed (its
        // PanicWatch tells the loop); the lock must still be taken to read
        // that, so poison is not a panic of its own.
        self.core
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Wait until a stream's task wakes the loop (a wake-up sent while the
    /// loop was busy is kept).
    pub(super) async fn woken(&self) {
        self.wake.notified().await;
    }

    /// `msg` from stream `stream`'s task number `generation`: applied,
    /// published if the view changed, the loop woken if it has work.
    /// `more`: more events of the same read follow at once (published with
    /// the last of them: a burst is one view).
    pub(super) fn deliver(
        &self,
        (stream, generation): (StreamId, u64),
        msg: Msg,
        more: bool,
    ) -> Result<(), Closed> {
        let mut c = self.lock();
        if c.generations.get(stream) != Some(&generation) {
            return Err(Closed);
        }
        let now = Instant::now();
        // A listed object goes into the relist's buffer: nothing shows
        // before the relist's end, which is published (a page of objects
        // is not a page of views).
        let listed = matches!(&msg, Msg::Update(u) if u.is_listed());
        let routine = matches!(msg, Msg::Update(_) | Msg::Progress);
        c.feed.on_msg(stream, msg, now);
        if listed || (more && routine) {
            return Ok(());
        }
        c.publish(now, Some(now));
        if !routine || c.needs_loop(now) {
            self.wake.notify_one();
        }
        Ok(())
    }

    /// A task of the feed panicked (`who`, if it is still the feed's): the
    /// loop is told and stops the feed.
    fn stop_for_panic(&self, who: impl FnOnce(&Core) -> Option<String>) {
        let mut c = self.lock();
        if let Some(who) = who(&c) {
            c.panicked = Some(who);
            self.wake.notify_one();
        }
    }
}

/// Set on a stream's task: tells the loop when the task ends by a panic.
pub(super) struct PanicWatch {
    pub hub: std::sync::Arc<Hub>,
    pub stream: StreamId,
    pub generation: u64,
}

impl Drop for PanicWatch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let (stream, generation) = (self.stream, self.generation);
            // A replaced task's panic is no longer the feed's.
            self.hub.stop_for_panic(|c| {
                (c.generations.get(stream) == Some(&generation))
                    .then(|| c.feed.name(stream).to_owned())
            });
        }
    }
}

/// Set on a task the loop spawned for one question (the API check, a
/// confirming GET): a panic there stops the feed as a stream's does, rather
/// than leave the loop waiting for an answer that never comes (no more
/// checks, or confirmations, ever: a Lease expiry never acted on).
pub(super) struct AskWatch {
    pub hub: std::sync::Arc<Hub>,
    pub what: &'static str,
}

impl Drop for AskWatch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.hub.stop_for_panic(|_| Some(self.what.to_owned()));
        }
    }
}

/// How long a healthy feed waits after its last sign of life before it
/// checks, for a staleness `threshold`: the API check fails (times out) a
/// second before the threshold, so that blindness is still seen in time.
pub(super) fn check_quiet(threshold: Duration) -> Duration {
    (threshold.saturating_sub(CHECK_TIMEOUT + Duration::from_secs(1))).max(CHECK_QUIET_MIN)
}

/// When the API check is due: not before `next` (spacing); while the feed is
/// `healthy`, not before `quiet` after its last sign of life.
pub(super) fn check_at(
    next: Instant,
    healthy: bool,
    last_alive: Instant,
    quiet: Duration,
) -> Instant {
    if healthy {
        next.max(last_alive + quiet)
    } else {
        next
    }
}

impl Core {
    /// When the API check is next due (the loop wakes then: one rule for both).
    pub(super) fn check_at(&self, now: Instant) -> Instant {
        let f = &self.feed;
        let hinted = self.hinted_until.is_some_and(|t| t > now);
        let quiet = check_quiet(f.threshold());
        let quiet = if hinted {
            quiet
        } else {
            quiet.max(QUIET_AT_REST)
        };
        check_at(self.next_check, f.all_healthy(), f.last_alive(), quiet)
    }

    /// The datapath hinted that something may have moved unseen: for a
    /// staleness threshold, the API check is asked as soon as blindness
    /// would matter.
    pub(super) fn hinted(&mut self, now: Instant) {
        self.hinted_until = Some(now + self.feed.threshold());
    }

    /// The loop's next deadline: a Lease expiry, the staleness threshold,
    /// the API check (unless one is out: its answer wakes the loop, and a
    /// due time already past would be a busy loop until then).
    pub(super) fn wake(&self, now: Instant) -> Instant {
        let f = &self.feed;
        let check = if self.checking {
            now + CHECK_EVERY
        } else {
            self.check_at(now)
        };
        [
            f.store.next_expiry(now),
            f.failing_since(now).map(|t| t + f.threshold()),
        ]
        .into_iter()
        .flatten()
        .filter(|t| *t > now)
        .fold(check, Instant::min)
    }

    /// Whether the API check is to be asked now.
    pub(super) fn check_due(&self, now: Instant) -> bool {
        !self.checking && now >= self.check_at(now)
    }

    /// The API check is asked: out until it answers, and spaced from now.
    pub(super) fn check_asked(&mut self, now: Instant) {
        self.checking = true;
        self.next_check = now + CHECK_EVERY;
    }

    /// The API check's answer: the API alive (true), or failing since the
    /// feed's last sign of life (read now: a stream may have delivered while
    /// the check was out). Either way the next one is due a period later.
    pub(super) fn check_answered(&mut self, answer: Result<(), Failure>, now: Instant) -> bool {
        self.checking = false;
        self.next_check = now + CHECK_EVERY;
        match answer {
            Ok(()) => {
                self.feed.ok(None, now);
                true
            }
            Err(f) => {
                let since = self.feed.last_alive();
                self.feed.failed(None, &f, since);
                false
            }
        }
    }

    /// The loop has work a stream's message may have made due: a rebuild,
    /// a relist held back by memory pressure, a confirmation (a Lease past
    /// its deadline, or failing ones the watch may have made moot), or a
    /// deadline sooner than the one it sleeps to.
    fn needs_loop(&self, now: Instant) -> bool {
        let f = &self.feed;
        !f.rebuild.is_empty()
            || !f.not_admitted.is_empty()
            || f.confirm_failing.is_some()
            || !f.store.unconfirmed(now).is_empty()
            || self.wake(now) < self.armed
    }

    /// Publish the view if it changed; log entering and leaving degradation
    /// and the first sync.
    pub(super) fn publish(&mut self, now: Instant, event_at: Option<Instant>) {
        let Some(view) = self.feed.changed_view(now, event_at) else {
            return;
        };
        let f = &self.feed;
        if view.degraded != self.was_degraded {
            self.was_degraded = view.degraded;
            if view.degraded {
                tracing::warn!(
                    after = ?f.threshold(),
                    error = f.last_error.as_deref().unwrap_or(""),
                    "ownership feed stale: every foreign LB IP is treated as unknown until the API is back \
                     (IPs this node owns stay owned)"
                );
            } else {
                tracing::info!("ownership feed fresh again: foreign LB IPs are enforced again");
            }
        }
        if view.synced && !self.announced_sync {
            self.announced_sync = true;
            tracing::info!(
                services = f.store.services.len(),
                leases = f.store.leases.len(),
                l2statuses = f.store.l2.len(),
                "initial sync from the Kubernetes API done"
            );
        }
        self.tx.send_if_modified(|cur| {
            if *cur == view {
                return false;
            }
            *cur = view;
            true
        });
    }
}

#[cfg(test)]
mod tests {
    use super::super::{
        cause::{Cause, Failure},
        decode::{Lease, Obj, Service},
        feed::WATCH_TIMEOUT,
        stream::{Event, Update},
        FeedConfig,
    };
    use super::*;

    fn hub(t0: Instant) -> (Hub, watch::Receiver<ClusterView>) {
        let (tx, rx) = watch::channel(ClusterView::default());
        let feed = Feed::new(FeedConfig::cilium(WATCH_TIMEOUT), t0, Default::default());
        (Hub::new(feed, tx, t0), rx)
    }

    use super::super::fixtures::svc;

    fn lease(holder: &str) -> Lease {
        super::super::fixtures::lease(holder, "2026-11-30T10:00:00.000000Z", 15)
    }

    fn svc_msg(e: Event<Service>) -> Msg {
        Msg::Update(Update::Svc(Box::new(e)))
    }

    fn lease_msg(e: Event<Lease>) -> Msg {
        Msg::Update(Update::Lease(Box::new(e)))
    }

    fn owner(rx: &watch::Receiver<ClusterView>) -> Option<String> {
        let v = rx.borrow();
        let snap = v.owners.snapshot();
        snap.get(&"198.51.100.10".parse().unwrap())
            .and_then(|c| c.owner.as_deref().map(str::to_owned))
    }

    /// What a stream's task delivers is applied at once; a relist shows
    /// only at its end, a burst only at its last event, and a replaced
    /// task's messages are refused (the task then stops).
    #[test]
    fn a_stream_s_events_are_applied_in_its_task_and_published_per_read() {
        let t0 = Instant::now();
        let (h, rx) = hub(t0);
        let svcs = (StreamId::nth(0), 0);
        let leases = (StreamId::nth(1), 0);
        h.deliver(svcs, svc_msg(Event::Listing), false)
            .ok()
            .unwrap();
        h.deliver(svcs, svc_msg(Event::Listed(Obj::Good(svc()))), false)
            .ok()
            .unwrap();
        h.deliver(svcs, svc_msg(Event::ListDone), false)
            .ok()
            .unwrap();
        h.deliver(leases, lease_msg(Event::Listing), false)
            .ok()
            .unwrap();
        h.deliver(
            leases,
            lease_msg(Event::Listed(Obj::Good(lease("node-a")))),
            false,
        )
        .ok()
        .unwrap();
        assert_eq!(
            owner(&rx),
            None,
            "a listed object shows at the relist's end"
        );
        h.deliver(leases, lease_msg(Event::ListDone), false)
            .ok()
            .unwrap();
        assert_eq!(owner(&rx).as_deref(), Some("node-a"));
        // Two moves read together: one view, the last.
        let moved = |n: &str| lease_msg(Event::Apply(Obj::Good(lease(n))));
        h.deliver(leases, moved("node-b"), true).ok().unwrap();
        assert_eq!(
            owner(&rx).as_deref(),
            Some("node-a"),
            "more of the read follows"
        );
        h.deliver(leases, moved("node-c"), false).ok().unwrap();
        assert_eq!(owner(&rx).as_deref(), Some("node-c"));
        // The stream's task was replaced: the old one's messages are refused.
        h.lock().generations[StreamId::nth(1)] += 1;
        assert!(h.deliver(leases, moved("node-d"), false).is_err());
        assert_eq!(owner(&rx).as_deref(), Some("node-c"));
    }

    /// A stream's task that panics is told to the loop, which stops the
    /// feed (the daemon then exits and its datapath fails open), instead of
    /// a stream that silently nobody drives; a replaced task's end is not.
    #[test]
    fn a_panicking_stream_task_is_told_to_the_loop() {
        let (h, _rx) = hub(Instant::now());
        let h = std::sync::Arc::new(h);
        let (a, b) = (h.clone(), h.clone());
        let quiet = std::thread::spawn(move || {
            let _w = PanicWatch {
                hub: a,
                stream: StreamId::nth(0),
                generation: 0,
            };
        });
        quiet.join().unwrap();
        assert_eq!(
            h.lock().panicked,
            None,
            "an ordinary end (its task was replaced)"
        );
        let died = std::thread::spawn(move || {
            let _w = PanicWatch {
                hub: b,
                stream: StreamId::nth(0),
                generation: 0,
            };
            panic!("applying an event");
        });
        assert!(died.join().is_err());
        assert!(h.lock().panicked.is_some(), "told");
    }

    /// A question the loop sent out in a task of its own (the API check, a
    /// confirming GET) that panics stops the feed, rather than leave the
    /// loop waiting for its answer for ever.
    #[test]
    fn a_panicking_question_is_told_to_the_loop() {
        let (h, _rx) = hub(Instant::now());
        let h = std::sync::Arc::new(h);
        let a = h.clone();
        let died = std::thread::spawn(move || {
            let _w = AskWatch {
                hub: a,
                what: "the API check",
            };
            panic!("asking");
        });
        assert!(died.join().is_err());
        assert_eq!(h.lock().panicked.as_deref(), Some("the API check"));
    }

    /// While an API check is out, the loop neither asks another nor wakes
    /// for one (its due time has passed: that would be a busy loop until
    /// the answer); once it answered, either way, the next is due a period
    /// later (an answer that left it out would end the checks for good).
    #[test]
    fn a_check_out_is_not_due_and_does_not_wake_the_loop() {
        let t0 = Instant::now();
        let (h, _rx) = hub(t0);
        let mut c = h.lock();
        c.next_check = t0;
        let later = t0 + QUIET_AT_REST + Duration::from_secs(1);
        assert!(c.check_due(later), "due: nothing else is out");
        c.check_asked(later);
        let much_later = later + Duration::from_secs(600);
        assert!(!c.check_due(much_later), "out: never asked twice");
        assert!(c.wake(much_later) > much_later, "no deadline in the past");
        let failed = Failure::new(Cause::Other, "timed out");
        for (answer, alive) in [(Err(failed), false), (Ok(()), true)] {
            let t = much_later;
            assert_eq!(c.check_answered(answer, t), alive);
            assert!(!c.check_due(t + CHECK_EVERY - Duration::from_millis(1)));
            let next = c.check_at(t);
            assert!(next >= t + CHECK_EVERY);
            assert!(c.check_due(next), "due again (alive: {alive})");
            c.check_asked(t);
        }
    }

    /// The loop sleeps until the API check is due, and the API check runs then: a
    /// time in the past that the API check's rule does not call due would be a
    /// busy loop.
    #[test]
    fn the_api_check_runs_when_the_loop_wakes_for_it() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let q = check_quiet(s(15));
        // Quiet and healthy: 12 s after the last sign of life at the default
        // 15 s threshold (its timeout ends a second before the threshold).
        assert_eq!(q, s(12));
        assert_eq!(check_at(t0, true, t0, q), t0 + q);
        // A stream delivered a moment ago: later still.
        assert_eq!(check_at(t0, true, t0 + s(3), q), t0 + s(3) + q);
        // Failing: every CHECK_EVERY, whatever the last sign of life.
        assert_eq!(check_at(t0 + s(2), false, t0 + s(9), q), t0 + s(2));
        // Spacing is kept either way.
        assert_eq!(check_at(t0 + s(13), true, t0, q), t0 + s(13));
        // A short threshold: never more often than CHECK_QUIET_MIN.
        assert_eq!(check_quiet(s(3)), CHECK_QUIET_MIN);
        assert!(check_quiet(s(60)) + CHECK_TIMEOUT < s(60));
    }

    /// At rest (healthy, no hint) the check waits for the heartbeat to be
    /// overdue; a hint brings it back to the staleness threshold's rule,
    /// for a threshold; failing, it is asked every CHECK_EVERY.
    #[test]
    fn at_rest_the_check_waits_for_an_overdue_heartbeat_and_a_hint_brings_it_forward() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let (h, _rx) = hub(t0);
        let mut c = h.lock();
        c.next_check = t0;
        c.feed.ok(None, t0);
        assert_eq!(c.feed.threshold(), s(15));
        assert_eq!(c.check_at(t0), t0 + QUIET_AT_REST, "at rest");
        c.hinted(t0 + s(1));
        assert_eq!(
            c.check_at(t0 + s(1)),
            t0 + s(12),
            "hinted: 3 s before the threshold"
        );
        assert_eq!(
            c.check_at(t0 + s(16)),
            t0 + QUIET_AT_REST,
            "the hint stands for one threshold"
        );
    }
}
