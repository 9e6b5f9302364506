//! The ownership feed from the Kubernetes API: one list+watch stream per
//! source (Services, Leases, each ServiceL2Status namespace) keeps a
//! [`Model`], and every change (and every lease deadline) publishes the
//! claims it implies.
//!
//! The guard must never take permission away because *it* is blind:
//! - A Lease that seems to expire (no renewal seen within its duration) is
//!   confirmed with a direct GET before it changes anything. A newer
//!   renewTime from the GET means the watch is stuck: it is rebuilt, and the
//!   owner keeps its permission all along. A failed GET means the guard is
//!   blind: the holder keeps its claim, marked uncertain (owned stays owned,
//!   foreign is judged unknown).
//! - Each stream is driven here (list, then watch with bookmarks), so its
//!   progress is seen: an event, a bookmark or the server's end of a watch.
//!   A stream silent past its idle deadline (the server's watch timeout plus
//!   a margin) is stuck: it is relisted, and shows as failing.
//! - A stream is failing from its first error until it delivers again; a
//!   probe (a one-item list) catches an API that went silent. Once the guard
//!   has been blind for longer than the staleness threshold, the view is
//!   `degraded` and every `foreign` IP is treated as `unknown`.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Debug,
    net::IpAddr,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use futures::StreamExt as _;
use k8s_openapi::api::{coordination::v1::Lease, core::v1::Service};
use kube::{
    api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, WatchEvent, WatchParams},
    runtime::watcher,
    Api, Client, Resource, ResourceExt as _,
};
use serde::de::DeserializeOwned;
use tokio::{
    sync::{mpsc, watch},
    task::JoinHandle,
};

use super::{
    model::{Announcer, Claim, Key, L2Status, Model, ServiceInfo},
    objects::{self, ServiceFilter},
};

#[derive(Debug, Clone)]
pub struct FeedConfig {
    pub announcers: Vec<Announcer>,
    pub filter: ServiceFilter,
    /// Label selector for Services (server-side).
    pub selector: Option<String>,
    /// Degrade after this long without a healthy feed; None: the longest
    /// duration of the Leases in use, between 15 s and 60 s.
    pub stale_after: Option<Duration>,
    /// The server ends each watch after this long (`timeoutSeconds`); a
    /// stream silent for this plus [`IDLE_MARGIN`] is stuck.
    pub watch_timeout: Duration,
}

/// One stream's health, as shown in the status and metrics.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct StreamStatus {
    pub name: String,
    /// Listed at least once.
    pub synced: bool,
    /// Delivering: no error and no missed deadline since its last progress.
    pub healthy: bool,
    /// The last error, while failing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// What the cluster says, as published to the daemon.
#[derive(Debug, Clone, Default)]
pub struct ClusterView {
    /// Empty until every stream has completed its first list, so that an
    /// announcer that lists late cannot be overruled by one that listed early.
    pub claims: BTreeMap<IpAddr, Claim>,
    /// Every watcher has completed its first list.
    pub synced: bool,
    /// The guard has been blind for longer than the threshold.
    pub degraded: bool,
    /// Every holder of a Lease in use and every announcing node (to spot a
    /// node name that matches none of them).
    pub holders: BTreeSet<String>,
    /// When the change that produced this view reached the guard.
    pub event_at: Option<Instant>,
    /// Since when the guard has been blind (None: it sees).
    pub failing_since: Option<Instant>,
    /// Per stream.
    pub streams: Vec<StreamStatus>,
    /// Leases in use past their deadline that the API has not confirmed.
    pub unconfirmed: usize,
    /// Blind this long, the view degrades.
    pub threshold: Duration,
}

impl PartialEq for ClusterView {
    fn eq(&self, o: &Self) -> bool {
        self.claims == o.claims
            && self.synced == o.synced
            && self.degraded == o.degraded
            && self.holders == o.holders
            && self.streams == o.streams
            && self.unconfirmed == o.unconfirmed
            && self.failing_since.is_some() == o.failing_since.is_some()
            && self.threshold == o.threshold
    }
}

/// Build a client from `kubeconfig`, else the usual inference (in-cluster
/// service account, then $KUBECONFIG / ~/.kube/config).
pub async fn client(
    kubeconfig: Option<&std::path::Path>,
    watch_timeout: Duration,
) -> Result<Client> {
    // Several rustls providers could be compiled in; name ours. An error only
    // means one is installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .context("kubeconfig")?
        }
        None => kube::Config::infer()
            .await
            .context("no Kubernetes API configuration (in-cluster or kubeconfig)")?,
    };
    // A silently dead connection must surface as an error: the server ends
    // watches after watch_timeout on its own, so a longer read gap means trouble.
    config.read_timeout = Some(watch_timeout + IDLE_MARGIN + Duration::from_secs(5));
    Client::try_from(config).context("building the Kubernetes client")
}

pub fn l2status_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("metallb.io", "v1beta1", "ServiceL2Status"),
        "servicel2statuses",
    )
}

/// Default server-side end of each watch (`--kube-watch-timeout`).
pub const WATCH_TIMEOUT: Duration = Duration::from_secs(55);
/// A healthy stream shows progress (an event, a bookmark, or the server
/// ending the watch) at least every watch timeout; this much later it is stuck.
pub const IDLE_MARGIN: Duration = Duration::from_secs(10);
const PROBE_EVERY: Duration = Duration::from_secs(2);
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// A GET that confirms a Lease: its timeout, and how soon a failed one is retried.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(2);
/// First retry of a failed confirmation; doubling per attempt up to 30 s
/// (a failing API must not be hammered by a fleet of guards).
const CONFIRM_RETRY: Duration = Duration::from_secs(2);
/// Confirmations in flight at once.
const CONFIRM_PARALLEL: usize = 16;
/// A stream failing this long while the API answers has its back-off cut
/// short; one whose request has hung this long while the probe answers
/// within seconds is rebuilt.
const REBUILD_AFTER: Duration = Duration::from_secs(5);
const HUNG_REQUEST: Duration = Duration::from_secs(30);
/// The staleness threshold taken from Lease durations stays within these.
pub const THRESHOLD_FLOOR: Duration = Duration::from_secs(15);
pub const THRESHOLD_CAP: Duration = Duration::from_secs(60);
/// Node heartbeats: thousands of renewals a minute on a big cluster, never an announcer's.
const NODE_LEASES_NS: &str = "kube-node-lease";
/// Objects per list page.
const PAGE: u32 = 500;

