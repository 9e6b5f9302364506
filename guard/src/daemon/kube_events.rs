//! Kubernetes Events on the Service of an LB IP: what the daemon finds
//! (its `/events` lines: conflicts, split-brain speakers, silent takeovers,
//! stale clients) told where operators look, `kubectl describe svc`.
//!
//! The reader takes the lines from the daemon's event channel, judges them
//! (`model::kube_events`) against what the main loop published about the
//! IP (its Service, whether it is owned here), and hands what is due under
//! the rate limits to the publisher, a task of its own that writes through
//! kube-runtime's recorder (events.k8s.io/v1; a repeat within its cache is
//! a series update of the same Event, a PATCH). Nothing here can slow the
//! guard: the queue between them is bounded and a full one drops, every
//! request is bounded in time, and failures are counted and logged.

use guard_wire::api::SplitElection;
use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    net::IpAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::{ObjectReference, Service};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::{broadcast, mpsc};

use super::config::KubeEventsConfig;
use crate::{
    api::Shared,
    model::kube_events::{
        event_for,
        kernel::{answers_now, explicable, nodes_answer, silenced},
        link::LinkEpisodes,
        parse, split, Finding, IpFacts, Limiter, Memory, Occurrence, Offered, Reason, StreamKey,
        Thresholds,
    },
    ops::{EventOutcome, Ops},
};

/// A request to the API (a GET of the Service, a POST or PATCH of the
/// Event) gives up after this long.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Events waiting for the publisher; more are dropped (counted).
const QUEUE: usize = 64;
/// Service UIDs kept (kubectl finds a Service's Events by its UID).
const MAX_UIDS: usize = 4096;
/// How often the owner looks for other nodes' kernels answering for its IPs
/// (the records are renewed every --presence-period).
const KERNELS_EVERY: Duration = Duration::from_secs(5);
/// Conflicts waiting for their review; more are judged at once.
const MAX_WAITING: usize = 1024;

/// Start the reader and the publisher (the API client is built on the
/// publisher's task: a configuration that cannot be read is logged once,
/// and the guard goes on without Events).
pub(super) fn spawn(
    cfg: KubeEventsConfig,
    kubeconfig: Option<std::path::PathBuf>,
    node: String,
    shared: Arc<Shared>,
    silent_after: Duration,
) {
    let (tx, rx) = mpsc::channel(QUEUE);
    let (done_tx, done) = mpsc::channel(QUEUE);
    tokio::spawn(publish(
        kubeconfig,
        node.clone(),
        rx,
        done_tx,
        shared.ops.clone(),
    ));
    let events = shared.events.subscribe();
    tokio::spawn(read(cfg, node, shared, silent_after, events, tx, done));
}

/// One Event to publish.
struct Job {
    stream: StreamKey,
    occurrence: Occurrence,
}

/// Judge every line, publish what is due.
async fn read(
    cfg: KubeEventsConfig,
    node: String,
    shared: Arc<Shared>,
    silent_after: Duration,
    mut events: broadcast::Receiver<String>,
    tx: mpsc::Sender<Job>,
    mut done: mpsc::Receiver<(StreamKey, EventOutcome)>,
) {
    let mut r = Reader {
        thresholds: Thresholds {
            split_brain_after: cfg.split_brain_after,
            stale_clients: cfg.stale_clients,
            silent_after,
        },
        limiter: Limiter::new(cfg.limits, Instant::now()),
        memory: Memory::default(),
        review: cfg.review,
        waiting: VecDeque::new(),
        node,
        shared,
        splits: BTreeMap::new(),
        link: LinkEpisodes::default(),
    };
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut kernels = tokio::time::interval(KERNELS_EVERY);
    loop {
        tokio::select! {
            line = events.recv() => match line {
                Ok(line) => {
                    if let Some(f) = parse(&line) {
                        r.finding(f);
                    }
                }
                // Lines missed while this task was behind: nothing to do
                // but go on (the findings repeat while they last).
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return,
            },
            _ = tick.tick() => {
                r.tick();
                r.link();
            }
            _ = kernels.tick() => {
                for (service, o) in answering_kernels(&r.node, &r.shared) {
                    r.offer(service, o);
                }
                r.splits();
            }
            Some(((service, reason), outcome)) = done.recv() => {
                // A link-down Event that did not go (the link was the way
                // to the API too) is told again when a link returns; its
                // end goes once it went.
                if reason == Reason::OwnerLinkDown {
                    let next = r.link.outcome(&service, outcome == EventOutcome::Published);
                    r.offer_all(next);
                }
            }
        }
        for (stream, occurrence) in r.limiter.due(Instant::now()) {
            let reason = occurrence.reason;
            let service = stream.0.clone();
            if tx.try_send(Job { stream, occurrence }).is_err() {
                r.dropped(service, reason);
            }
        }
    }
}

