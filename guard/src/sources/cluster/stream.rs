//! The streams the feed reads (one list+watch per resource), what they
//! report, and the control the feed has over them. The list+watch itself
//! is `driver`'s.

use std::{
    collections::BTreeSet,
    sync::atomic::{AtomicU64, Ordering::Relaxed},
    time::{Duration, Instant},
};

use k8s_openapi::api::coordination::v1::Lease;
use kube::{
    api::{ApiResource, GroupVersionKind},
    Resource as _,
};

use super::{
    cause::Failure,
    decode::{self, Obj},
    store::Announcer,
};

/// A healthy stream shows progress (an event, a bookmark, or the server
/// ending the watch) at least every watch timeout; this much later it is stuck.
pub const IDLE_MARGIN: Duration = Duration::from_secs(10);
/// Node heartbeats: thousands of renewals a minute on a big cluster, never an announcer's.
const NODE_LEASES_NS: &str = "kube-node-lease";
/// Services are listed and watched with this field selector where the
/// server supports it (Kubernetes 1.31+): the others never reach the guard.
pub const LB_SERVICES: &str = "spec.type=LoadBalancer";

/// What a stream saw of one object, or of its collection.
pub enum Event<T> {
    /// A relist begins: until [`Event::ListDone`] the objects that follow
    /// are the whole collection.
    Listing,
    Listed(Obj<T>),
    ListDone,
    /// Added or changed (a Service that stopped being of type
    /// LoadBalancer comes as [`Event::Delete`]: it is no longer guarded).
    Apply(Obj<T>),
    /// Gone (its content does not matter, only its key).
    Delete(Obj<T>),
}

/// An event of one of the kinds the feed reads.
pub enum Update {
    Svc(Box<Event<decode::Service>>),
    Lease(Box<Event<decode::Lease>>),
    L2(Box<Event<decode::ServiceL2Status>>),
}

impl Update {
    /// A listed object (buffered in its relist until the relist's end).
    pub(super) fn is_listed(&self) -> bool {
        match self {
            Update::Svc(e) => matches!(**e, Event::Listed(_)),
            Update::Lease(e) => matches!(**e, Event::Listed(_)),
            Update::L2(e) => matches!(**e, Event::Listed(_)),
        }
    }
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
/// live in each Service's namespace) without the node heartbeats. The
/// collection's path and the field selector.
pub fn lease_scope(announcers: &[Announcer]) -> (String, Option<String>) {
    let namespaces: BTreeSet<Option<&str>> = announcers
        .iter()
        .filter_map(|a| match a {
            Announcer::Cilium { namespace } => Some(Some(namespace.as_str())),
            Announcer::KubeVipGlobal { lease } => Some(Some(&*lease.ns)),
            Announcer::KubeVipPerService => Some(None),
            Announcer::MetalLb { .. } => None,
        })
        .collect();
    match namespaces.iter().collect::<Vec<_>>().as_slice() {
        [Some(ns)] => (Lease::url_path(&(), Some(ns)), None),
        _ => (
            Lease::url_path(&(), None),
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
