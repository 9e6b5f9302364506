//! The feed's state: the [`Store`] built from what each stream delivered
//! (`apply`: only the slim objects the decisions need, a relist buffered and
//! swapped in at its end), each stream's health, the objects it could not
//! decode (`undecodable`), and the confirmations of Leases that seem to
//! expire. Pure in time: every method takes `now`, so the rules are tested
//! without an API server (`task` runs it); what it counts goes into the
//! operation counters it is given.
//!
//! The guard must never take permission away because *it* is blind:
//! - A Lease that seems to expire (no renewal seen within its duration) is
//!   confirmed with a direct GET before it changes anything. A newer
//!   renewTime from the GET means the watch is stuck: it is rebuilt, and the
//!   owner keeps its permission all along. A failed GET means the guard is
//!   blind: the holder keeps its claim, marked uncertain (owned stays owned,
//!   foreign is judged unknown).
//! - A stream silent past its idle deadline (the server's watch timeout plus
//!   a margin) is stuck: it is relisted, and shows as failing.
//! - A stream is failing from its first error until it delivers again; an
//!   API check (a GET from the API server's cache) catches an API that went silent. Once the guard
//!   has been blind for longer than the staleness threshold, the view is
//!   `degraded` and every `foreign` IP is treated as `unknown`.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::{Duration, Instant},
};

use super::per_stream::{PerStream, StreamId};
use super::{
    cause::{Cause, Failure, Who},
    decode::Bad,
    objects::{self, LeaseFields},
    store::{Key, L2Status, ServiceInfo, Store},
    stream::{Msg, Stream},
    FeedConfig,
};
use crate::{
    model::cluster::{ClusterView, SharedOwners, StreamStatus},
    model::text::clip,
    ops::{ErrorCause, Ops, Rebuild},
};

/// Default server-side end of each watch (`--kube-watch-timeout`).
#[cfg(test)]
pub const WATCH_TIMEOUT: Duration = Duration::from_secs(55);
/// The staleness threshold taken from Lease durations stays within these.
pub const THRESHOLD_FLOOR: Duration = Duration::from_secs(15);
pub const THRESHOLD_CAP: Duration = Duration::from_secs(60);

/// What a relist has delivered so far, as the store takes it.
pub(super) enum Relist {
    Services(BTreeMap<Key, Read<ServiceInfo>>),
    Leases(BTreeMap<Key, Read<LeaseFields>>),
    L2(BTreeMap<Key, Read<L2Status>>),
}

/// One listed object: read, or not.
pub(super) enum Read<T> {
    Good(T),
    Bad(Bad),
}

/// The log budget for undecodable objects (which they are is each
/// stream's `unreadable`).
#[derive(Debug, Default)]
pub(crate) struct UndecodableLog {
    pub(super) logged: usize,
    pub(super) muted: bool,
}

/// One stream's health.
#[derive(Debug, Clone)]
pub(crate) struct Health {
    pub(super) synced: bool,
    pub(super) failing_since: Option<Instant>,
    pub(super) last_progress: Instant,
    pub(super) last_error: Option<String>,
}

/// One stream as the feed keeps it: what it watches, its name, the relist
/// in progress, its health and its objects that cannot be read now.
pub(crate) struct StreamState {
    pub(super) kind: Stream,
    /// Its name (logs, metrics, status).
    pub(super) name: String,
    pub(super) relist: Option<Relist>,
    pub(super) health: Health,
    /// The keys of its objects whose latest version could not be decoded.
    pub(super) unreadable: BTreeSet<Key>,
}

