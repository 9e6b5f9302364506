//! The feed's failures by cause: each distinct cause is logged once, with
//! what to fix, until the whole feed is healthy again; a cause that needs a
//! fix on the guard's side is its problem (the daemon is not ready) while
//! any part of the feed fails with it.

use super::{
    cause::{Failure, Who},
    feed::Feed,
};
use crate::model::text::clip;

impl Feed {
    /// `who` failed: remember the cause while it lasts, and log it if it is
    /// new since the feed was last healthy (one line per distinct cause).
    pub(super) fn report(&mut self, who: Who, f: &Failure) {
        let text = clip(&f.text, super::objects::MAX_FIELD);
        let name = match who {
            Who::Stream(i) => self.name(i).to_owned(),
            Who::ApiCheck => "API check".into(),
            Who::Confirm => "lease confirmation".into(),
        };
        if self.logged.insert(f.cause) {
            let cause = f.cause.name();
            if f.cause.needs_fix() {
                tracing::error!(
                    cause, source = %name, error = %text, fix = f.cause.fix(),
                    "{}; keeping the last known ownership (IPs this node owns stay owned) until it is fixed",
                    f.cause.summary()
                );
            } else {
                tracing::warn!(
                    cause, source = %name, error = %text,
                    "{}; keeping the last known ownership for now",
                    f.cause.summary()
                );
            }
        } else if self.last_error.as_deref() != Some(format!("{name}: {text}").as_str()) {
            tracing::debug!(source = %name, error = %text, "feed still failing");
        }
        self.problems.insert(who, f.cause);
    }

    /// `who` answered; true if the whole feed is healthy again (the causes
    /// logged are forgotten, so a recurrence is logged again).
    pub(super) fn answered(&mut self, who: Who) -> bool {
        self.problems.remove(&who);
        let healthy = self.all_healthy();
        if healthy {
            self.logged.clear();
        }
        healthy
    }

    /// Why the guard cannot read the API for a reason of its own (credentials,
    /// trust), with what to fix; None while no such failure lasts.
    pub(crate) fn problem(&self) -> Option<String> {
        let cause = self
            .problems
            .values()
            .copied()
            .filter(|c| c.needs_fix())
            .min()?;
        Some(format!("{}: {}", cause.summary(), cause.fix()))
    }
}
