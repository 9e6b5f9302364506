//! One list+watch stream, driven by hand rather than by `kube::runtime::watcher`
//! so that its progress is visible: an event, a bookmark, or the server's end
//! of a watch. Everything it sees goes to the feed as a [`StreamMsg`].

use std::{
    collections::BTreeSet,
    fmt::Debug,
    sync::{
        atomic::{AtomicU64, Ordering::Relaxed},
        Arc,
    },
    time::{Duration, Instant},
};

use futures::StreamExt as _;
use k8s_openapi::api::{coordination::v1::Lease, core::v1::Service};
use kube::{
    api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, WatchEvent, WatchParams},
    runtime::watcher,
    Api, Client, Resource, ResourceExt as _,
};
use serde::de::DeserializeOwned;
use tokio::{sync::mpsc, task::JoinHandle};

use super::{
    cause::{Cause, Failure},
    model::Announcer,
    FeedConfig,
};

/// A healthy stream shows progress (an event, a bookmark, or the server
/// ending the watch) at least every watch timeout; this much later it is stuck.
pub const IDLE_MARGIN: Duration = Duration::from_secs(10);
/// Node heartbeats: thousands of renewals a minute on a big cluster, never an announcer's.
const NODE_LEASES_NS: &str = "kube-node-lease";
/// Objects per list page.
const PAGE: u32 = 500;
/// First retry of a failed list or watch; doubling per attempt up to 30 s.
const RETRY: Duration = Duration::from_millis(500);

/// A watcher event of one of the kinds the feed reads.
pub enum Update {
    Svc(Box<watcher::Event<Service>>),
    Lease(Box<watcher::Event<Lease>>),
    L2(Box<watcher::Event<DynamicObject>>),
}

/// What a stream task reports.
pub enum Msg {
    Update(Update),
    /// The server showed it is alive for this stream: a bookmark, or its
    /// clean end of a watch.
    Progress,
    /// A list or watch failed (it is retried with back-off).
    Failed(Failure),
    /// Nothing at all within the idle deadline: the stream is relisted.
    Idle(Duration),
}

/// A [`Msg`] from stream `stream`'s task number `generation` (messages of a
/// task since replaced are ignored).
pub struct StreamMsg {
    pub stream: usize,
    pub generation: u64,
    pub msg: Msg,
}

/// What one stream watches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stream {
    Services,
    Leases,
    L2 { namespace: String },
}

impl Stream {
    /// For logs, metrics and the status.
    pub fn name(&self) -> String {
        match self {
            Stream::Services => "services".into(),
            Stream::Leases => "leases".into(),
            Stream::L2 { namespace } => format!("servicel2statuses in {namespace}"),
        }
    }

    /// The streams the announcers need.
    pub fn all_for(announcers: &[Announcer]) -> Vec<Stream> {
        let mut out = vec![Stream::Services];
        if announcers
            .iter()
            .any(|a| !matches!(a, Announcer::MetalLb { .. }))
        {
            out.push(Stream::Leases);
        }
        out.extend(announcers.iter().filter_map(|a| match a {
            Announcer::MetalLb { namespace } => Some(Stream::L2 {
                namespace: namespace.clone(),
            }),
            _ => None,
        }));
        out
    }
}

/// MetalLB's ServiceL2Status, read as a dynamic object (no CRD types compiled in).
pub fn l2status_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("metallb.io", "v1beta1", "ServiceL2Status"),
        "servicel2statuses",
    )
}