enum Update {
    Svc(Box<watcher::Event<Service>>),
    Lease(Box<watcher::Event<Lease>>),
    L2(Box<watcher::Event<DynamicObject>>),
}

/// What a stream task reports.
enum Msg {
    Update(Update),
    /// The server showed it is alive for this stream: a bookmark, or its
    /// clean end of a watch.
    Progress,
    /// A list or watch failed (it is retried with back-off).
    Failed(String),
    /// Nothing at all within the idle deadline: the stream is relisted.
    Idle(Duration),
}

struct StreamMsg {
    stream: usize,
    generation: u64,
    msg: Msg,
}

/// What one stream watches, for names in logs and for relist bookkeeping.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Source {
    Services,
    Leases,
    L2 { namespace: String },
}

impl Source {
    fn name(&self) -> String {
        match self {
            Source::Services => "services".into(),
            Source::Leases => "leases".into(),
            Source::L2 { namespace } => format!("servicel2statuses in {namespace}"),
        }
    }
}

/// The streams the announcers need.
fn sources(cfg: &FeedConfig) -> Vec<Source> {
    let mut out = vec![Source::Services];
    if cfg
        .announcers
        .iter()
        .any(|a| !matches!(a, Announcer::MetalLb { .. }))
    {
        out.push(Source::Leases);
    }
    for a in &cfg.announcers {
        if let Announcer::MetalLb { namespace } = a {
            out.push(Source::L2 {
                namespace: namespace.clone(),
            });
        }
    }
    out
}

/// Where Leases are watched: one namespace when every Lease-based announcer
/// points into the same one, else cluster-wide (kube-vip's per-service Leases
/// live in each Service's namespace) without the node heartbeats.
fn lease_api(client: &Client, cfg: &FeedConfig) -> (Api<Lease>, Option<String>) {
    let namespaces: BTreeSet<Option<&str>> = cfg
        .announcers
        .iter()
        .filter_map(|a| match a {
            Announcer::Cilium { namespace } => Some(Some(namespace.as_str())),
            Announcer::KubeVipGlobal { lease } => Some(Some(lease.ns.as_str())),
            Announcer::KubeVipPerService => Some(None),
            Announcer::MetalLb { .. } => None,
        })
        .collect();
    match namespaces.iter().collect::<Vec<_>>().as_slice() {
        [Some(ns)] => (Api::namespaced(client.clone(), ns), None),
        _ => (
            Api::all(client.clone()),
            Some(format!("metadata.namespace!={NODE_LEASES_NS}")),
        ),
    }
}

/// Label and field selectors of a stream.
#[derive(Clone, Default)]
struct Selectors {
    labels: Option<String>,
    fields: Option<String>,
}

/// Back-off between failed attempts: doubling from `base` up to 30 s, with
/// jitter so that a fleet of guards does not come back in step after an API
/// outage.
fn backoff(base: Duration, attempt: u32) -> Duration {
    let d = (base * 2u32.saturating_pow(attempt.min(8))).min(Duration::from_secs(30));
    let jitter = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos())
        % 1000;
    d + d * jitter / 4000
}

/// Shared between a stream's task and the feed: the feed can cut a back-off
/// short (the API answers again) and can tell a task waiting in back-off from
/// one stuck in a request.
#[derive(Default)]
struct StreamCtl {
    kick: tokio::sync::Notify,
    /// When the request in flight (a list page, or a watch being opened)
    /// started, in ms of [`mono_ms`]; 0 while none is.
    busy_since: std::sync::atomic::AtomicU64,
}

fn mono_ms() -> u64 {
    crate::datapath::monotonic_ns() / 1_000_000 + 1
}

impl StreamCtl {
    /// Run `f` as a request: seen as busy meanwhile.
    async fn request<T>(&self, f: impl std::future::Future<Output = T>) -> T {
        use std::sync::atomic::Ordering::Relaxed;
        self.busy_since.store(mono_ms(), Relaxed);
        let r = f.await;
        self.busy_since.store(0, Relaxed);
        r
    }

    /// Wait out a back-off, unless kicked.
    async fn pause(&self, d: Duration) {
        tokio::select! {
            _ = tokio::time::sleep(d) => {}
            _ = self.kick.notified() => {}
        }
    }

    /// How long the request in flight has been going.
    fn busy_for(&self) -> Option<Duration> {
        match self.busy_since.load(std::sync::atomic::Ordering::Relaxed) {
            0 => None,
            t => Some(Duration::from_millis(mono_ms().saturating_sub(t))),
        }
    }
}

