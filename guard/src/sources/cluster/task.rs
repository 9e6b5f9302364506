//! The feed running for the life of the daemon: a task per stream (each
//! applies and publishes what it reads, through the [`Hub`]), the
//! confirming GETs, an API check of the API, and the deadlines.

use std::{
    sync::{atomic::AtomicBool, Arc},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use k8s_openapi::api::{coordination::v1::Lease, core::v1::Service};
use kube::{Client, Resource as _};
use tokio::{
    sync::{mpsc, watch},
    task::JoinHandle,
};

use super::per_stream::{PerStream, StreamId};
use super::{
    cause::Failure,
    confirm::{Confirmation, CONFIRM_TIMEOUT},
    decode,
    dial::Dialer,
    driver,
    feed::Feed,
    hub::{AskWatch, Hub, CHECK_TIMEOUT},
    listwatch::StreamCtl,
    store::Key,
    wire, ClusterConfig, FeedConfig,
};
use guard_wire::{connect::Trust, kubeconfig};

use crate::{
    model::cluster::ClusterView,
    ops::{Ops, Rebuild},
};

/// A stream failing this long while the API answers has its back-off cut
/// short; one whose request has hung this long while the API check answers
/// within seconds is rebuilt.
const REBUILD_AFTER: Duration = Duration::from_secs(5);
const HUNG_REQUEST: Duration = Duration::from_secs(30);

/// Start the feed on a thread of its own, with a single-threaded runtime:
/// the client (its connection tasks), the streams, the confirmations and the
/// store all live there, so that a watch event wakes one thread and nothing
/// else (the daemon's loop is woken only when the view changes). A client
/// that cannot be configured is a start-up error. The feed counts into `ops`.
pub async fn start(cfg: ClusterConfig, ops: Arc<Ops>) -> Result<watch::Receiver<ClusterView>> {
    let (tx, rx) = watch::channel(ClusterView::default());
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<Result<()>>();
    std::thread::Builder::new()
        .name("kube-feed".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            let rt = match rt {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = ready_tx.send(Err(e).context("the Kubernetes feed's runtime"));
                    return;
                }
            };
            rt.block_on(async move {
                let c = connections(cfg.kubeconfig.as_deref()).await;
                let ok = c.is_ok();
                let _ = ready_tx.send(c.as_ref().map(drop).map_err(|e| anyhow::anyhow!("{e:#}")));
                if let (true, Ok(conns)) = (ok, c) {
                    run(conns, cfg.feed, tx, ops).await;
                }
            });
        })
        .context("starting the Kubernetes feed's thread")?;
    ready_rx
        .await
        .context("the Kubernetes feed's thread ended at start")??;
    Ok(rx)
}

/// Build a client from `kubeconfig`, else the usual inference (in-cluster
/// service account, then $KUBECONFIG / ~/.kube/config).
pub async fn client(kubeconfig: Option<&std::path::Path>) -> Result<Client> {
    let (config, trust) = config(kubeconfig).await?;
    client_of(config, trust)
}

/// The client and the watch connections, from one configuration.
pub async fn connections(kubeconfig: Option<&std::path::Path>) -> Result<(Client, Dialer)> {
    let (config, trust) = config(kubeconfig).await?;
    // The client first: its errors carry the advice (a CA bundle to mount).
    let client = client_of(config.clone(), trust)?;
    let dialer = Dialer::new(&config).context("configuring the Kubernetes watch connections")?;
    Ok((client, dialer))
}

/// The configuration, and the TLS trust it was settled to: read as kubectl
/// reads it (`guard_wire::kubeconfig`: `kubeconfig`, else $KUBECONFIG or
/// ~/.kube/config, else the Pod's service account), with the proxy kubectl
/// would take for the server, in a Pod too (client-go reads the
/// environment there like anywhere else; kube-rs's in-cluster configuration
/// does not).
async fn config(kubeconfig: Option<&std::path::Path>) -> Result<(kube::Config, Trust)> {
    // Several rustls providers could be compiled in; name ours. An error only
    // means one is installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (mut config, proxy_url) = kubeconfig::load(kubeconfig, None).await?;
    // No read timer in the client: every request the feed makes is bounded
    // by its own (a list page and a watch's silence by the idle deadline,
    // an API check and a confirming GET by theirs), and a read timer re-armed for
    // every chunk of every watch is a cost per event.
    config.read_timeout = None;
    let proxy =
        kubeconfig::settle_proxy(&mut config, proxy_url.as_deref(), |n| std::env::var(n).ok())?;
    if let Some(p) = proxy {
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| {
            tracing::info!(
                proxy = %guard_wire::connect::without_credentials(&p.url), from = p.from,
                server = %config.cluster_url, "reaching the Kubernetes API through a proxy"
            );
        });
    }
    let trust = kubeconfig::settle_trust(&mut config);
    Ok((config, trust))
}