/// The reader's state.
struct Reader {
    thresholds: Thresholds,
    limiter: Limiter,
    memory: Memory,
    /// How long a conflict waits before it is judged (see [`explicable`]).
    review: Duration,
    waiting: VecDeque<(Instant, Finding)>,
    node: String,
    shared: Arc<Shared>,
    /// Split elections this node told, by IP: the Services told (each gets
    /// the end's Event).
    splits: BTreeMap<IpAddr, Vec<String>>,
    /// What this node told of its own lost carrier, and still owes.
    link: LinkEpisodes,
}

impl Reader {
    /// A finding: judged now, or, when nodes whose kernels answer may
    /// explain it and their presence records may not say so yet, after
    /// `review`.
    fn finding(&mut self, f: Finding) {
        if explicable(&f) && !self.review.is_zero() {
            if self.waiting.len() < MAX_WAITING {
                self.waiting.push_back((Instant::now(), f));
            }
            return;
        }
        self.judge(&f);
    }

    fn judge(&mut self, f: &Finding) {
        let t = &self.thresholds;
        if let Some((service, o)) = occurrence(f, &self.node, &self.shared, t, &mut self.memory) {
            self.offer(service, o);
        }
    }

    fn offer(&mut self, service: String, o: Occurrence) {
        let reason = o.reason;
        if self.limiter.offer((service.clone(), reason), o) == Offered::Dropped {
            self.dropped(service, reason);
        }
    }

    fn offer_all(&mut self, offers: Vec<(String, Occurrence)>) {
        for (service, o) in offers {
            self.offer(service, o);
        }
    }

    /// An occurrence that could not wait or be handed over: counted; a
    /// link-down Warning is then as one that failed (tried again, late).
    fn dropped(&mut self, service: String, reason: Reason) {
        (self.shared.ops).kube_event(reason.as_str(), EventOutcome::Dropped);
        if reason == Reason::OwnerLinkDown {
            let next = self.link.outcome(&service, false);
            self.offer_all(next);
        }
    }

    /// Every few seconds: the split elections this node is the one to
    /// tell (Warnings, repeated at most hourly while they last), and the
    /// end of those it told.
    fn splits(&mut self) {
        let (found, live) = {
            let st = self.shared.read();
            let found: Vec<(IpAddr, SplitElection)> = (st.ips.iter())
                .filter_map(|(ip, e)| Some((*ip, e.split.clone()?)))
                .collect();
            let live = (st.presence.as_ref())
                .filter(|p| p.read_unix.is_some())
                .map(|p| p.table.live());
            (found, live)
        };
        let split_now: BTreeSet<IpAddr> = found.iter().map(|(ip, _)| *ip).collect();
        let ended: Vec<IpAddr> = (self.splits.keys())
            .filter(|ip| !split_now.contains(ip))
            .copied()
            .collect();
        for ip in ended {
            if let Some(services) = self.splits.remove(&ip) {
                for (svc, o) in split::split_resolved(ip, &services) {
                    self.offer(svc, o);
                }
            }
        }
        for (ip, s) in found {
            if split::poster(ip, &s, live.as_deref()) != Some(self.node.as_str()) {
                // Another holder tells it (or will): nothing to end here.
                self.splits.remove(&ip);
                continue;
            }
            (self.splits).insert(ip, s.services.iter().map(|x| x.service.clone()).collect());
            for (svc, o) in split::split_election(ip, &s) {
                self.offer(svc, o);
            }
        }
    }