/// List, then watch from the listed resourceVersion, for ever: events,
/// progress and failures go to `tx`. A 410 Gone relists; a failed watch is
/// resumed from the last resourceVersion after a back-off; a watch silent
/// past `idle` is given up and relisted.
#[allow(clippy::too_many_arguments)]
async fn drive<K>(
    api: Api<K>,
    sel: Selectors,
    watch_timeout: Duration,
    wrap: fn(watcher::Event<K>) -> Update,
    stream: usize,
    generation: u64,
    ctl: std::sync::Arc<StreamCtl>,
    tx: mpsc::Sender<StreamMsg>,
) where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let send = |msg: Msg| {
        let tx = tx.clone();
        async move {
            tx.send(StreamMsg {
                stream,
                generation,
                msg,
            })
            .await
            .is_ok()
        }
    };
    let idle = watch_timeout + IDLE_MARGIN;
    let base = Duration::from_millis(500);
    let mut attempt = 0u32;
    'relist: loop {
        // List, page by page; Init goes out with the first page that arrives.
        let mut lp = ListParams::default().limit(PAGE);
        lp.label_selector = sel.labels.clone();
        lp.field_selector = sel.fields.clone();
        let mut first = true;
        let rv = loop {
            let page = ctl.request(tokio::time::timeout(idle, api.list(&lp))).await;
            let list = match page {
                Ok(Ok(list)) => list,
                Ok(Err(e)) => {
                    if !send(Msg::Failed(format!("list: {e}"))).await {
                        return;
                    }
                    ctl.pause(backoff(base, attempt)).await;
                    attempt += 1;
                    continue 'relist;
                }
                Err(_) => {
                    if !send(Msg::Failed(format!("list: no answer within {idle:?}"))).await {
                        return;
                    }
                    ctl.pause(backoff(base, attempt)).await;
                    attempt += 1;
                    continue 'relist;
                }
            };
            if std::mem::take(&mut first) && !send(Msg::Update(wrap(watcher::Event::Init))).await {
                return;
            }
            for o in list.items {
                if !send(Msg::Update(wrap(watcher::Event::InitApply(o)))).await {
                    return;
                }
            }
            match list.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(c) => lp.continue_token = Some(c),
                None => break list.metadata.resource_version.unwrap_or_default(),
            }
        };
        if !send(Msg::Update(wrap(watcher::Event::InitDone))).await {
            return;
        }
        attempt = 0;
        let mut rv = rv;
        // Bookmarks are on by default: they are the progress of a quiet stream.
        let mut wp = WatchParams::default().timeout(watch_timeout.as_secs().clamp(1, 290) as u32);
        wp.label_selector = sel.labels.clone();
        wp.field_selector = sel.fields.clone();
        loop {
            let opened = ctl
                .request(tokio::time::timeout(idle, api.watch(&wp, &rv)))
                .await;
            let mut events = match opened {
                Ok(Ok(s)) => s.boxed(),
                Ok(Err(kube::Error::Api(s))) if s.code == 410 => continue 'relist,
                Ok(Err(e)) => {
                    if !send(Msg::Failed(format!("watch: {e}"))).await {
                        return;
                    }
                    ctl.pause(backoff(base, attempt)).await;
                    attempt += 1;
                    continue;
                }
                Err(_) => {
                    if !send(Msg::Failed(format!("watch: no answer within {idle:?}"))).await {
                        return;
                    }
                    ctl.pause(backoff(base, attempt)).await;
                    attempt += 1;
                    continue;
                }
            };
            let opened_at = Instant::now();
            let mut delivered = false;
            loop {
                let msg = match tokio::time::timeout(idle, events.next()).await {
                    Err(_) => {
                        if !send(Msg::Idle(idle)).await {
                            return;
                        }
                        continue 'relist;
                    }
                    // The server ended the watch. After its timeout, or after
                    // delivering: progress, resume. At once, with nothing (a
                    // proxy closing watches): a failure, with back-off, not
                    // a hot loop that looks healthy.
                    Ok(None) if delivered || opened_at.elapsed() >= Duration::from_secs(1) => {
                        attempt = 0;
                        if !send(Msg::Progress).await {
                            return;
                        }
                        break;
                    }
                    Ok(None) => Msg::Failed("watch: the server ended it at once".into()),
                    Ok(Some(Ok(WatchEvent::Added(o) | WatchEvent::Modified(o)))) => {
                        rv = o.resource_version().unwrap_or(rv);
                        Msg::Update(wrap(watcher::Event::Apply(o)))
                    }
                    Ok(Some(Ok(WatchEvent::Deleted(o)))) => {
                        rv = o.resource_version().unwrap_or(rv);
                        Msg::Update(wrap(watcher::Event::Delete(o)))
                    }
                    Ok(Some(Ok(WatchEvent::Bookmark(b)))) => {
                        rv = b.metadata.resource_version;
                        Msg::Progress
                    }
                    Ok(Some(Ok(WatchEvent::Error(e)))) if e.code == 410 => {
                        if !send(Msg::Failed(format!("watch: {} (relisting)", e.message))).await {
                            return;
                        }
                        continue 'relist;
                    }
                    Ok(Some(Ok(WatchEvent::Error(e)))) => {
                        Msg::Failed(format!("watch: {} ({})", e.message, e.code))
                    }
                    Ok(Some(Err(e))) => Msg::Failed(format!("watch: {e}")),
                };
                let failed = matches!(msg, Msg::Failed(_));
                delivered |= !failed;
                if !send(msg).await {
                    return;
                }
                if failed {
                    ctl.pause(backoff(base, attempt)).await;
                    attempt += 1;
                    break;
                }
            }
        }
    }
}

/// Start the task that drives stream `i`.
fn spawn_stream(
    client: &Client,
    cfg: &FeedConfig,
    sources: &[Source],
    i: usize,
    generation: u64,
    ctl: std::sync::Arc<StreamCtl>,
    tx: mpsc::Sender<StreamMsg>,
) -> JoinHandle<()> {
    let t = cfg.watch_timeout;
    match &sources[i] {
        Source::Services => {
            let sel = Selectors {
                labels: cfg.selector.clone(),
                fields: None,
            };
            let api = Api::<Service>::all(client.clone());
            tokio::spawn(drive(
                api,
                sel,
                t,
                |e| Update::Svc(Box::new(e)),
                i,
                generation,
                ctl,
                tx,
            ))
        }
        Source::Leases => {
            let (api, fields) = lease_api(client, cfg);
            let sel = Selectors {
                labels: None,
                fields,
            };
            tokio::spawn(drive(
                api,
                sel,
                t,
                |e| Update::Lease(Box::new(e)),
                i,
                generation,
                ctl,
                tx,
            ))
        }
        Source::L2 { namespace } => {
            let api = Api::<DynamicObject>::namespaced_with(
                client.clone(),
                namespace,
                &l2status_resource(),
            );
            tokio::spawn(drive(
                api,
                Selectors::default(),
                t,
                |e| Update::L2(Box::new(e)),
                i,
                generation,
                ctl,
                tx,
            ))
        }
    }
}

/// A stream's relist in progress: objects since `Init`, swapped in at `InitDone`.
enum Relist {
    Services(BTreeMap<Key, ServiceInfo>),
    Leases(BTreeMap<Key, objects::LeaseFields>),
    L2(BTreeMap<Key, L2Status>),
}

/// One stream's health.
#[derive(Debug, Clone)]
struct Health {
    synced: bool,
    failing_since: Option<Instant>,
    last_progress: Instant,
    last_error: Option<String>,
}