pub(crate) struct Feed {
    pub(super) cfg: FeedConfig,
    /// The streams, in the order the tasks and messages number them.
    pub(super) streams: PerStream<StreamState>,
    pub(super) store: Store,
    /// The API check: failing since, and when it last answered.
    pub(super) check_failing: Option<Instant>,
    check_ok: Instant,
    /// Leases whose absurd duration was logged (once each).
    pub(super) clamp_warned: BTreeSet<Key>,
    /// Confirming GETs: when the last one for a Lease was sent, and how many
    /// failed in a row.
    pub(super) confirm_sent: BTreeMap<Key, (Instant, u32)>,
    /// Confirming GETs failing since (the guard cannot confirm: blind).
    pub(super) confirm_failing: Option<Instant>,
    /// Streams to rebuild (relist), and why.
    pub(super) rebuild: BTreeMap<StreamId, Rebuild>,
    pub(super) last_error: Option<String>,
    /// Why each failing part fails, while it does.
    pub(super) problems: BTreeMap<Who, Cause>,
    /// The claims handed to the daemon, and their version.
    owners: SharedOwners,
    owners_version: u64,
    /// Causes logged since the feed was last healthy (each once).
    pub(super) logged: BTreeSet<Cause>,
    /// How many undecodable objects were logged.
    pub(super) bad_log: UndecodableLog,
    /// Streams that did not take in a new object under memory pressure:
    /// relisted once it is gone.
    pub(super) not_admitted: BTreeSet<StreamId>,
    /// What the last published view showed.
    shown: Option<Shown>,
    /// The daemon's operation counters (events, errors, rebuilds).
    pub(super) ops: Arc<Ops>,
}

/// What a published view is compared by: what the daemon acts on or shows,
/// cheap to build (an event that changes none of it publishes nothing).
#[derive(Debug, PartialEq)]
struct Shown {
    owners_version: u64,
    synced: bool,
    degraded: bool,
    holders_version: u64,
    /// Each stream's status but its name (which never changes): built for
    /// every event, so without a string copied unless one is failing.
    streams: Vec<(bool, bool, Option<String>, usize)>,
    unconfirmed: usize,
    blind: bool,
    threshold: Duration,
    problem: Option<String>,
}

impl Feed {
    pub(crate) fn new(cfg: FeedConfig, now: Instant, ops: Arc<Ops>) -> Self {
        let streams = (Stream::all_for(&cfg.announcers).into_iter())
            .map(|kind| StreamState {
                name: kind.name(),
                kind,
                relist: None,
                health: Health {
                    synced: false,
                    failing_since: None,
                    last_progress: now,
                    last_error: None,
                },
                unreadable: BTreeSet::new(),
            })
            .collect();
        let streams = PerStream::new(streams);
        let store = Store::new(cfg.announcers.clone()).settling(cfg.settle_shared);
        Feed {
            cfg,
            bad_log: UndecodableLog::default(),
            not_admitted: BTreeSet::new(),
            shown: None,
            streams,
            store,
            check_failing: None,
            check_ok: now,
            clamp_warned: BTreeSet::new(),
            confirm_sent: BTreeMap::new(),
            confirm_failing: None,
            rebuild: BTreeMap::new(),
            last_error: None,
            problems: BTreeMap::new(),
            logged: BTreeSet::new(),
            owners: SharedOwners::default(),
            owners_version: 0,
            ops,
        }
    }

    pub(crate) fn name(&self, stream: StreamId) -> &str {
        self.streams
            .get(stream)
            .map_or("API check", |s| s.name.as_str())
    }

    pub(super) fn lease_stream(&self) -> Option<StreamId> {
        (self.streams.enumerate()).find_map(|(id, s)| (s.kind == Stream::Leases).then_some(id))
    }

    /// Record a Lease the API told us about; log an absurd duration once.
    pub(super) fn upsert_lease(&mut self, key: Key, f: objects::LeaseFields, now: Instant) -> bool {
        if let Some(v) = f.clamped {
            if self.clamp_warned.insert(key.clone()) {
                tracing::warn!(
                    lease = %key, lease_duration_seconds = v, used = ?f.duration,
                    "absurd leaseDurationSeconds; the guard uses a sane duration instead"
                );
            }
        }
        self.store
            .upsert_lease(key, f.holder, f.duration, f.renew, now)
    }

    /// The staleness threshold: `--stale-after`, else the longest duration
    /// of the Leases in use within [15 s, 60 s] (one absurd Lease must not
    /// switch degradation off).
    pub(crate) fn threshold(&self) -> Duration {
        self.cfg.stale_after.unwrap_or_else(|| {
            self.store
                .max_lease_duration()
                .unwrap_or_default()
                .clamp(THRESHOLD_FLOOR, THRESHOLD_CAP)
        })
    }

