//! What the two watches of presence deliver, applied to the table: the
//! presence records (this guard's own among them: what the API holds of
//! it) and the guard Pods' readiness (who is live).

use super::{
    follow::Step,
    objects::{self, Pod},
    Call, PresenceError, Task,
};
use crate::{
    model::presence::GuardPods,
    ops::ErrorCause,
    sources::cluster::decode::{Lease, Obj},
};

impl Task {
    /// A step of the records' watch.
    pub(super) fn on_record(&mut self, s: Step<Lease>) {
        match s {
            Step::Listed(items) => {
                self.table.nodes.clear();
                self.table.bad.clear();
                self.own.stored = None;
                self.own.rv = None;
                for o in items {
                    self.apply_record(o);
                }
                self.records_listed = true;
                self.outcome(Call::Records, Ok(()));
            }
            Step::Apply(o) => {
                self.apply_record(o);
                self.outcome(Call::Records, Ok(()));
            }
            Step::Delete(o) => {
                self.outcome(Call::Records, Ok(()));
                if let Some((_, name)) = o.names() {
                    self.table.remove(name);
                    if name == self.own.lease {
                        (self.own.stored, self.own.rv) = (None, None);
                    }
                }
            }
            Step::Progress => self.outcome(Call::Records, Ok(())),
            Step::Failed(e) => self.outcome(Call::Records, Err(PresenceError::Stream(e.text))),
        }
        self.progress();
    }

    fn apply_record(&mut self, o: Obj<Lease>) {
        let Some((_, name)) = o.names() else { return };
        let name = name.to_owned();
        let read = match &o {
            Obj::Good(l) => objects::entry(l),
            Obj::Bad(b) => Err(format!("{name}: {}", b.error)),
        };
        if name == self.own.lease {
            self.own.rv = o.resource_version().map(str::to_owned);
            self.own.stored = read.as_ref().ok().map(|e| e.record.clone());
        }
        match read {
            Ok(e) => {
                self.table.insert(&name, e);
            }
            Err(why) => {
                self.ops.error(ErrorCause::PresenceSkipped);
                tracing::debug!(why = %why, "presence: a Lease skipped");
                self.table.reject(&name, why);
            }
        }
    }

    /// A step of the Pods' watch.
    pub(super) fn on_pod(&mut self, s: Step<Pod>) {
        match s {
            Step::Listed(items) => {
                self.pods = GuardPods::default();
                for o in items {
                    self.apply_pod(o);
                }
                self.pods_listed = true;
                self.pods_refused = false;
                self.outcome(Call::Pods, Ok(()));
            }
            Step::Apply(o) => {
                self.apply_pod(o);
                self.outcome(Call::Pods, Ok(()));
            }
            Step::Delete(o) => {
                if let Some((_, name)) = o.names() {
                    self.pods.remove(name);
                }
                self.outcome(Call::Pods, Ok(()));
            }
            Step::Progress => self.outcome(Call::Pods, Ok(())),
            Step::Failed(e) => {
                self.pods_refused = matches!(e.code, Some(401 | 403));
                self.outcome(Call::Pods, Err(PresenceError::Stream(e.text)));
            }
        }
        self.table.ready = self.pods_usable().then(|| self.pods.ready_nodes());
        self.progress();
    }

    /// Whether the Pods can say who is live: listed, allowed, and one of
    /// them on this node (this guard runs, so its Pod exists: none means
    /// `--presence-pods` selects no guard Pod, or the guard runs outside
    /// Kubernetes). Otherwise every record counts as live, and `/cluster`
    /// says why: a wrong selector must not make every guard dead.
    fn pods_usable(&mut self) -> bool {
        if !self.pods_listed || self.pods_refused {
            return false;
        }
        let mine = (self.pods.pods.values()).any(|p| p.node == self.cfg.node);
        if !mine {
            let why = format!(
                "no Pod matching --presence-pods {:?} runs on this node ({}): liveness is read from the records alone",
                self.cfg.pods, self.cfg.node
            );
            // Said once (until a Pod of this node shows up), shown always.
            if !std::mem::replace(&mut self.no_own_pod_said, true) {
                tracing::warn!(error = %why, "presence: the guard Pods cannot tell who is live");
            }
            self.seen.errors.insert("pods".into(), why);
        } else {
            self.no_own_pod_said = false;
        }
        mine
    }

    fn apply_pod(&mut self, o: Obj<Pod>) {
        let Some((_, name)) = o.names() else { return };
        match &o {
            Obj::Good(p) => match p.guard() {
                Some(g) => {
                    self.pods.apply(name, g);
                }
                None => self.pods.remove(name),
            },
            // A Pod that does not read is not known to be Ready.
            Obj::Bad(_) => self.pods.remove(name),
        }
    }
}