/// The answer to a confirming GET of a Lease.
pub(crate) type Confirmation = Result<Option<Lease>, String>;

pub(crate) struct Feed {
    cfg: FeedConfig,
    sources: Vec<Source>,
    pub(crate) model: Model,
    relists: BTreeMap<usize, Relist>,
    health: Vec<Health>,
    /// The probe (a one-item list): failing since.
    probe_failing: Option<Instant>,
    /// Leases whose absurd duration was logged (once each).
    clamp_warned: BTreeSet<Key>,
    /// Confirming GETs: when the last one for a Lease was sent, and how many
    /// failed in a row.
    confirm_sent: BTreeMap<Key, (Instant, u32)>,
    /// Confirming GETs failing since (the guard cannot confirm: blind).
    confirm_failing: Option<Instant>,
    /// Streams to rebuild (relist), and why.
    rebuild: BTreeMap<usize, &'static str>,
    last_error: Option<String>,
}

impl Feed {
    pub(crate) fn new(cfg: FeedConfig, now: Instant) -> Self {
        let sources = sources(&cfg);
        let health = sources
            .iter()
            .map(|_| Health {
                synced: false,
                failing_since: None,
                last_progress: now,
                last_error: None,
            })
            .collect();
        Feed {
            cfg,
            sources,
            model: Model::default(),
            relists: BTreeMap::new(),
            health,
            probe_failing: None,
            clamp_warned: BTreeSet::new(),
            confirm_sent: BTreeMap::new(),
            confirm_failing: None,
            rebuild: BTreeMap::new(),
            last_error: None,
        }
    }

    fn name(&self, stream: usize) -> String {
        self.sources
            .get(stream)
            .map_or_else(|| "probe".to_owned(), Source::name)
    }

    fn lease_stream(&self) -> Option<usize> {
        self.sources.iter().position(|s| *s == Source::Leases)
    }

    /// Record a Lease the API told us about; log an absurd duration once.
    fn upsert_lease(&mut self, key: Key, f: objects::LeaseFields, now: Instant) -> bool {
        if let Some(v) = f.clamped {
            if self.clamp_warned.insert(key.clone()) {
                tracing::warn!(
                    lease = %key, lease_duration_seconds = v, used = ?f.duration,
                    "absurd leaseDurationSeconds; the guard uses a sane duration instead"
                );
            }
        }
        self.model
            .upsert_lease(key, f.holder, f.duration, f.renew, now)
    }

    fn apply(&mut self, stream: usize, upd: Update, now: Instant) {
        use watcher::Event::*;
        let filter = &self.cfg.filter;
        match upd {
            Update::Svc(ev) => match *ev {
                Apply(s) => match objects::service(&s, filter) {
                    Some(info) => {
                        self.model.services.insert(objects::key_of(&s), info);
                    }
                    None => {
                        self.model.services.remove(&objects::key_of(&s));
                    }
                },
                Delete(s) => {
                    self.model.services.remove(&objects::key_of(&s));
                }
                Init => {
                    self.relists
                        .insert(stream, Relist::Services(BTreeMap::new()));
                }
                InitApply(s) => {
                    if let (Some(Relist::Services(b)), Some(info)) =
                        (self.relists.get_mut(&stream), objects::service(&s, filter))
                    {
                        b.insert(objects::key_of(&s), info);
                    }
                }
                InitDone => {
                    if let Some(Relist::Services(b)) = self.relists.remove(&stream) {
                        self.model.services = b;
                    }
                    self.health[stream].synced = true;
                }
            },
            Update::Lease(ev) => match *ev {
                Apply(l) => {
                    self.upsert_lease(objects::key_of(&l), objects::lease(&l), now);
                }
                Delete(l) => {
                    let key = objects::key_of(&l);
                    self.clamp_warned.remove(&key);
                    self.model.leases.remove(&key);
                }
                Init => {
                    self.relists.insert(stream, Relist::Leases(BTreeMap::new()));
                }
                InitApply(l) => {
                    if let Some(Relist::Leases(b)) = self.relists.get_mut(&stream) {
                        b.insert(objects::key_of(&l), objects::lease(&l));
                    }
                }
                InitDone => {
                    if let Some(Relist::Leases(listed)) = self.relists.remove(&stream) {
                        // upsert_lease keeps the observation time of a Lease
                        // whose holder and renewTime did not change: a relist
                        // never extends a lease that stopped being renewed.
                        self.model.leases.retain(|k, _| listed.contains_key(k));
                        self.clamp_warned.retain(|k| listed.contains_key(k));
                        for (k, f) in listed {
                            self.upsert_lease(k, f, now);
                        }
                    }
                    self.health[stream].synced = true;
                }
            },
            Update::L2(ev) => match *ev {
                Apply(o) => match objects::l2status(&o) {
                    Some(s) => {
                        self.model.l2.insert(objects::key_of(&o), s);
                    }
                    None => {
                        self.model.l2.remove(&objects::key_of(&o));
                    }
                },
                Delete(o) => {
                    self.model.l2.remove(&objects::key_of(&o));
                }
                Init => {
                    self.relists.insert(stream, Relist::L2(BTreeMap::new()));
                }
                InitApply(o) => {
                    if let (Some(Relist::L2(b)), Some(s)) =
                        (self.relists.get_mut(&stream), objects::l2status(&o))
                    {
                        b.insert(objects::key_of(&o), s);
                    }
                }
                InitDone => {
                    if let (Some(Relist::L2(b)), Some(Source::L2 { namespace })) =
                        (self.relists.remove(&stream), self.sources.get(stream))
                    {
                        // This stream owns its namespace's entries only.
                        self.model.l2.retain(|k, _| &k.ns != namespace);
                        self.model.l2.extend(b);
                    }
                    self.health[stream].synced = true;
                }
            },
        }
    }

    /// The staleness threshold: `--stale-after`, else the longest duration
    /// of the Leases in use within [15 s, 60 s] (one absurd Lease must not
    /// switch degradation off).
    pub(crate) fn threshold(&self) -> Duration {
        self.cfg.stale_after.unwrap_or_else(|| {
            self.model
                .max_lease_duration(&self.cfg.announcers)
                .unwrap_or_default()
                .clamp(THRESHOLD_FLOOR, THRESHOLD_CAP)
        })
    }