    /// Since when the guard has been blind: a failing stream or API check, or a
    /// Lease in use past its deadline that the API has not confirmed.
    pub(crate) fn failing_since(&self, now: Instant) -> Option<Instant> {
        let streams = self.streams.iter().filter_map(|s| s.health.failing_since);
        let leases = self
            .store
            .unconfirmed(now)
            .into_iter()
            .map(|(_, since)| since);
        streams
            .chain(self.check_failing)
            .chain(self.confirm_failing)
            .chain(leases)
            .min()
    }

    fn degraded(&self, now: Instant) -> bool {
        self.failing_since(now)
            .is_some_and(|t| now.duration_since(t) >= self.threshold())
    }

    fn synced(&self) -> bool {
        self.streams.iter().all(|s| s.health.synced)
    }

    /// Bring the claims handed to the daemon to `now`: the IPs whose claim
    /// changed are written into the shared table and marked changed. Nothing
    /// is handed over before every stream has listed.
    fn publish_owners(&mut self, now: Instant) {
        if !self.synced() {
            return;
        }
        let changed = self.store.refresh(now);
        if changed.is_empty() {
            return;
        }
        let mut t = self.owners.lock();
        for ip in &changed {
            match self.store.claims().get(ip) {
                Some(c) => t.owners.insert(*ip, c.clone()),
                None => t.owners.remove(ip),
            };
        }
        t.record(changed);
        self.owners_version = t.version;
    }

    fn stream_statuses(&self) -> Vec<StreamStatus> {
        (self.streams.iter())
            .map(|s| StreamStatus {
                name: s.name.clone(),
                synced: s.health.synced,
                healthy: s.health.failing_since.is_none(),
                error: s.health.failing_since.and(s.health.last_error.clone()),
                undecodable: s.unreadable.len(),
            })
            .collect()
    }

    fn shown(&self, now: Instant) -> Shown {
        Shown {
            owners_version: self.owners_version,
            synced: self.synced(),
            degraded: self.degraded(now),
            holders_version: self.store.holders_version(),
            streams: (self.streams.iter())
                .map(|s| {
                    let h = &s.health;
                    let error = h.failing_since.and(h.last_error.clone());
                    (
                        h.synced,
                        h.failing_since.is_none(),
                        error,
                        s.unreadable.len(),
                    )
                })
                .collect(),
            unconfirmed: self.store.unconfirmed(now).len(),
            blind: self.failing_since(now).is_some(),
            threshold: self.threshold(),
            problem: self.problem(),
        }
    }

    /// The view now, with the claims brought up to date first (tests; the
    /// feed publishes through `changed_view`).
    #[cfg(test)]
    pub(crate) fn view(&mut self, now: Instant, event_at: Option<Instant>) -> ClusterView {
        self.publish_owners(now);
        self.published(now, event_at)
    }

    /// The view of the claims as last published (one publish per view).
    fn published(&self, now: Instant, event_at: Option<Instant>) -> ClusterView {
        let synced = self.synced();
        ClusterView {
            owners: self.owners.clone(),
            owners_version: self.owners_version,
            synced,
            degraded: self.degraded(now),
            holders: self
                .store
                .named_nodes()
                .into_iter()
                .map(str::to_owned)
                .collect(),
            event_at,
            failing_since: self.failing_since(now),
            streams: self.stream_statuses(),
            unconfirmed: self.store.unconfirmed(now).len(),
            threshold: self.threshold(),
            problem: self.problem(),
        }
    }

    /// The view, if it differs from the last one this returned in what the
    /// daemon acts on or shows (most events, a Lease renewal above all,
    /// change none of it: nothing is built for them).
    pub(crate) fn changed_view(
        &mut self,
        now: Instant,
        event_at: Option<Instant>,
    ) -> Option<ClusterView> {
        self.publish_owners(now);
        let shown = self.shown(now);
        if self.shown.as_ref() == Some(&shown) {
            return None;
        }
        self.shown = Some(shown);
        Some(self.published(now, event_at))
    }