fn client_of(config: kube::Config, trust: Trust) -> Result<Client> {
    let url = config.cluster_url.clone();
    match trust {
        Trust::System => kubeconfig::client(config).with_context(|| {
            format!(
                "building the Kubernetes client (the configuration names no CA for {url}, so \
                 the system's CA bundle is needed: give the kubeconfig \
                 certificate-authority(-data), or the container \
                 /etc/ssl/certs/ca-certificates.crt or SSL_CERT_FILE)"
            )
        }),
        Trust::OwnCa | Trust::Unverified => {
            kubeconfig::client(config).context("building the Kubernetes client")
        }
    }
}

/// GET one Lease, bounded in time (decoded like the stream's: an
/// undecodable answer is an answer, not a failure).
async fn confirm(client: Client, key: Key) -> (Key, Confirmation) {
    let path = Lease::url_path(&(), Some(&key.ns));
    let get = wire::get(&client, &path, &key.name, false);
    let r = match tokio::time::timeout(CONFIRM_TIMEOUT, get).await {
        Ok(Ok(l)) => Ok(l),
        Ok(Err(e)) => Err(Failure::of("get", &e)),
        Err(_) => Err(Failure::timeout("get", CONFIRM_TIMEOUT)),
    };
    (key, r)
}

/// One stream's task and what the loop keeps about it.
struct Running {
    task: JoinHandle<()>,
    ctl: Arc<StreamCtl>,
    /// When its back-off was last cut short (or it was last rebuilt).
    last_kick: Instant,
}

/// The loop's state beside the [`Hub`] it shares with the streams' tasks.
struct Task {
    client: Client,
    dialer: Dialer,
    cfg: FeedConfig,
    hub: Arc<Hub>,
    running: PerStream<Running>,
    confirm_tx: mpsc::Sender<(Key, Instant, Confirmation)>,
    in_flight: usize,
    /// The API check's answer (what it failed with, if it did), sent by its
    /// own task: the loop never waits on the API.
    check_tx: mpsc::Sender<Result<(), Failure>>,
    /// The API server filters Services by type (cleared when it cannot).
    lb_filter: Arc<AtomicBool>,
}

/// Run the feed for the life of the daemon, publishing into `tx`. The
/// streams' tasks apply and publish what they read; this loop wakes when
/// they ask it to, for a confirmation's answer, and at its deadlines.
pub async fn run(
    (client, dialer): (Client, Dialer),
    cfg: FeedConfig,
    tx: watch::Sender<ClusterView>,
    ops: Arc<Ops>,
) {
    let (confirm_tx, mut confirm_rx) = mpsc::channel(64);
    let (check_tx, mut check_rx) = mpsc::channel(1);
    let now = Instant::now();
    let hints = ops.clone();
    let hub = Arc::new(Hub::new(Feed::new(cfg.clone(), now, ops), tx, now));
    let mut t = Task {
        client,
        dialer,
        cfg,
        hub: hub.clone(),
        running: PerStream::new(Vec::new()),
        confirm_tx,
        in_flight: 0,
        check_tx,
        lb_filter: Arc::new(AtomicBool::new(true)),
    };
    let streams = hub.lock().generations.map(|_| ());
    t.running = streams.map(|i| t.spawn(i, 0));
    // One timer for the loop's deadlines, moved only when the next one
    // changes (not re-armed for every event: most never reach the loop).
    let deadline = tokio::time::sleep_until(Instant::now().into());
    tokio::pin!(deadline);
    loop {
        let wake = {
            let mut c = hub.lock();
            c.armed = c.wake(Instant::now());
            tokio::time::Instant::from_std(c.armed)
        };
        if deadline.deadline() != wake {
            deadline.as_mut().reset(wake);
        }
        tokio::select! {
            () = hub.woken() => {}
            Some((key, sent, answer)) = confirm_rx.recv() => {
                t.in_flight -= 1;
                hub.lock().feed.on_confirm(key, sent, answer, Instant::now());
            }
            Some(answer) = check_rx.recv() => t.on_check(answer),
            () = hints.api_hint.notified() => hub.lock().hinted(Instant::now()),
            _ = &mut deadline => {}
        }
        if let Some(task) = hub.lock().panicked.take() {
            tracing::error!(%task, "a task of the Kubernetes feed panicked: stopping the feed");
            return;
        }
        t.send_confirmations();
        if hub.lock().check_due(Instant::now()) {
            t.check_api();
        }
        t.rebuild();
        hub.lock().publish(Instant::now(), None);
    }
}