    /// Every second: whether this node owns LB IPs with every uplink
    /// without carrier; a Warning on each owned Service when that starts,
    /// a Normal Event when carrier returns (and the Warning first, if it
    /// could not be delivered while the link was down).
    fn link(&mut self) {
        let down = (self.shared.read().status.as_ref()).and_then(|s| s.owner_link_down.clone());
        let offers = match down {
            Some(d) => {
                let owned: Vec<(String, IpAddr, String)> = {
                    let st = self.shared.read();
                    (st.ips.iter())
                        .filter(|(_, e)| e.state == guard_common::Ownership::Owned)
                        .filter_map(|(ip, e)| Some((e.service.clone()?, *ip, e.source.clone())))
                        .collect()
                };
                self.link.down(&self.node, &owned, &d.interfaces)
            }
            None if self.link.is_down() => {
                let (up, owned): (Vec<String>, BTreeSet<IpAddr>) = {
                    let st = self.shared.read();
                    // The uplinks with carrier, as the status shows them.
                    let up = (st.status.iter().flat_map(|s| &s.interfaces))
                        .filter(|i| i.carrier == Some(true));
                    let owned = (st.ips.iter())
                        .filter(|(_, e)| e.state == guard_common::Ownership::Owned)
                        .map(|(ip, _)| *ip);
                    (up.map(|i| i.name.clone()).collect(), owned.collect())
                };
                self.link.up(&self.node, &owned, &up)
            }
            None => Vec::new(),
        };
        self.offer_all(offers);
    }

    /// Every second: forget what went quiet, judge what waited its turn.
    fn tick(&mut self) {
        let now = Instant::now();
        self.memory.prune(now);
        while let Some((at, _)) = self.waiting.front() {
            if now.duration_since(*at) < self.review {
                break;
            }
            if let Some((_, f)) = self.waiting.pop_front() {
                self.judge(&f);
            }
        }
    }
}

/// The Service and the Event a finding makes (None: none, or the IP has no
/// Service this node knows of: a file or kube-ipvs0 source).
fn occurrence(
    f: &Finding,
    node: &str,
    shared: &Shared,
    t: &Thresholds,
    memory: &mut Memory,
) -> Option<(String, Occurrence)> {
    let st = shared.read();
    let entry = st.ips.get(&f.ip())?;
    let service = entry.service.clone()?;
    if let Some(p) = st.presence.as_ref() {
        let here = answers_now(st.kernel_answered_ns, crate::datapath::sys::monotonic_ns());
        let (who, answering) = (p.table.macs(), p.table.kernel_answering());
        if silenced(f, entry.owner.as_deref(), &who, &answering, here) {
            return None;
        }
    }
    let facts = IpFacts {
        node,
        owned_here: entry.state == guard_common::Ownership::Owned,
        why: &entry.source,
        changed_ago: Duration::from_secs(
            crate::api::state::unix_now().saturating_sub(entry.since_unix),
        ),
    };
    let o = event_for(f, &facts, t, memory, Instant::now())?;
    Some((service, o))
}

/// For each LB IP this node owns, with a Service: the Event naming the
/// other nodes whose kernels answer for LB IPs (their presence records).
fn answering_kernels(node: &str, shared: &Shared) -> Vec<(String, Occurrence)> {
    let st = shared.read();
    let Some(p) = st.presence.as_ref() else {
        return Vec::new();
    };
    let answering = p.table.kernel_answering();
    if answering.iter().all(|n| n == node) {
        return Vec::new();
    }
    (st.ips.iter())
        .filter(|(_, e)| e.state == guard_common::Ownership::Owned)
        .filter_map(|(ip, e)| Some((e.service.clone()?, nodes_answer(*ip, node, &answering)?)))
        .collect()
}