    /// Since when the guard has been blind: a failing stream or probe, or a
    /// Lease in use past its deadline that the API has not confirmed.
    fn failing_since(&self, now: Instant) -> Option<Instant> {
        let streams = self.health.iter().filter_map(|h| h.failing_since);
        let leases = self
            .model
            .unconfirmed(&self.cfg.announcers, now)
            .into_iter()
            .map(|(_, since)| since);
        streams
            .chain(self.probe_failing)
            .chain(self.confirm_failing)
            .chain(leases)
            .min()
    }

    fn degraded(&self, now: Instant) -> bool {
        self.failing_since(now)
            .is_some_and(|t| now.duration_since(t) >= self.threshold())
    }

    fn synced(&self) -> bool {
        self.health.iter().all(|h| h.synced)
    }

    pub(crate) fn view(&self, now: Instant, event_at: Option<Instant>) -> ClusterView {
        let synced = self.synced();
        ClusterView {
            claims: if synced {
                self.model.ownership(&self.cfg.announcers, now)
            } else {
                BTreeMap::new()
            },
            synced,
            degraded: self.degraded(now),
            holders: self
                .model
                .named_nodes(&self.cfg.announcers)
                .into_iter()
                .map(str::to_owned)
                .collect(),
            event_at,
            failing_since: self.failing_since(now),
            streams: self
                .health
                .iter()
                .enumerate()
                .map(|(i, h)| StreamStatus {
                    name: self.name(i),
                    synced: h.synced,
                    healthy: h.failing_since.is_none(),
                    error: h.failing_since.and(h.last_error.clone()),
                })
                .collect(),
            unconfirmed: self.model.unconfirmed(&self.cfg.announcers, now).len(),
            threshold: self.threshold(),
        }
    }

    fn all_healthy(&self) -> bool {
        self.probe_failing.is_none()
            && self.confirm_failing.is_none()
            && self.health.iter().all(|h| h.failing_since.is_none())
    }

    /// The API answered for `stream` (or the probe).
    fn ok(&mut self, stream: Option<usize>, now: Instant) {
        let was = match stream {
            Some(i) => {
                self.health[i].last_progress = now;
                self.health[i].failing_since.take().is_some()
            }
            None => self.probe_failing.take().is_some(),
        };
        if was && self.all_healthy() {
            tracing::info!("Kubernetes API feed healthy again");
        }
    }

    /// `stream` (or the probe) failed; it has been failing since `since`.
    fn failed(&mut self, stream: Option<usize>, e: &str, since: Instant) {
        // Errors carry text from the API server: kept and logged short.
        let e = crate::ownership_file::clip(e, super::objects::MAX_FIELD);
        let e = e.as_str();
        let name = stream.map_or_else(|| "probe".to_owned(), |i| self.name(i));
        let msg = format!("{name}: {e}");
        if self.all_healthy() {
            tracing::warn!(error = %msg, "Kubernetes API feed failing; keeping the last known ownership for now");
        } else if self.last_error.as_deref() != Some(msg.as_str()) {
            tracing::debug!(error = %msg, "feed still failing");
        }
        match stream {
            Some(i) => {
                let h = &mut self.health[i];
                h.failing_since.get_or_insert(since);
                h.last_error = Some(e.to_owned());
            }
            None => {
                self.probe_failing.get_or_insert(since);
            }
        }
        self.last_error = Some(msg);
    }

    fn on_msg(&mut self, stream: usize, msg: Msg, now: Instant) {
        let name = self.name(stream);
        match msg {
            Msg::Update(u) => {
                crate::api::OPS.feed_event(&name);
                self.ok(Some(stream), now);
                self.apply(stream, u, now);
            }
            Msg::Progress => self.ok(Some(stream), now),
            Msg::Failed(e) => {
                crate::api::OPS.error("kubernetes_feed");
                self.failed(Some(stream), &e, now);
            }
            Msg::Idle(idle) => {
                // Blind since the last thing it delivered, not since now.
                let since = self.health[stream].last_progress;
                tracing::warn!(
                    stream = %name, silent_for = ?idle,
                    "Kubernetes watch stream stuck: no event, bookmark or end of watch within its deadline; relisting"
                );
                crate::api::OPS.feed_rebuild(&name, "idle");
                self.failed(
                    Some(stream),
                    &format!(
                        "no event, bookmark or end of watch within {idle:?}: stuck, relisting"
                    ),
                    since,
                );
            }
        }
    }

    /// Leases to confirm now: past their deadline, unconfirmed, and not
    /// asked about recently (a failed GET is retried after 2 s, doubling up
    /// to 30 s, with jitter).
    fn due_confirmations(&mut self, now: Instant, in_flight: usize) -> Vec<Key> {
        let room = CONFIRM_PARALLEL.saturating_sub(in_flight);
        let due: Vec<Key> = self
            .model
            .unconfirmed(&self.cfg.announcers, now)
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
        // Lease is gone from the model): the answer is old news.
        match self.model.leases.get(&key) {
            Some(l) if l.checked <= sent => {}
            _ => {
                self.confirm_sent.remove(&key);
                return;
            }
        }
        let lease_stream = self.lease_stream();
        let stuck = |feed: &mut Feed, what: String| {
            tracing::warn!(lease = %key, "{what}: the Lease watch is stuck; rebuilding it");
            if let Some(i) = lease_stream {
                let since = feed.health[i].last_progress;
                feed.failed(
                    Some(i),
                    &format!("missed a change of Lease {key}: stuck"),
                    since,
                );
                feed.rebuild.insert(i, "stuck");
            }
        };
        let ok = |feed: &mut Feed| {
            feed.confirm_sent.remove(&key);
            if feed.confirm_failing.take().is_some() && feed.all_healthy() {
                tracing::info!(
                    "Lease expiries can be confirmed again; Kubernetes API feed healthy again"
                );
            }
        };
        match answer {
            Ok(Some(l)) => {
                ok(self);
                let f = objects::lease(&l);
                let renew = f.renew.clone();
                if self.upsert_lease(key.clone(), f, now) {
                    stuck(
                        self,
                        format!(
                            "a GET shows a renewal the watch never delivered (renewTime {})",
                            renew.as_deref().unwrap_or("-")
                        ),
                    );
                } else {
                    tracing::info!(lease = %key, "Lease expiry confirmed by the API: not renewed within its duration");
                }
            }
            Ok(None) => {
                ok(self);
                self.model.leases.remove(&key);
                stuck(
                    self,
                    "a GET shows the Lease deleted, which the watch never delivered".into(),
                );
            }
            Err(e) => {
                crate::api::OPS.error("kubernetes_feed");
                if let Some((_, fails)) = self.confirm_sent.get_mut(&key) {
                    *fails += 1;
                }
                let e = crate::ownership_file::clip(&e, super::objects::MAX_FIELD);
                if self.confirm_failing.is_none() {
                    tracing::warn!(
                        lease = %key, error = %e,
                        "cannot confirm the expiry of a Lease: the guard is blind; its holder keeps its claim"
                    );
                    // Blind since the deadline the GET was to confirm.
                    let since = self
                        .model
                        .leases
                        .get(&key)
                        .map_or(now, super::model::LeaseInfo::deadline);
                    self.confirm_failing = Some(since);
                }
                self.last_error = Some(format!("confirming Lease {key}: {e}"));
            }
        }
    }