/// Where Leases are watched: one namespace when every Lease-based announcer
/// points into the same one, else cluster-wide (kube-vip's per-service Leases
/// live in each Service's namespace) without the node heartbeats.
fn lease_api(client: &Client, announcers: &[Announcer]) -> (Api<Lease>, Option<String>) {
    let namespaces: BTreeSet<Option<&str>> = announcers
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
    async fn request<T>(&self, f: impl std::future::Future<Output = T>) -> T {
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

/// The task has no one to report to: the feed is gone.
struct Closed;

/// How a watch ended.
enum WatchEnd {
    /// Resume from the last resourceVersion.
    Resume,
    /// List again (410 Gone, or stuck).
    Relist,
}

/// One stream's task: list, then watch from the listed resourceVersion, for
/// ever. A 410 Gone relists; a failed watch is resumed from the last
/// resourceVersion after a back-off; a watch silent past `idle` is given up
/// and relisted.
struct Driver<K: Resource> {
    api: Api<K>,
    labels: Option<String>,
    fields: Option<String>,
    watch_timeout: Duration,
    idle: Duration,
    wrap: fn(watcher::Event<K>) -> Update,
    stream: usize,
    generation: u64,
    ctl: Arc<StreamCtl>,
    tx: mpsc::Sender<StreamMsg>,
    attempt: u32,
}

impl<K> Driver<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    async fn send(&self, msg: Msg) -> Result<(), Closed> {
        let m = StreamMsg {
            stream: self.stream,
            generation: self.generation,
            msg,
        };
        self.tx.send(m).await.map_err(|_| Closed)
    }

    /// Report a failure and wait out the back-off.
    async fn failed(&mut self, f: Failure) -> Result<(), Closed> {
        self.send(Msg::Failed(f)).await?;
        self.ctl.pause(backoff(RETRY, self.attempt)).await;
        self.attempt += 1;
        Ok(())
    }

    async fn run(mut self) {
        while let Ok(()) = self.relist_and_watch().await {}
    }

    async fn relist_and_watch(&mut self) -> Result<(), Closed> {
        let Some(mut rv) = self.list().await? else {
            return Ok(());
        };
        self.attempt = 0;
        loop {
            match self.watch(&mut rv).await? {
                WatchEnd::Resume => continue,
                WatchEnd::Relist => return Ok(()),
            }
        }
    }

    /// List, page by page; Init goes out with the first page that arrives,
    /// InitDone after the last. The listed resourceVersion, or None after a
    /// failure (reported).
    async fn list(&mut self) -> Result<Option<String>, Closed> {
        let mut lp = ListParams::default().limit(PAGE);
        lp.label_selector = self.labels.clone();
        lp.field_selector = self.fields.clone();
        let mut first = true;
        loop {
            let page = (self.ctl)
                .request(tokio::time::timeout(self.idle, self.api.list(&lp)))
                .await;
            let list = match page {
                Ok(Ok(list)) => list,
                Ok(Err(e)) => return self.failed(Failure::of("list", &e)).await.map(|()| None),
                Err(_) => {
                    let f = Failure::timeout("list", self.idle);
                    return self.failed(f).await.map(|()| None);
                }
            };
            if std::mem::take(&mut first) {
                self.send(Msg::Update((self.wrap)(watcher::Event::Init)))
                    .await?;
            }
            for mut o in list.items {
                slim(&mut o);
                self.send(Msg::Update((self.wrap)(watcher::Event::InitApply(o))))
                    .await?;
            }
            match list.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(c) => lp.continue_token = Some(c),
                None => {
                    self.send(Msg::Update((self.wrap)(watcher::Event::InitDone)))
                        .await?;
                    return Ok(Some(list.metadata.resource_version.unwrap_or_default()));
                }
            }
        }
    }

    /// One watch from `rv` (kept up to date) until the server ends it or it fails.
    async fn watch(&mut self, rv: &mut String) -> Result<WatchEnd, Closed> {
        // Bookmarks are on by default: they are the progress of a quiet stream.
        let mut wp =
            WatchParams::default().timeout(self.watch_timeout.as_secs().clamp(1, 290) as u32);
        wp.label_selector = self.labels.clone();
        wp.field_selector = self.fields.clone();
        let opened = (self.ctl)
            .request(tokio::time::timeout(self.idle, self.api.watch(&wp, rv)))
            .await;
        let mut events = match opened {
            Ok(Ok(s)) => s.boxed(),
            Ok(Err(kube::Error::Api(s))) if s.code == 410 => return Ok(WatchEnd::Relist),
            Ok(Err(e)) => {
                return self
                    .failed(Failure::of("watch", &e))
                    .await
                    .map(|()| WatchEnd::Resume)
            }
            Err(_) => {
                let f = Failure::timeout("watch", self.idle);
                return self.failed(f).await.map(|()| WatchEnd::Resume);
            }
        };
        let opened_at = Instant::now();
        let mut delivered = false;
        loop {
            let msg = match tokio::time::timeout(self.idle, events.next()).await {
                Err(_) => {
                    self.send(Msg::Idle(self.idle)).await?;
                    return Ok(WatchEnd::Relist);
                }
                // The server ended the watch. After its timeout, or after
                // delivering: progress, resume. At once, with nothing (a
                // proxy closing watches): a failure, with back-off, not a
                // hot loop that looks healthy.
                Ok(None) if delivered || opened_at.elapsed() >= Duration::from_secs(1) => {
                    self.attempt = 0;
                    self.send(Msg::Progress).await?;
                    return Ok(WatchEnd::Resume);
                }
                Ok(None) => Msg::Failed(Failure::new(
                    Cause::Other,
                    "watch: the server ended it at once",
                )),
                Ok(Some(Ok(WatchEvent::Error(e)))) if e.code == 410 => {
                    let f = Failure::new(Cause::Other, format!("watch: {} (relisting)", e.message));
                    self.send(Msg::Failed(f)).await?;
                    return Ok(WatchEnd::Relist);
                }
                Ok(Some(Ok(ev))) => self.event(ev, rv),
                Ok(Some(Err(e))) => Msg::Failed(Failure::of("watch", &e)),
            };
            if let Msg::Failed(e) = msg {
                self.failed(e).await?;
                return Ok(WatchEnd::Resume);
            }
            delivered = true;
            self.send(msg).await?;
        }
    }

    /// A watch event as a message; `rv` follows it.
    fn event(&self, ev: WatchEvent<K>, rv: &mut String) -> Msg {
        let mut follow = |o: &mut K| {
            if let Some(v) = o.resource_version() {
                *rv = v;
            }
            slim(o);
        };
        match ev {
            WatchEvent::Added(mut o) | WatchEvent::Modified(mut o) => {
                follow(&mut o);
                Msg::Update((self.wrap)(watcher::Event::Apply(o)))
            }
            WatchEvent::Deleted(mut o) => {
                follow(&mut o);
                Msg::Update((self.wrap)(watcher::Event::Delete(o)))
            }
            WatchEvent::Bookmark(b) => {
                *rv = b.metadata.resource_version;
                Msg::Progress
            }
            WatchEvent::Error(e) => Msg::Failed(Failure::new(
                Cause::of_code(e.code),
                format!("watch: {} ({})", e.message, e.code),
            )),
        }
    }
}

