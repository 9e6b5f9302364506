//! One list+watch stream, driven by hand rather than by `kube::runtime::watcher`
//! so that its progress is visible (an event, a bookmark, or the server's end
//! of a watch) and so that its objects are decoded one by one into the slim
//! types of `decode`. Everything it sees is delivered to the feed in the
//! task itself ([`Hub::deliver`]); a watch is read from a connection of its
//! own (`dial`), kept from one watch to the next.

use std::{
    sync::{
        atomic::{AtomicBool, Ordering::Relaxed},
        Arc,
    },
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::Service;
use kube::{
    api::{DynamicObject, ListParams, WatchParams},
    Client, Resource as _,
};
use tokio::task::JoinHandle;

use super::per_stream::StreamId;
use super::{
    cause::{Cause, Failure},
    decode::{Obj, Object, WatchLine},
    dial::{Conn, Dialer},
    hub::{Closed, Hub, PanicWatch},
    stream::{
        backoff, l2status_resource, lease_scope, Event, Msg, Stream, StreamCtl, Update,
        IDLE_MARGIN, LB_SERVICES,
    },
    wire::{self, Read},
    FeedConfig,
};

/// Objects per list page.
const PAGE: u32 = 500;
/// The Lease stream never receives the guards' own presence records (they
/// live in the guard's namespace, which a cluster-wide watch for kube-vip's
/// per-Service Leases, or Cilium's namespace, may include): a guard joining
/// or changing would otherwise reach every guard's feed.
static NOT_PRESENCE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "{}!={}",
        crate::model::presence::LABEL,
        crate::model::presence::LABEL_VALUE
    )
});
/// First retry of a failed list or watch; doubling per attempt up to 30 s.
const RETRY: Duration = Duration::from_millis(500);

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
pub(super) struct Driver {
    client: Client,
    dialer: Dialer,
    /// The connection of the last watch, kept for the next one.
    kept: Option<Conn>,
    /// The collection's URL path.
    path: String,
    labels: Option<String>,
    fields: Option<String>,
    /// Services only: the server filters them by `spec.type` (cleared, for
    /// every later stream too, when it answers that it cannot).
    lb_filter: Option<Arc<AtomicBool>>,
    watch_timeout: Duration,
    idle: Duration,
    stream: StreamId,
    generation: u64,
    ctl: Arc<StreamCtl>,
    hub: Arc<Hub>,
    attempt: u32,
}

/// Who a stream's task reports to, as what.
pub(super) struct To {
    pub stream: StreamId,
    pub generation: u64,
    pub ctl: Arc<StreamCtl>,
    pub hub: Arc<Hub>,
}

impl Driver {
    pub(super) fn new(client: Client, dialer: Dialer, cfg: &FeedConfig, to: To) -> Self {
        let To {
            stream,
            generation,
            ctl,
            hub,
        } = to;
        Driver {
            client,
            dialer,
            kept: None,
            path: String::new(),
            labels: None,
            fields: None,
            lb_filter: None,
            watch_timeout: cfg.watch_timeout,
            idle: cfg.watch_timeout + IDLE_MARGIN,
            stream,
            generation,
            ctl,
            hub,
            attempt: 0,
        }
    }

    /// The collection at `path`, with these selectors.
    pub(super) fn collection(
        mut self,
        path: String,
        labels: Option<String>,
        fields: Option<String>,
    ) -> Self {
        (self.path, self.labels, self.fields) = (path, labels, fields);
        self
    }

    /// Services: filtered by type on the server while `lb_filter` holds.
    pub(super) fn services(mut self, lb_filter: Arc<AtomicBool>) -> Self {
        self.lb_filter = Some(lb_filter);
        self
    }

    pub(super) async fn run<T: Object>(mut self, wrap: fn(Event<T>) -> Update) {
        let _panic = PanicWatch {
            hub: self.hub.clone(),
            stream: self.stream,
            generation: self.generation,
        };
        while let Ok(()) = self.relist_and_watch(wrap).await {}
    }

    /// The field selector of the next request.
    fn fields(&self) -> Option<String> {
        let lb = (self.lb_filter.as_ref()).is_some_and(|f| f.load(Relaxed));
        match (lb, &self.fields) {
            (true, Some(f)) => Some(format!("{LB_SERVICES},{f}")),
            (true, None) => Some(LB_SERVICES.to_owned()),
            (false, f) => f.clone(),
        }
    }

