//! Confirming a Lease that seems to expire before it changes anything: a
//! direct GET tells a holder that stopped renewing (the expiry stands) from a
//! stuck watch (a renewal or a deletion the watch never delivered: the watch
//! is rebuilt) and from a blind guard (the GET fails: the holder keeps its
//! claim, uncertain).

use std::time::{Duration, Instant};

use super::{
    cause::{Cause, Failure, Who},
    decode::{self, Obj},
    feed::Feed,
    listwatch::backoff,
    objects,
    store::{Key, LeaseInfo},
};
use crate::{
    model::text::clip,
    ops::{ErrorCause, Rebuild},
};

/// A GET that confirms a Lease: its timeout, and how soon a failed one is retried.
pub const CONFIRM_TIMEOUT: Duration = Duration::from_secs(2);
/// First retry of a failed confirmation; doubling per attempt up to 30 s
/// (a failing API must not be hammered by a fleet of guards).
const CONFIRM_RETRY: Duration = Duration::from_secs(2);
/// Confirmations in flight at once.
const CONFIRM_PARALLEL: usize = 16;

/// The answer to a confirming GET of a Lease.
pub(crate) type Confirmation = Result<Option<Obj<decode::Lease>>, Failure>;

impl Feed {
    /// Leases to confirm now: past their deadline, unconfirmed, and not
    /// asked about recently (a failed GET is retried after 2 s, doubling up
    /// to 30 s, with jitter).
    pub(crate) fn due_confirmations(&mut self, now: Instant, in_flight: usize) -> Vec<Key> {
        let room = CONFIRM_PARALLEL.saturating_sub(in_flight);
        let unconfirmed = self.store.unconfirmed(now);
        if unconfirmed.is_empty() && self.confirm_failing.is_some() {
            // A GET failed, but the watch has since shown every Lease renewed
            // (or gone): nothing is left to confirm, so the guard is not
            // blind for want of an answer any more.
            self.confirm_failing = None;
            self.confirm_sent.clear();
            if self.answered(Who::Confirm) {
                tracing::info!(
                    "no Lease expiry left to confirm; Kubernetes API feed healthy again"
                );
            }
        }
        let due: Vec<Key> = unconfirmed
            .into_iter()
            .map(|(k, _)| k)
            .filter(|k| match self.confirm_sent.get(k) {
                None => true,
                Some((sent, 0)) => now.duration_since(*sent) >= CONFIRM_TIMEOUT,
                Some((sent, fails)) => {
                    now.duration_since(*sent) >= backoff(CONFIRM_RETRY, fails - 1)
                }
            })
            .take(room)
            .collect();
        for k in &due {
            let fails = self.confirm_sent.get(k).map_or(0, |(_, f)| *f);
            self.confirm_sent.insert(k.clone(), (now, fails));
        }
        due
    }

    /// The answer to a confirming GET sent at `sent`.
    pub(crate) fn on_confirm(
        &mut self,
        key: Key,
        sent: Instant,
        answer: Confirmation,
        now: Instant,
    ) {
        // The watch told us something newer since the GET went out (or the
        // Lease is gone from the store): the answer is old news.
        match self.store.leases.get(&key) {
            Some(l) if l.checked <= sent => {}
            _ => {
                self.confirm_sent.remove(&key);
                return;
            }
        }
        match answer {
            // The API answered with a Lease the guard cannot read: not a
            // blind guard, an unreadable Lease (its Services only).
            Ok(Some(Obj::Bad(b))) => {
                self.confirmed(&key);
                if let Some(i) = self.lease_stream() {
                    self.undecodable(i, Some(&key), &b);
                }
                let holder = objects::holder(b.holder.as_deref());
                self.store.lease_unreadable(key, holder, now);
            }
            Ok(Some(Obj::Good(l))) => {
                self.confirmed(&key);
                let f = objects::lease(&l);
                let renew = f.renew.clone();
                if self.upsert_lease(key.clone(), f, now) {
                    self.watch_stuck(
                        &key,
                        &format!(
                            "a GET shows a renewal the watch never delivered (renewTime {})",
                            renew.as_deref().unwrap_or("-")
                        ),
                    );
                } else {
                    tracing::info!(lease = %key, "Lease expiry confirmed by the API: not renewed within its duration");
                }
            }
            Ok(None) => {
                self.confirmed(&key);
                self.store.remove_lease(&key);
                self.watch_stuck(
                    &key,
                    "a GET shows the Lease deleted, which the watch never delivered",
                );
            }
            Err(f) => self.unconfirmed(&key, &f, now),
        }
    }

    /// The API answered a confirming GET.
    fn confirmed(&mut self, key: &Key) {
        self.confirm_sent.remove(key);
        let was = self.confirm_failing.take().is_some();
        if self.answered(Who::Confirm) && was {
            tracing::info!(
                "Lease expiries can be confirmed again; Kubernetes API feed healthy again"
            );
        }
    }

    /// A GET showed what the Lease watch never delivered.
    fn watch_stuck(&mut self, key: &Key, what: &str) {
        tracing::warn!(lease = %key, "{what}: the Lease watch is stuck; rebuilding it");
        if let Some(i) = self.lease_stream() {
            let since = self.streams[i].health.last_progress;
            let e = format!("missed a change of Lease {key}: stuck");
            self.failed(Some(i), &Failure::new(Cause::Other, e), since);
            self.rebuild.insert(i, Rebuild::Stuck);
        }
    }

    /// A confirming GET failed: the guard is blind.
    fn unconfirmed(&mut self, key: &Key, f: &Failure, now: Instant) {
        {
            self.ops.error(ErrorCause::KubernetesFeed);
            self.report(Who::Confirm, f);
            if let Some((_, fails)) = self.confirm_sent.get_mut(key) {
                *fails += 1;
            }
            let e = clip(&f.text, super::objects::MAX_FIELD);
            if self.confirm_failing.is_none() {
                tracing::warn!(
                    lease = %key, error = %e,
                    "cannot confirm the expiry of a Lease: the guard is blind; its holder keeps its claim"
                );
                // Blind since the deadline the GET was to confirm.
                let since = self.store.leases.get(key).map_or(now, LeaseInfo::deadline);
                self.confirm_failing = Some(since);
            }
            self.last_error = Some(format!("confirming Lease {key}: {e}"));
        }
    }
}