    /// The last sign that the API answers: a stream's progress or the
    /// API check's answer.
    pub(crate) fn last_alive(&self) -> Instant {
        (self.streams.iter().map(|s| s.health.last_progress)).fold(self.check_ok, Instant::max)
    }

    pub(crate) fn all_healthy(&self) -> bool {
        self.check_failing.is_none()
            && self.confirm_failing.is_none()
            && self
                .streams
                .iter()
                .all(|s| s.health.failing_since.is_none())
    }

    /// The API answered for `stream` (or the API check).
    pub(crate) fn ok(&mut self, stream: Option<StreamId>, now: Instant) {
        let (was, who) = match stream {
            Some(i) => {
                let h = &mut self.streams[i].health;
                h.last_progress = now;
                (h.failing_since.take().is_some(), Who::Stream(i))
            }
            None => {
                self.check_ok = now;
                (self.check_failing.take().is_some(), Who::ApiCheck)
            }
        };
        if self.answered(who) && was {
            tracing::info!("Kubernetes API feed healthy again");
        }
    }

    /// `stream` (or the API check) failed; it has been failing since `since`.
    pub(crate) fn failed(&mut self, stream: Option<StreamId>, f: &Failure, since: Instant) {
        let who = stream.map_or(Who::ApiCheck, Who::Stream);
        self.report(who, f);
        // Errors carry text from the API server: kept and logged short.
        let e = clip(&f.text, super::objects::MAX_FIELD);
        let name = stream.map_or("API check", |s| self.name(s)).to_owned();
        match stream {
            Some(i) => {
                let h = &mut self.streams[i].health;
                h.failing_since.get_or_insert(since);
                h.last_error = Some(e.clone());
            }
            None => {
                self.check_failing.get_or_insert(since);
            }
        }
        self.last_error = Some(format!("{name}: {e}"));
    }

    pub(crate) fn on_msg(&mut self, stream: StreamId, msg: Msg, now: Instant) {
        match msg {
            Msg::Update(u) => {
                self.ops.feed_event(self.name(stream));
                self.ok(Some(stream), now);
                self.apply(stream, u, now);
            }
            Msg::Progress => self.ok(Some(stream), now),
            Msg::Failed(f) => {
                self.ops.error(ErrorCause::KubernetesFeed);
                self.failed(Some(stream), &f, now);
            }
            Msg::Silent(f, silent) => {
                self.ops.error(ErrorCause::KubernetesFeed);
                // Blind since the connection last carried anything (the
                // kernel waited that long), not since now.
                let last = self.streams[stream].health.last_progress;
                let since = now.checked_sub(silent).map_or(last, |t| t.max(last));
                self.failed(Some(stream), &f, since);
            }
            Msg::Idle(idle) => {
                let name = self.name(stream).to_owned();
                // Blind since the last thing it delivered, not since now.
                let since = self.streams[stream].health.last_progress;
                tracing::warn!(
                    stream = %name, silent_for = ?idle,
                    "Kubernetes watch stream stuck: no event, bookmark or end of watch within its deadline; relisting"
                );
                self.ops.feed_rebuild(&name, Rebuild::Idle);
                let e =
                    format!("no event, bookmark or end of watch within {idle:?}: stuck, relisting");
                self.failed(Some(stream), &Failure::new(Cause::Other, e), since);
            }
        }
    }