impl Task {
    fn spawn(&self, i: StreamId, generation: u64) -> Running {
        let ctl = Arc::new(StreamCtl::default());
        let stream = self.hub.lock().feed.streams[i].kind.clone();
        let to = driver::To {
            stream: i,
            generation,
            ctl: ctl.clone(),
            hub: self.hub.clone(),
        };
        let task = driver::spawn(
            (&self.client, &self.dialer),
            &self.cfg,
            &stream,
            to,
            self.lb_filter.clone(),
        );
        Running {
            task,
            ctl,
            last_kick: Instant::now(),
        }
    }

    /// A Lease past its deadline is confirmed before it changes anything.
    fn send_confirmations(&mut self) {
        let due = (self.hub.lock().feed).due_confirmations(Instant::now(), self.in_flight);
        for key in due {
            self.in_flight += 1;
            let (client, tx) = (self.client.clone(), self.confirm_tx.clone());
            let sent = Instant::now();
            let hub = self.hub.clone();
            tokio::spawn(async move {
                let _panic = AskWatch {
                    hub,
                    what: "a confirming GET",
                };
                let (key, answer) = confirm(client, key).await;
                let _ = tx.send((key, sent, answer)).await;
            });
        }
    }

    /// Is the API there at all? The `kubernetes` Service, from the API
    /// server's cache (`resourceVersion=0`: no etcd read): any answer,
    /// 404 included, is one. Asked in a task of its own, so that the loop's
    /// deadlines (a Lease's expiry: a takeover) never wait on the API.
    fn check_api(&mut self) {
        self.hub.lock().check_asked(Instant::now());
        let (client, tx, hub) = (self.client.clone(), self.check_tx.clone(), self.hub.clone());
        tokio::spawn(async move {
            let _panic = AskWatch {
                hub,
                what: "the API check",
            };
            let path = Service::url_path(&(), Some("default"));
            let get = wire::get::<decode::Service>(&client, &path, "kubernetes", true);
            let answer = match tokio::time::timeout(CHECK_TIMEOUT, get).await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(e)) => Err(Failure::of("get", &e)),
                Err(_) => Err(Failure::timeout("get", CHECK_TIMEOUT)),
            };
            let _ = tx.send(answer).await;
        });
    }

    /// The API check's answer: alive, or failing since the feed's last sign
    /// of life (read now: a stream may have delivered while it was out).
    fn on_check(&mut self, answer: Result<(), Failure>) {
        let now = Instant::now();
        let hub = self.hub.clone();
        let mut c = hub.lock();
        if c.check_answered(answer, now) {
            self.unstick(&mut c.feed, now);
        }
    }

    /// The API answers but a stream has not delivered since its error for a
    /// while. Waiting in back-off: cut it short. Hung in a request the API check
    /// shows would have been answered long ago (a connection dead since an
    /// outage): rebuild it. A request merely in flight is left alone.
    fn unstick(&mut self, feed: &mut Feed, now: Instant) {
        for (i, s) in feed.streams.enumerate() {
            let failing =
                (s.health.failing_since).is_some_and(|t| now.duration_since(t) >= REBUILD_AFTER);
            let r = &mut self.running[i];
            if !failing || now.duration_since(r.last_kick) < REBUILD_AFTER {
                continue;
            }
            r.last_kick = now;
            match r.ctl.busy_for() {
                None => {
                    tracing::info!(stream = %feed.name(i), "Kubernetes API answers again; retrying now");
                    r.ctl.kick();
                }
                Some(busy) if busy >= HUNG_REQUEST => {
                    feed.rebuild.entry(i).or_insert(Rebuild::ApiBack);
                }
                Some(_) => {}
            }
        }
    }

    /// Replace the tasks of streams the feed found stuck: the old task's
    /// messages are dropped from now on, and it is stopped.
    fn rebuild(&mut self) {
        let rebuilds = self.hub.lock().feed.take_rebuilds();
        for (i, why) in rebuilds {
            let generation = {
                let mut c = self.hub.lock();
                let name = c.feed.name(i).to_owned();
                if why == Rebuild::ApiBack {
                    tracing::info!(stream = %name, "Kubernetes API answers again, this stream's request hangs; relisting");
                }
                c.feed.ops.feed_rebuild(&name, why);
                c.generations[i] += 1;
                c.generations[i]
            };
            self.running[i].task.abort();
            self.running[i] = self.spawn(i, generation);
        }
    }
}