/// Drop what the guard never reads and can be large before an object is
/// passed on and kept in the feed's store: managed fields, and the copy of
/// the whole object `kubectl apply` leaves in an annotation.
fn slim<K: Resource>(o: &mut K) {
    let meta = o.meta_mut();
    meta.managed_fields = None;
    if let Some(a) = meta.annotations.as_mut() {
        a.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
}

/// Start the task that drives `stream` (number `index`).
pub fn spawn(
    client: &Client,
    cfg: &FeedConfig,
    stream: &Stream,
    index: usize,
    generation: u64,
    ctl: Arc<StreamCtl>,
    tx: mpsc::Sender<StreamMsg>,
) -> JoinHandle<()> {
    fn driver<K: Resource>(
        api: Api<K>,
        (labels, fields): (Option<String>, Option<String>),
        wrap: fn(watcher::Event<K>) -> Update,
        cfg: &FeedConfig,
        (stream, generation, ctl, tx): (usize, u64, Arc<StreamCtl>, mpsc::Sender<StreamMsg>),
    ) -> Driver<K> {
        Driver {
            api,
            labels,
            fields,
            watch_timeout: cfg.watch_timeout,
            idle: cfg.watch_timeout + IDLE_MARGIN,
            wrap,
            stream,
            generation,
            ctl,
            tx,
            attempt: 0,
        }
    }
    let to = (index, generation, ctl, tx);
    match stream {
        Stream::Services => {
            let api = Api::<Service>::all(client.clone());
            let sel = (cfg.selector.clone(), None);
            tokio::spawn(driver(api, sel, |e| Update::Svc(Box::new(e)), cfg, to).run())
        }
        Stream::Leases => {
            let (api, fields) = lease_api(client, &cfg.announcers);
            let wrap = |e| Update::Lease(Box::new(e));
            tokio::spawn(driver(api, (None, fields), wrap, cfg, to).run())
        }
        Stream::L2 { namespace } => {
            let api = Api::<DynamicObject>::namespaced_with(
                client.clone(),
                namespace,
                &l2status_resource(),
            );
            tokio::spawn(driver(api, (None, None), |e| Update::L2(Box::new(e)), cfg, to).run())
        }
    }
}
