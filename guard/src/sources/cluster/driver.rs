//! The feed's streams on the one list+watch loop (`listwatch`): what each
//! follows, and the sink that hands what it reads to the feed in the task
//! itself ([`Hub::deliver`]).

use std::sync::{atomic::AtomicBool, Arc};

use k8s_openapi::api::core::v1::Service;
use kube::{api::DynamicObject, Client, Resource as _};
use tokio::task::JoinHandle;

use super::per_stream::StreamId;
use super::{
    dial::Dialer,
    hub::{Hub, PanicWatch},
    listwatch::{Closed, Collection, Event, Follow, Sink, Step, StreamCtl},
    stream::{l2status_resource, lease_scope, Msg, Stream, Update},
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

/// Who a stream's task reports to, as what.
pub(super) struct To {
    pub stream: StreamId,
    pub generation: u64,
    pub ctl: Arc<StreamCtl>,
    pub hub: Arc<Hub>,
}

/// A stream's steps into the feed, as messages of the kind it reads.
struct FeedSink<T> {
    hub: Arc<Hub>,
    stream: StreamId,
    generation: u64,
    wrap: fn(Event<T>) -> Update,
    /// Tells the loop when the task ends by a panic.
    _panic: PanicWatch,
}

impl<T: Send> Sink<T> for FeedSink<T> {
    async fn send(&mut self, step: Step<T>, more: bool) -> Result<(), Closed> {
        let msg = match step {
            Step::Event(e) => Msg::Update((self.wrap)(e)),
            Step::Progress => Msg::Progress,
            Step::Failed(f) => Msg::Failed(f),
            Step::Silent(f, d) => Msg::Silent(f, d),
            Step::Idle(d) => Msg::Idle(d),
        };
        (self.hub)
            .deliver((self.stream, self.generation), msg, more)
            .map_err(|_| Closed)
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
    fn follow<T: super::decode::Object>(
        conns: (Client, Dialer),
        c: Collection,
        cfg: &FeedConfig,
        to: To,
        wrap: fn(Event<T>) -> Update,
    ) -> JoinHandle<()> {
        let sink = FeedSink {
            hub: to.hub.clone(),
            stream: to.stream,
            generation: to.generation,
            wrap,
            _panic: PanicWatch {
                hub: to.hub,
                stream: to.stream,
                generation: to.generation,
            },
        };
        let c = Collection { page: PAGE, ..c };
        tokio::spawn(Follow::new(conns, c, cfg.watch_timeout, to.ctl, sink).run::<T>())
    }
    let conns = (client.clone(), dialer.clone());
    match stream {
        Stream::Services => {
            let c = Collection {
                path: Service::url_path(&(), None),
                labels: cfg.selector.clone(),
                lb_filter: Some(lb_filter),
                ..Default::default()
            };
            follow(conns, c, cfg, to, |e| Update::Svc(Box::new(e)))
        }
        Stream::Leases => {
            let (path, fields) = lease_scope(&cfg.announcers);
            let c = Collection {
                path,
                labels: Some(NOT_PRESENCE.clone()),
                fields,
                ..Default::default()
            };
            follow(conns, c, cfg, to, |e| Update::Lease(Box::new(e)))
        }
        Stream::L2 { namespace } => {
            let c = Collection {
                path: DynamicObject::url_path(&l2status_resource(), Some(namespace)),
                ..Default::default()
            };
            follow(conns, c, cfg, to, |e| Update::L2(Box::new(e)))
        }
    }
}