/// Publish what the reader hands over, one at a time, each bounded in time.
async fn publish(
    kubeconfig: Option<std::path::PathBuf>,
    node: String,
    mut rx: mpsc::Receiver<Job>,
    done: mpsc::Sender<(StreamKey, EventOutcome)>,
    ops: Arc<Ops>,
) {
    let client = match crate::sources::cluster::task::client(kubeconfig.as_deref()).await {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %format!("{e:#}"), "Kubernetes Events are off: no API client");
            while let Some(job) = rx.recv().await {
                ops.kube_event(job.occurrence.reason.as_str(), EventOutcome::Failed);
                let _ = done.try_send((job.stream, EventOutcome::Failed));
            }
            return;
        }
    };
    let reporter = Reporter {
        controller: "arp-guard".into(),
        instance: Some(node),
    };
    let recorder = Recorder::new(client.clone(), reporter);
    let mut uids: BTreeMap<String, Option<String>> = BTreeMap::new();
    let mut failing = false;
    while let Some(job) = rx.recv().await {
        let reason = job.occurrence.reason.as_str();
        let reference = service_ref(&client, &job.stream.0, &mut uids).await;
        let ev = Event {
            type_: if job.occurrence.reason.warning() {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.into(),
            note: Some(truncate(job.occurrence.note, 1024)),
            action: job.occurrence.reason.action().into(),
            secondary: job.occurrence.node_at_fault.map(|n| ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(n),
                ..Default::default()
            }),
        };
        let outcome = match tokio::time::timeout(REQUEST_TIMEOUT, recorder.publish(&ev, &reference))
            .await
        {
            Ok(Ok(())) => EventOutcome::Published,
            Ok(Err(e)) => {
                if !failing {
                    tracing::warn!(service = %job.stream.0, reason, error = %e, "cannot publish a Kubernetes Event (guarding is not affected; said once until one succeeds)");
                }
                EventOutcome::Failed
            }
            Err(_) => {
                if !failing {
                    tracing::warn!(service = %job.stream.0, reason, "publishing a Kubernetes Event timed out (guarding is not affected)");
                }
                EventOutcome::Timeout
            }
        };
        failing = outcome != EventOutcome::Published;
        ops.kube_event(reason, outcome);
        // The reader hears how it went (full: it does not need to).
        let _ = done.try_send((job.stream, outcome));
    }
}

/// The reference of a Service ("namespace/name"), with its UID when the API
/// gives it (kubectl describe selects a Service's Events by UID).
async fn service_ref(
    client: &kube::Client,
    service: &str,
    uids: &mut BTreeMap<String, Option<String>>,
) -> ObjectReference {
    let (ns, name) = service.split_once('/').unwrap_or(("default", service));
    if !uids.contains_key(service) {
        let api: kube::Api<Service> = kube::Api::namespaced(client.clone(), ns);
        // Metadata only, from the API server's cache: a UID never changes.
        let cached = kube::api::GetParams::any();
        let get = api.get_metadata_with(name, &cached);
        let uid = match tokio::time::timeout(REQUEST_TIMEOUT, get).await {
            Ok(Ok(m)) => m.metadata.uid,
            _ => None,
        };
        if uids.len() >= MAX_UIDS {
            uids.clear();
        }
        // A Service not found now is asked for again next time.
        if uid.is_some() {
            uids.insert(service.to_owned(), uid);
        }
    }
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Service".into()),
        namespace: Some(ns.to_owned()),
        name: Some(name.to_owned()),
        uid: uids.get(service).cloned().flatten(),
        ..Default::default()
    }
}

/// The API takes at most 1 kB of note.
fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max.saturating_sub(3);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push_str("...");
    }
    s
}