    fn take_rebuilds(&mut self) -> BTreeMap<usize, &'static str> {
        std::mem::take(&mut self.rebuild)
    }
}

/// GET one Lease, bounded in time.
async fn confirm(client: Client, key: Key) -> (Key, Confirmation) {
    let api = Api::<Lease>::namespaced(client, &key.ns);
    let r = match tokio::time::timeout(CONFIRM_TIMEOUT, api.get_opt(&key.name)).await {
        Ok(Ok(l)) => Ok(l),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {CONFIRM_TIMEOUT:?}")),
    };
    (key, r)
}

/// Run the feed for the life of the daemon, publishing into `tx`.
pub async fn run(client: Client, cfg: FeedConfig, tx: watch::Sender<ClusterView>) {
    let mut feed = Feed::new(cfg.clone(), Instant::now());
    let (msg_tx, mut msg_rx) = mpsc::channel::<StreamMsg>(4096);
    let sources = feed.sources.clone();
    let spawn = |i: usize, generation: u64| {
        let ctl = std::sync::Arc::new(StreamCtl::default());
        let task = spawn_stream(
            &client,
            &cfg,
            &sources,
            i,
            generation,
            ctl.clone(),
            msg_tx.clone(),
        );
        (task, generation, ctl)
    };
    let mut tasks: Vec<(JoinHandle<()>, u64, std::sync::Arc<StreamCtl>)> =
        (0..feed.sources.len()).map(|i| spawn(i, 0)).collect();
    let mut last_kick: Vec<Instant> = vec![Instant::now(); tasks.len()];
    let (confirm_tx, mut confirm_rx) = mpsc::channel::<(Key, Instant, Confirmation)>(64);
    let mut in_flight = 0usize;
    let probe_api = Api::<Service>::all(client.clone());
    let mut next_probe = Instant::now() + PROBE_EVERY;
    let mut was_degraded = false;
    let mut announced_sync = false;
    loop {
        let now = Instant::now();
        let later = [
            feed.model.next_expiry(now),
            feed.failing_since(now).map(|t| t + feed.threshold()),
        ];
        let wake = later
            .into_iter()
            .flatten()
            .filter(|t| *t > now)
            .fold(next_probe, Instant::min);
        let mut event_at = None;
        tokio::select! {
            m = msg_rx.recv() => {
                let Some(m) = m else { return };
                let t = Instant::now();
                event_at = Some(t);
                let mut next = Some(m);
                // Batch what is already waiting: one map update per burst.
                while let Some(m) = next {
                    if tasks.get(m.stream).is_some_and(|(_, g, _)| *g == m.generation) {
                        feed.on_msg(m.stream, m.msg, Instant::now());
                    }
                    next = msg_rx.try_recv().ok();
                }
            }
            Some((key, sent, answer)) = confirm_rx.recv() => {
                in_flight -= 1;
                feed.on_confirm(key, sent, answer, Instant::now());
            }
            _ = tokio::time::sleep_until(wake.into()) => {}
        }
        // A Lease past its deadline is confirmed before it changes anything.
        for key in feed.due_confirmations(Instant::now(), in_flight) {
            in_flight += 1;
            let (client, tx) = (client.clone(), confirm_tx.clone());
            let sent = Instant::now();
            tokio::spawn(async move {
                let (key, answer) = confirm(client, key).await;
                let _ = tx.send((key, sent, answer)).await;
            });
        }
        if Instant::now() >= next_probe {
            let probe = tokio::time::timeout(
                PROBE_TIMEOUT,
                probe_api.list_metadata(&ListParams::default().limit(1)),
            )
            .await;
            let now = Instant::now();
            match probe {
                Ok(Ok(_)) => {
                    feed.ok(None, now);
                    // The API answers but a stream has not delivered since its
                    // error for a while. Waiting in back-off: cut it short.
                    // Hung in a request the probe shows would have been
                    // answered long ago (a connection dead since an outage):
                    // rebuild it. A request merely in flight is left alone.
                    for (i, h) in feed.health.iter().enumerate() {
                        let failing = h
                            .failing_since
                            .is_some_and(|t| now.duration_since(t) >= REBUILD_AFTER);
                        if !failing || now.duration_since(last_kick[i]) < REBUILD_AFTER {
                            continue;
                        }
                        last_kick[i] = now;
                        match tasks[i].2.busy_for() {
                            None => {
                                tracing::info!(stream = %feed.name(i), "Kubernetes API answers again; retrying now");
                                tasks[i].2.kick.notify_one();
                            }
                            Some(busy) if busy >= HUNG_REQUEST => {
                                feed.rebuild.entry(i).or_insert("api_back");
                            }
                            Some(_) => {}
                        }
                    }
                }
                Ok(Err(e)) => feed.failed(None, &e.to_string(), now),
                Err(_) => feed.failed(None, &format!("no answer within {PROBE_TIMEOUT:?}"), now),
            }
            next_probe = now + PROBE_EVERY;
        }
        for (i, why) in feed.take_rebuilds() {
            let name = feed.name(i);
            if why == "api_back" {
                tracing::info!(stream = %name, "Kubernetes API answers again, this stream's request hangs; relisting");
            }
            crate::api::OPS.feed_rebuild(&name, why);
            tasks[i].0.abort();
            let generation = tasks[i].1 + 1;
            tasks[i] = spawn(i, generation);
        }
        let view = feed.view(Instant::now(), event_at);
        if view.degraded != was_degraded {
            was_degraded = view.degraded;
            if view.degraded {
                tracing::warn!(
                    after = ?feed.threshold(),
                    error = feed.last_error.as_deref().unwrap_or(""),
                    "ownership feed stale: every foreign LB IP is treated as unknown until the API is back \
                     (IPs this node owns stay owned)"
                );
            } else {
                tracing::info!("ownership feed fresh again: foreign LB IPs are enforced again");
            }
        }
        if view.synced && !announced_sync {
            announced_sync = true;
            tracing::info!(
                services = feed.model.services.len(),
                leases = feed.model.leases.len(),
                l2statuses = feed.model.l2.len(),
                "initial sync from the Kubernetes API done"
            );
        }
        tx.send_if_modified(|cur| {
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
    use super::*;

    fn lease_json(holder: &str, renew: &str) -> Lease {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "cilium-l2announce-default-web", "namespace": "kube-system"},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 10, "renewTime": renew}
        }))
        .unwrap()
    }

    fn svc() -> Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"type": "LoadBalancer"},
            "status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.10"}]}}
        }))
        .unwrap()
    }

    fn feed(t0: Instant) -> Feed {
        Feed::new(
            FeedConfig {
                announcers: vec![Announcer::Cilium {
                    namespace: "kube-system".into(),
                }],
                filter: ServiceFilter::default(),
                selector: None,
                stale_after: None,
                watch_timeout: WATCH_TIMEOUT,
            },
            t0,
        )
    }

    fn list(f: &mut Feed, t: Instant, lease: Lease) {
        use watcher::Event::*;
        f.apply(0, Update::Svc(Box::new(Init)), t);
        f.apply(0, Update::Svc(Box::new(InitApply(svc()))), t);
        f.apply(0, Update::Svc(Box::new(InitDone)), t);
        f.apply(1, Update::Lease(Box::new(Init)), t);
        f.apply(1, Update::Lease(Box::new(InitApply(lease))), t);
        f.apply(1, Update::Lease(Box::new(InitDone)), t);
    }

    const IP: &str = "198.51.100.10";
    const KEY: (&str, &str) = ("kube-system", "cilium-l2announce-default-web");

    fn owner(f: &Feed, t: Instant) -> (Option<String>, bool) {
        let c = &f.view(t, None).claims[&IP.parse::<IpAddr>().unwrap()];
        (c.owner.clone(), c.certain)
    }

    #[test]
    fn a_relist_does_not_extend_a_lease_nobody_renews() {
        let t0 = Instant::now();
        let mut f = feed(t0);
        assert!(
            f.view(t0, None).claims.is_empty(),
            "nothing before the first sync"
        );
        list(
            &mut f,
            t0,
            lease_json("node-a", "2026-11-30T10:00:00.000000Z"),
        );
        assert_eq!(owner(&f, t0), (Some("node-a".into()), true));
        // A relist 8 s later with the same renewTime keeps the first observation...
        let t8 = t0 + Duration::from_secs(8);
        list(
            &mut f,
            t8,
            lease_json("node-a", "2026-11-30T10:00:00.000000Z"),
        );
        // ...so at 11 s the lease is past its deadline (10 s after it was
        // first seen); the API was last heard at 8 s: not confirmed yet.
        let t11 = t0 + Duration::from_secs(11);
        assert_eq!(owner(&f, t11), (Some("node-a".into()), false));
        assert_eq!(f.due_confirmations(t11, 0), vec![Key::new(KEY.0, KEY.1)]);
        assert!(f.due_confirmations(t11, 0).is_empty(), "one GET at a time");
        // The GET shows the same renewTime: expiry confirmed, no owner.
        f.on_confirm(
            Key::new(KEY.0, KEY.1),
            t11,
            Ok(Some(lease_json("node-a", "2026-11-30T10:00:00.000000Z"))),
            t11,
        );
        assert_eq!(owner(&f, t11), (None, true));
        assert!(f.take_rebuilds().is_empty(), "not a stuck stream");
        // ...and a renewal seen in a relist counts as one.
        let t12 = t0 + Duration::from_secs(12);
        list(
            &mut f,
            t12,
            lease_json("node-a", "2026-11-30T10:00:12.000000Z"),
        );
        assert_eq!(
            owner(&f, t12 + Duration::from_secs(1)),
            (Some("node-a".into()), true)
        );
    }

    /// The watch misses renewals (stuck half-way through a chunk): the
    /// lease seems to expire, the GET shows a newer renewTime, the holder
    /// keeps its claim throughout and the stream is rebuilt.
    #[test]
    fn a_stuck_watch_never_takes_the_owner_away() {
        let t0 = Instant::now();
        let mut f = feed(t0);
        list(
            &mut f,
            t0,
            lease_json("node-a", "2026-11-30T10:00:00.000000Z"),
        );
        let t10 = t0 + Duration::from_secs(10);
        assert_eq!(
            owner(&f, t10),
            (Some("node-a".into()), false),
            "held, uncertain"
        );
        assert_eq!(f.due_confirmations(t10, 0).len(), 1);
        f.on_confirm(
            Key::new(KEY.0, KEY.1),
            t10,
            Ok(Some(lease_json("node-a", "2026-11-30T10:00:09.000000Z"))),
            t10,
        );
        assert_eq!(
            owner(&f, t10),
            (Some("node-a".into()), true),
            "renewed: certain again"
        );
        assert_eq!(f.take_rebuilds().into_keys().collect::<Vec<_>>(), vec![1]);
        let v = f.view(t10, None);
        assert!(!v.streams[1].healthy, "the stuck stream shows as failing");
        // Blind since its last progress (t0), so past the 15 s floor it degrades.
        assert!(f.view(t0 + Duration::from_secs(15), None).degraded);
        // A failed GET: the holder keeps its (uncertain) claim, blind since the deadline.
        let mut g = feed(t0);
        list(
            &mut g,
            t0,
            lease_json("node-a", "2026-11-30T10:00:00.000000Z"),
        );
        let t11 = t0 + Duration::from_secs(11);
        assert_eq!(g.due_confirmations(t11, 0).len(), 1);
        g.on_confirm(
            Key::new(KEY.0, KEY.1),
            t11,
            Err("403 Forbidden".into()),
            t11,
        );
        assert_eq!(owner(&g, t11), (Some("node-a".into()), false));
        assert_eq!(g.view(t11, None).failing_since, Some(t10));
        assert!(!g.view(t0 + Duration::from_secs(24), None).degraded);
        assert!(g.view(t0 + Duration::from_secs(25), None).degraded);
        assert_eq!(
            owner(&g, t0 + Duration::from_secs(300)),
            (Some("node-a".into()), false)
        );
    }

    /// A GET's answer that the watch has overtaken is old news: it neither
    /// expires a Lease that was renewed meanwhile nor removes one that was
    /// re-created, nor revives one the watch deleted.
    #[test]
    fn an_overtaken_confirmation_is_ignored() {
        use watcher::Event::*;
        let t0 = Instant::now();
        let mut f = feed(t0);
        list(
            &mut f,
            t0,
            lease_json("node-a", "2026-11-30T10:00:00.000000Z"),
        );
        let (t10, t11, t12) = (
            t0 + Duration::from_secs(10),
            t0 + Duration::from_secs(11),
            t0 + Duration::from_secs(12),
        );
        assert_eq!(f.due_confirmations(t10, 0).len(), 1);
        // The watch delivers a renewal after the GET went out...
        f.apply(
            1,
            Update::Lease(Box::new(Apply(lease_json(
                "node-a",
                "2026-11-30T10:00:11.000000Z",
            )))),
            t11,
        );
        // ...then the GET's answer, from before it, arrives: ignored.
        let old = Ok(Some(lease_json("node-a", "2026-11-30T10:00:00.000000Z")));
        f.on_confirm(Key::new(KEY.0, KEY.1), t10, old, t12);
        assert_eq!(owner(&f, t12), (Some("node-a".into()), true));
        assert!(f.take_rebuilds().is_empty(), "no false alarm");
        f.on_confirm(Key::new(KEY.0, KEY.1), t10, Ok(None), t12);
        assert_eq!(owner(&f, t12), (Some("node-a".into()), true), "not removed");
        // Deleted by the watch after the GET went out: not revived.
        f.apply(
            1,
            Update::Lease(Box::new(Delete(lease_json(
                "node-a",
                "2026-11-30T10:00:11.000000Z",
            )))),
            t12,
        );
        let renewed = Ok(Some(lease_json("node-a", "2026-11-30T10:00:12.000000Z")));
        f.on_confirm(Key::new(KEY.0, KEY.1), t11, renewed, t12);
        assert!(f.model.leases.is_empty());
    }

    #[test]
    fn claims_wait_for_every_stream() {
        use watcher::Event::*;
        let t0 = Instant::now();
        let mut f = feed(t0);
        f.apply(0, Update::Svc(Box::new(Init)), t0);
        f.apply(0, Update::Svc(Box::new(InitApply(svc()))), t0);
        f.apply(0, Update::Svc(Box::new(InitDone)), t0);
        let v = f.view(t0, None);
        assert!(!v.synced && v.claims.is_empty(), "Leases not listed yet");
    }

    #[test]
    fn degrades_after_the_threshold_and_recovers_per_stream() {
        let t0 = Instant::now();
        let mut f = feed(t0);
        list(
            &mut f,
            t0,
            lease_json("node-a", "2026-11-30T10:00:00.000000Z"),
        );
        f.failed(Some(1), "connection refused", t0);
        assert!(!f.view(t0 + Duration::from_secs(14), None).degraded);
        assert!(
            f.view(t0 + Duration::from_secs(15), None).degraded,
            "15 s floor"
        );
        // The probe answering does not vouch for the lease stream.
        f.ok(None, t0);
        assert!(f.view(t0 + Duration::from_secs(16), None).degraded);
        f.ok(Some(1), t0);
        // Streams healthy; the lease, past its deadline (10 s) and not yet
        // confirmed, has kept the guard blind for 6 s only.
        let v = f.view(t0 + Duration::from_secs(16), None);
        assert!(!v.degraded && v.unconfirmed == 1);
    }

    #[test]
    fn an_idle_stream_is_failing_since_its_last_progress() {
        let t0 = Instant::now();
        let mut f = feed(t0);
        list(
            &mut f,
            t0,
            lease_json("node-a", "2026-11-30T10:00:00.000000Z"),
        );
        let t = t0 + WATCH_TIMEOUT + IDLE_MARGIN;
        f.on_msg(0, Msg::Idle(WATCH_TIMEOUT + IDLE_MARGIN), t);
        let v = f.view(t, None);
        assert!(!v.streams[0].healthy);
        assert!(v.streams[0].error.as_deref().unwrap().contains("stuck"));
        assert_eq!(f.health[0].failing_since, Some(t0));
        assert!(v.degraded, "blind for longer than the threshold");
        f.on_msg(0, Msg::Progress, t);
        assert!(f.view(t, None).streams[0].healthy);
    }

    /// One Lease with an absurd duration cannot switch degradation off: the
    /// threshold stays within [15 s, 60 s].
    #[test]
    fn the_threshold_is_capped() {
        let t0 = Instant::now();
        let mut f = feed(t0);
        let mut l = lease_json("node-a", "2026-11-30T10:00:00.000000Z");
        l.spec.as_mut().unwrap().lease_duration_seconds = Some(2147483647);
        list(&mut f, t0, l);
        assert_eq!(f.threshold(), THRESHOLD_CAP);
        f.failed(Some(0), "500 Internal Server Error", t0);
        assert!(!f.view(t0 + Duration::from_secs(59), None).degraded);
        assert!(f.view(t0 + Duration::from_secs(60), None).degraded);
    }
}