    /// The server cannot filter Services by type (before Kubernetes 1.31
    /// it answers 400 "field label not supported: spec.type"): from now on
    /// every Service is read and the others dropped as they are decoded.
    fn filter_unsupported(&self, e: &kube::Error) -> bool {
        let kube::Error::Api(s) = e else {
            return false;
        };
        let Some(f) = self.lb_filter.as_ref() else {
            return false;
        };
        if s.code != 400 || !s.message.contains("spec.type") {
            return false;
        }
        if f.swap(false, Relaxed) {
            tracing::info!(
                error = %crate::model::text::clip(&s.message, 200),
                "the API server cannot select Services by spec.type (Kubernetes before 1.31): \
                 reading every Service and keeping only those of type LoadBalancer"
            );
        }
        true
    }

    fn send(&self, msg: Msg) -> Result<(), Closed> {
        self.hub.deliver((self.stream, self.generation), msg, false)
    }

    /// Report a failure and wait out the back-off.
    async fn failed(&mut self, f: Failure) -> Result<(), Closed> {
        self.send(Msg::Failed(f))?;
        self.ctl.pause(backoff(RETRY, self.attempt)).await;
        self.attempt += 1;
        Ok(())
    }

    async fn relist_and_watch<T: Object>(
        &mut self,
        wrap: fn(Event<T>) -> Update,
    ) -> Result<(), Closed> {
        let Some(mut rv) = self.list(wrap).await? else {
            return Ok(());
        };
        self.attempt = 0;
        loop {
            match self.watch(&mut rv, wrap).await? {
                WatchEnd::Resume => continue,
                WatchEnd::Relist => return Ok(()),
            }
        }
    }

    /// List, page by page; `Listing` goes out with the first page that
    /// arrives, `ListDone` after the last. The listed resourceVersion, or
    /// None after a failure (reported).
    async fn list<T: Object>(
        &mut self,
        wrap: fn(Event<T>) -> Update,
    ) -> Result<Option<String>, Closed> {
        let mut lp = ListParams::default().limit(PAGE);
        lp.label_selector = self.labels.clone();
        lp.field_selector = self.fields();
        let mut first = true;
        loop {
            let page = (self.ctl)
                .request(tokio::time::timeout(
                    self.idle,
                    wire::list::<T>(&self.client, &self.path, &lp),
                ))
                .await;
            let page = match page {
                Ok(Ok(p)) => p,
                // Listed again at once, without the filter.
                Ok(Err(e)) if self.filter_unsupported(&e) => return Ok(None),
                Ok(Err(e)) => return self.failed(Failure::of("list", &e)).await.map(|()| None),
                Err(_) => {
                    let f = Failure::timeout("list", self.idle);
                    return self.failed(f).await.map(|()| None);
                }
            };
            if std::mem::take(&mut first) {
                self.send(Msg::Update(wrap(Event::Listing)))?;
            }
            for o in page.items {
                self.send(Msg::Update(wrap(Event::Listed(o))))?;
            }
            match page.continue_token {
                Some(c) => lp.continue_token = Some(c),
                None => {
                    self.send(Msg::Update(wrap(Event::ListDone)))?;
                    return Ok(Some(page.resource_version.unwrap_or_default()));
                }
            }
        }
    }

    /// Open a watch from `rv`: the watch, or how the attempt ended.
    async fn open(&mut self, rv: &str) -> Result<Result<wire::Watch<Conn>, WatchEnd>, Closed> {
        // Bookmarks are on by default: they are the progress of a quiet stream.
        let mut wp =
            WatchParams::default().timeout(self.watch_timeout.as_secs().clamp(1, 290) as u32);
        wp.label_selector = self.labels.clone();
        wp.field_selector = self.fields();
        let opened = (self.ctl)
            .request(tokio::time::timeout(
                self.idle,
                wire::watch(&self.dialer, self.kept.take(), &self.path, &wp, rv),
            ))
            .await;
        let end = match opened {
            Ok(Ok(w)) => return Ok(Ok(w)),
            Ok(Err(kube::Error::Api(s))) if s.code == 410 => WatchEnd::Relist,
            Ok(Err(e)) if self.filter_unsupported(&e) => WatchEnd::Relist,
            Ok(Err(e)) => {
                self.failed(Failure::of("watch", &e)).await?;
                WatchEnd::Resume
            }
            Err(_) => {
                self.failed(Failure::timeout("watch", self.idle)).await?;
                WatchEnd::Resume
            }
        };
        Ok(Err(end))
    }