    pub(crate) fn take_rebuilds(&mut self) -> BTreeMap<StreamId, Rebuild> {
        if !self.not_admitted.is_empty() && !self.ops.under_memory_pressure() {
            tracing::info!("memory back under the limit: relisting the streams that did not take in new objects");
            for s in std::mem::take(&mut self.not_admitted) {
                self.rebuild.entry(s).or_insert(Rebuild::Memory);
            }
        }
        std::mem::take(&mut self.rebuild)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{
        decode::{Lease, Obj, Seconds, Service},
        pace::IDLE_MARGIN,
        stream::{Event, Update},
    };
    use super::*;
    use std::net::IpAddr;

    use super::super::fixtures::svc;

    fn lease_json(holder: &str, renew: &str) -> Lease {
        super::super::fixtures::lease(holder, renew, 10)
    }

    fn feed(t0: Instant) -> Feed {
        Feed::new(FeedConfig::cilium(WATCH_TIMEOUT), t0, Default::default())
    }

    /// A relist of the Services stream with `services`.
    fn list_services(f: &mut Feed, t: Instant, services: Vec<Service>) {
        use Event::*;
        f.apply(StreamId::nth(0), Update::Svc(Box::new(Listing)), t);
        for s in services {
            f.apply(
                StreamId::nth(0),
                Update::Svc(Box::new(Listed(Obj::Good(s)))),
                t,
            );
        }
        f.apply(StreamId::nth(0), Update::Svc(Box::new(ListDone)), t);
    }

    fn list(f: &mut Feed, t: Instant, lease: Lease) {
        use Event::{ListDone, Listed, Listing};
        list_services(f, t, vec![svc()]);
        f.apply(StreamId::nth(1), Update::Lease(Box::new(Listing)), t);
        f.apply(
            StreamId::nth(1),
            Update::Lease(Box::new(Listed(Obj::Good(lease)))),
            t,
        );
        f.apply(StreamId::nth(1), Update::Lease(Box::new(ListDone)), t);
    }

    /// The renewTime of the Lease as first listed.
    const RENEWED: &str = "2026-11-30T10:00:00.000000Z";

    /// A feed at `t0` that has listed `svc()` and a Lease held by node-a.
    fn synced(t0: Instant) -> Feed {
        let mut f = feed(t0);
        list(&mut f, t0, lease_json("node-a", RENEWED));
        f
    }

    fn secs(t0: Instant, s: u64) -> Instant {
        t0 + Duration::from_secs(s)
    }

    fn key() -> Key {
        Key::new(KEY.0, KEY.1)
    }

    fn node_a(certain: bool) -> (Option<String>, bool) {
        (Some("node-a".into()), certain)
    }

    const IP: &str = "198.51.100.10";
    const KEY: (&str, &str) = ("kube-system", "cilium-l2announce-default-web");

    fn owner(f: &mut Feed, t: Instant) -> (Option<String>, bool) {
        let c = &f.view(t, None).owners.snapshot()[&IP.parse::<IpAddr>().unwrap()];
        (c.owner.as_deref().map(str::to_owned), c.certain)
    }

    #[test]
    fn a_relist_does_not_extend_a_lease_nobody_renews() {
        let t0 = Instant::now();
        let mut f = feed(t0);
        assert!(
            f.view(t0, None).owners.snapshot().is_empty(),
            "nothing before the first sync"
        );
        list(&mut f, t0, lease_json("node-a", RENEWED));
        assert_eq!(owner(&mut f, t0), node_a(true));
        // A relist 8 s later with the same renewTime keeps the first observation...
        let t8 = secs(t0, 8);
        list(&mut f, t8, lease_json("node-a", RENEWED));
        // ...so at 11 s the lease is past its deadline (10 s after it was
        // first seen); the API was last heard at 8 s: not confirmed yet.
        let t11 = secs(t0, 11);
        assert_eq!(owner(&mut f, t11), node_a(false));
        assert_eq!(f.due_confirmations(t11, 0), vec![key()]);
        assert!(f.due_confirmations(t11, 0).is_empty(), "one GET at a time");
        // The GET shows the same renewTime: expiry confirmed, no owner.
        f.on_confirm(
            key(),
            t11,
            Ok(Some(Obj::Good(lease_json("node-a", RENEWED)))),
            t11,
        );
        assert_eq!(owner(&mut f, t11), (None, true));
        assert!(f.take_rebuilds().is_empty(), "not a stuck stream");
        // ...and a renewal seen in a relist counts as one.
        let t12 = secs(t0, 12);
        list(
            &mut f,
            t12,
            lease_json("node-a", "2026-11-30T10:00:12.000000Z"),
        );
        assert_eq!(owner(&mut f, t12 + Duration::from_secs(1)), node_a(true));
    }

    /// The watch misses renewals (stuck half-way through a chunk): the
    /// lease seems to expire, the GET shows a newer renewTime, the holder
    /// keeps its claim throughout and the stream is rebuilt.
    #[test]
    fn a_stuck_watch_never_takes_the_owner_away() {
        let t0 = Instant::now();
        let mut f = synced(t0);
        let t10 = secs(t0, 10);
        assert_eq!(owner(&mut f, t10), node_a(false), "held, uncertain");
        assert_eq!(f.due_confirmations(t10, 0).len(), 1);
        f.on_confirm(
            key(),
            t10,
            Ok(Some(Obj::Good(lease_json(
                "node-a",
                "2026-11-30T10:00:09.000000Z",
            )))),
            t10,
        );
        assert_eq!(owner(&mut f, t10), node_a(true), "renewed: certain again");
        assert_eq!(
            f.take_rebuilds().into_keys().collect::<Vec<_>>(),
            vec![StreamId::nth(1)]
        );
        let v = f.view(t10, None);
        assert!(!v.streams[1].healthy, "the stuck stream shows as failing");
        // Blind since its last progress (t0), so past the 15 s floor it degrades.
        assert!(f.view(secs(t0, 15), None).degraded);
        // A failed GET: the holder keeps its (uncertain) claim, blind since the deadline.
        let mut g = synced(t0);
        let t11 = secs(t0, 11);
        assert_eq!(g.due_confirmations(t11, 0).len(), 1);
        let forbidden = Failure::new(Cause::Forbidden, "403 Forbidden");
        g.on_confirm(key(), t11, Err(forbidden), t11);
        assert_eq!(owner(&mut g, t11), node_a(false));
        assert_eq!(g.view(t11, None).failing_since, Some(t10));
        assert!(!g.view(secs(t0, 24), None).degraded);
        assert!(g.view(secs(t0, 25), None).degraded);
        assert_eq!(owner(&mut g, secs(t0, 300)), node_a(false));
    }

    /// A GET's answer that the watch has overtaken is old news: it neither
    /// expires a Lease that was renewed meanwhile nor removes one that was
    /// re-created, nor revives one the watch deleted.
    #[test]
    fn an_overtaken_confirmation_is_ignored() {
        use Event::*;
        let t0 = Instant::now();
        let mut f = synced(t0);
        let (t10, t11, t12) = (secs(t0, 10), secs(t0, 11), secs(t0, 12));
        assert_eq!(f.due_confirmations(t10, 0).len(), 1);
        // The watch delivers a renewal after the GET went out...
        f.apply(
            StreamId::nth(1),
            Update::Lease(Box::new(Apply(Obj::Good(lease_json(
                "node-a",
                "2026-11-30T10:00:11.000000Z",
            ))))),
            t11,
        );
        // ...then the GET's answer, from before it, arrives: ignored.
        let old = Ok(Some(Obj::Good(lease_json("node-a", RENEWED))));
        f.on_confirm(key(), t10, old, t12);
        assert_eq!(owner(&mut f, t12), node_a(true));
        assert!(f.take_rebuilds().is_empty(), "no false alarm");
        f.on_confirm(key(), t10, Ok(None), t12);
        assert_eq!(owner(&mut f, t12), node_a(true), "not removed");
        // Deleted by the watch after the GET went out: not revived.
        f.apply(
            StreamId::nth(1),
            Update::Lease(Box::new(Delete(Obj::Good(lease_json(
                "node-a",
                "2026-11-30T10:00:11.000000Z",
            ))))),
            t12,
        );
        let renewed = Ok(Some(Obj::Good(lease_json(
            "node-a",
            "2026-11-30T10:00:12.000000Z",
        ))));
        f.on_confirm(key(), t11, renewed, t12);
        assert!(f.store.leases.is_empty());
    }

    #[test]
    fn a_relist_swaps_in_whole_and_only_at_its_end() {
        use Event::*;
        let t0 = Instant::now();
        let mut f = synced(t0);
        let ips = |f: &mut Feed| -> Vec<String> {
            let v = f.view(t0, None);
            v.owners
                .snapshot()
                .keys()
                .map(ToString::to_string)
                .collect()
        };
        assert_eq!(ips(&mut f), ["198.51.100.10"]);
        // A relist after an outage: "web" was deleted meanwhile, "api" added.
        let api: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "api", "namespace": "default"},
            "spec": {"type": "LoadBalancer"},
            "status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.20"}]}}
        }))
        .unwrap();
        f.apply(StreamId::nth(0), Update::Svc(Box::new(Listing)), t0);
        f.apply(
            StreamId::nth(0),
            Update::Svc(Box::new(Listed(Obj::Good(api)))),
            t0,
        );
        // Half-way through, the last known state holds (nothing vanishes
        // because a list is in progress).
        assert_eq!(ips(&mut f), ["198.51.100.10"]);
        f.apply(StreamId::nth(0), Update::Svc(Box::new(ListDone)), t0);
        assert_eq!(ips(&mut f), ["198.51.100.20"]);
    }

    #[test]
    fn claims_wait_for_every_stream() {
        let t0 = Instant::now();
        let mut f = feed(t0);
        list_services(&mut f, t0, vec![svc()]);
        let v = f.view(t0, None);
        assert!(
            !v.synced && v.owners.snapshot().is_empty(),
            "Leases not listed yet"
        );
    }

    #[test]
    fn degrades_after_the_threshold_and_recovers_per_stream() {
        let t0 = Instant::now();
        let mut f = synced(t0);
        f.failed(
            Some(StreamId::nth(1)),
            &Failure::new(Cause::Unreachable, "refused"),
            t0,
        );
        assert!(!f.view(secs(t0, 14), None).degraded);
        assert!(f.view(secs(t0, 15), None).degraded, "15 s floor");
        // The API check answering does not vouch for the lease stream.
        f.ok(None, t0);
        assert!(f.view(secs(t0, 16), None).degraded);
        f.ok(Some(StreamId::nth(1)), t0);
        // Streams healthy; the lease, past its deadline (10 s) and not yet
        // confirmed, has kept the guard blind for 6 s only.
        let v = f.view(secs(t0, 16), None);
        assert!(!v.degraded && v.unconfirmed == 1);
    }

    #[test]
    fn an_idle_stream_is_failing_since_its_last_progress() {
        let t0 = Instant::now();
        let mut f = synced(t0);
        let t = t0 + WATCH_TIMEOUT + IDLE_MARGIN;
        f.on_msg(StreamId::nth(0), Msg::Idle(WATCH_TIMEOUT + IDLE_MARGIN), t);
        let v = f.view(t, None);
        assert!(!v.streams[0].healthy);
        assert!(v.streams[0].error.as_deref().unwrap().contains("stuck"));
        assert_eq!(f.streams[StreamId::nth(0)].health.failing_since, Some(t0));
        assert!(v.degraded, "blind for longer than the threshold");
        f.on_msg(StreamId::nth(0), Msg::Progress, t);
        assert!(f.view(t, None).streams[0].healthy);
    }

    /// What the feed counts goes into the counters it was given (no global):
    /// a watch event, a failure, a relist of a stuck stream.
    #[test]
    fn the_feed_counts_into_the_counters_it_is_given() {
        let t0 = Instant::now();
        let mut f = synced(t0);
        let ops = f.ops.clone();
        f.on_msg(
            StreamId::nth(0),
            Msg::Failed(Failure::new(Cause::Server, "500")),
            t0,
        );
        f.on_msg(StreamId::nth(0), Msg::Idle(WATCH_TIMEOUT + IDLE_MARGIN), t0);
        let errors = ops.errors.lock().unwrap().clone();
        assert_eq!(errors.get(&ErrorCause::KubernetesFeed), Some(&1));
        let rebuilds = ops.feed_rebuilds.lock().unwrap().clone();
        let name = f.name(StreamId::nth(0)).to_owned();
        assert_eq!(rebuilds.get(&(name, Rebuild::Idle)), Some(&1));
        assert_eq!(Rebuild::Idle.as_str(), "idle");
    }

    /// A cause that needs a fix on this side is the feed's problem while any
    /// part fails with it (the daemon is not ready meanwhile); each distinct
    /// cause is logged once until the whole feed is healthy again.
    #[test]
    fn causes_are_logged_once_and_the_problem_lasts_while_they_do() {
        let t0 = Instant::now();
        let mut f = synced(t0);
        let unauthorized = Failure::new(Cause::Unauthorized, "list: 401");
        f.failed(Some(StreamId::nth(0)), &unauthorized, t0);
        f.failed(None, &unauthorized, t0);
        f.failed(Some(StreamId::nth(1)), &unauthorized, t0);
        assert_eq!(
            f.logged.iter().copied().collect::<Vec<_>>(),
            [Cause::Unauthorized]
        );
        let p = f.view(t0, None).problem.unwrap();
        assert!(p.contains("401 Unauthorized") && p.contains("token"), "{p}");
        // Another cause on top: logged as well; the one needing a fix stays the problem.
        f.failed(None, &Failure::new(Cause::Unreachable, "refused"), t0);
        assert_eq!(f.logged.len(), 2);
        assert!(f.problem().unwrap().contains("401"));
        // Part of the feed answers: still failing, still a problem.
        f.ok(Some(StreamId::nth(0)), t0);
        f.ok(None, t0);
        assert!(f.problem().unwrap().contains("401"));
        assert_eq!(
            f.logged.len(),
            2,
            "not forgotten before the feed is healthy"
        );
        // A 403 replaces the 401 on the Lease stream.
        f.failed(
            Some(StreamId::nth(1)),
            &Failure::new(Cause::Forbidden, "watch: 403"),
            t0,
        );
        assert!(f.problem().unwrap().contains("403 Forbidden"));
        f.ok(Some(StreamId::nth(1)), t0);
        assert_eq!(f.view(t0, None).problem, None);
        assert!(f.logged.is_empty(), "healthy: a recurrence is logged again");
        // Causes waited out are no problem of the guard's own.
        f.failed(
            Some(StreamId::nth(0)),
            &Failure::new(Cause::Server, "500"),
            t0,
        );
        assert_eq!(f.problem(), None);
    }

    /// A confirming GET fails (403), then the watch shows the Lease renewed:
    /// nothing is left to confirm, so the guard sees again and its problem
    /// is gone (it does not stay blind, and not ready, until some later
    /// expiry happens to be confirmed).
    #[test]
    fn a_failed_confirmation_is_moot_once_the_watch_shows_the_renewal() {
        use Event::Apply;
        let t0 = Instant::now();
        let mut f = synced(t0);
        let (t10, t11, t12) = (secs(t0, 10), secs(t0, 11), secs(t0, 12));
        assert_eq!(f.due_confirmations(t10, 0).len(), 1);
        let forbidden = Failure::new(Cause::Forbidden, "get: 403");
        f.on_confirm(key(), t10, Err(forbidden), t11);
        assert!(f.view(t11, None).problem.unwrap().contains("403"));
        assert!(f.due_confirmations(t11, 0).is_empty(), "backing off");
        assert_eq!(f.view(t11, None).failing_since, Some(t10));
        let renewed = lease_json("node-a", "2026-11-30T10:00:12.000000Z");
        f.apply(
            StreamId::nth(1),
            Update::Lease(Box::new(Apply(Obj::Good(renewed)))),
            t12,
        );
        assert!(f.due_confirmations(t12, 0).is_empty());
        let v = f.view(t12, None);
        assert_eq!((v.failing_since, v.problem), (None, None));
        assert!(f.confirm_sent.is_empty());
    }

    /// One Lease with an absurd duration cannot switch degradation off: the
    /// threshold stays within [15 s, 60 s].
    #[test]
    fn the_threshold_is_capped() {
        let t0 = Instant::now();
        let mut f = feed(t0);
        let mut l = lease_json("node-a", RENEWED);
        l.spec.as_mut().unwrap().lease_duration_seconds = Some(Seconds(2147483647));
        list(&mut f, t0, l);
        assert_eq!(f.threshold(), THRESHOLD_CAP);
        f.failed(
            Some(StreamId::nth(0)),
            &Failure::new(Cause::Server, "500"),
            t0,
        );
        assert!(!f.view(secs(t0, 59), None).degraded);
        assert!(f.view(secs(t0, 60), None).degraded);
    }
}