    /// One watch from `rv` (kept up to date) until the server ends it or it fails.
    async fn watch<T: Object>(
        &mut self,
        rv: &mut String,
        wrap: fn(Event<T>) -> Update,
    ) -> Result<WatchEnd, Closed> {
        let mut w = match self.open(rv).await? {
            Ok(w) => w,
            Err(end) => return Ok(end),
        };
        let opened_at = Instant::now();
        let mut delivered = false;
        // The idle deadline follows the last thing the watch delivered; its
        // timer is moved only when it fires early (not for every event).
        let mut seen = opened_at;
        let idle = tokio::time::sleep(self.idle);
        tokio::pin!(idle);
        loop {
            let read = tokio::select! {
                r = w.next::<T>() => Some(r),
                () = &mut idle => None,
            };
            let msg = match read {
                None if seen.elapsed() < self.idle => {
                    idle.as_mut().reset((seen + self.idle).into());
                    continue;
                }
                None => {
                    self.send(Msg::Idle(self.idle))?;
                    return Ok(WatchEnd::Relist);
                }
                // The server ended the watch. After its timeout, or after
                // delivering: progress, resume. At once, with nothing (a
                // proxy closing watches): a failure, with back-off, not a
                // hot loop that looks healthy.
                Some(Read::End) if delivered || opened_at.elapsed() >= Duration::from_secs(1) => {
                    self.attempt = 0;
                    self.kept = w.into_reusable();
                    self.send(Msg::Progress)?;
                    return Ok(WatchEnd::Resume);
                }
                Some(Read::End) => Msg::Failed(Failure::new(
                    Cause::Other,
                    "watch: the server ended it at once",
                )),
                Some(Read::Failed(e)) => {
                    Msg::Failed(Failure::new(Cause::of_io(&e), format!("watch: {e}")))
                }
                Some(Read::Garbled(e)) => Msg::Failed(Failure::new(Cause::Other, e)),
                Some(Read::Line(WatchLine::Error(410, m))) => {
                    let f = Failure::new(Cause::Other, format!("watch: {m} (relisting)"));
                    self.send(Msg::Failed(f))?;
                    return Ok(WatchEnd::Relist);
                }
                Some(Read::Line(l)) => {
                    seen = Instant::now();
                    event(l, rv, wrap)
                }
            };
            if let Msg::Failed(e) = msg {
                self.failed(e).await?;
                return Ok(WatchEnd::Resume);
            }
            delivered = true;
            self.hub
                .deliver((self.stream, self.generation), msg, w.more_ready())?;
        }
    }
}

/// A watch event as a message; `rv` follows it. An object the feed does
/// not want (a Service that is not, or no longer, of type LoadBalancer)
/// goes as a deletion: if the feed knew it, it is no longer guarded.
fn event<T: Object>(l: WatchLine<T>, rv: &mut String, wrap: fn(Event<T>) -> Update) -> Msg {
    let mut follow = |o: &Obj<T>| {
        if let Some(v) = o.resource_version() {
            rv.clear();
            rv.push_str(v);
        }
    };
    match l {
        WatchLine::Added(o) | WatchLine::Modified(o) => {
            follow(&o);
            let wanted = !matches!(&o, Obj::Good(g) if !g.wanted());
            Msg::Update(wrap(if wanted {
                Event::Apply(o)
            } else {
                Event::Delete(o)
            }))
        }
        WatchLine::Deleted(o) => {
            follow(&o);
            Msg::Update(wrap(Event::Delete(o)))
        }
        WatchLine::Bookmark(v) => {
            if let Some(v) = v {
                *rv = v;
            }
            Msg::Progress
        }
        WatchLine::Error(code, m) => Msg::Failed(Failure::new(
            Cause::of_code(code),
            format!("watch: {m} ({code})"),
        )),
    }
}

/// Start the task that drives `stream` (reporting as `to` says). `lb_filter`: the
/// server filters Services by type (cleared, for good, when it cannot).
pub(super) fn spawn(
    (client, dialer): (&Client, &Dialer),
    cfg: &FeedConfig,
    stream: &Stream,
    to: To,
    lb_filter: Arc<AtomicBool>,
) -> JoinHandle<()> {
    let d = Driver::new(client.clone(), dialer.clone(), cfg, to);
    match stream {
        Stream::Services => tokio::spawn(
            d.collection(Service::url_path(&(), None), cfg.selector.clone(), None)
                .services(lb_filter)
                .run(|e| Update::Svc(Box::new(e))),
        ),
        Stream::Leases => {
            let (path, fields) = lease_scope(&cfg.announcers);
            tokio::spawn(
                d.collection(path, Some(NOT_PRESENCE.clone()), fields)
                    .run(|e| Update::Lease(Box::new(e))),
            )
        }
        Stream::L2 { namespace } => {
            let path = DynamicObject::url_path(&l2status_resource(), Some(namespace));
            tokio::spawn(
                d.collection(path, None, None)
                    .run(|e| Update::L2(Box::new(e))),
            )
        }
    }
}
