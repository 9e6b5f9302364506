//! The feed running for the life of the daemon: a task per stream, the
//! confirming GETs, a probe of the API, and a [`ClusterView`] published on
//! every change and at every deadline.

use std::{
    sync::{atomic::AtomicBool, Arc},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use k8s_openapi::api::{coordination::v1::Lease, core::v1::Service};
use kube::{api::ListParams, Api, Client, Resource as _};
use tokio::{
    sync::{mpsc, watch},
    task::JoinHandle,
};

use super::{
    cause::Failure,
    confirm::{Confirmation, CONFIRM_TIMEOUT},
    driver,
    feed::Feed,
    model::Key,
    stream::{Msg, StreamCtl, StreamMsg, IDLE_MARGIN},
    wire, FeedConfig,
};
use crate::{model::cluster::ClusterView, telemetry::ops::OPS};

const PROBE_EVERY: Duration = Duration::from_secs(2);
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// A stream failing this long while the API answers has its back-off cut
/// short; one whose request has hung this long while the probe answers
/// within seconds is rebuilt.
const REBUILD_AFTER: Duration = Duration::from_secs(5);
const HUNG_REQUEST: Duration = Duration::from_secs(30);

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

/// GET one Lease, bounded in time (decoded like the stream's: an
/// undecodable answer is an answer, not a failure).
async fn confirm(client: Client, key: Key) -> (Key, Confirmation) {
    let path = Lease::url_path(&(), Some(&key.ns));
    let get = wire::get(&client, &path, &key.name);
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
    generation: u64,
    ctl: Arc<StreamCtl>,
    /// When its back-off was last cut short (or it was last rebuilt).
    last_kick: Instant,
}

/// The loop's state beside the [`Feed`].
struct Task {
    client: Client,
    cfg: FeedConfig,
    feed: Feed,
    running: Vec<Running>,
    msg_tx: mpsc::Sender<StreamMsg>,
    confirm_tx: mpsc::Sender<(Key, Instant, Confirmation)>,
    in_flight: usize,
    next_probe: Instant,
    was_degraded: bool,
    announced_sync: bool,
    /// The API server filters Services by type (cleared when it cannot).
    lb_filter: Arc<AtomicBool>,
}

/// Run the feed for the life of the daemon, publishing into `tx`.
pub async fn run(client: Client, cfg: FeedConfig, tx: watch::Sender<ClusterView>) {
    let (msg_tx, mut msg_rx) = mpsc::channel::<StreamMsg>(4096);
    let (confirm_tx, mut confirm_rx) = mpsc::channel(64);
    let mut t = Task {
        feed: Feed::new(cfg.clone(), Instant::now()),
        client,
        cfg,
        running: Vec::new(),
        msg_tx,
        confirm_tx,
        in_flight: 0,
        next_probe: Instant::now() + PROBE_EVERY,
        was_degraded: false,
        announced_sync: false,
        lb_filter: Arc::new(AtomicBool::new(true)),
    };
    t.running = (0..t.feed.streams.len()).map(|i| t.spawn(i, 0)).collect();
    loop {
        let mut event_at = None;
        tokio::select! {
            m = msg_rx.recv() => {
                let Some(m) = m else { return };
                event_at = Some(Instant::now());
                // Batch what is already waiting: one map update per burst.
                // A stuck stream ends the batch: the blindness it reveals
                // (since its last progress, maybe past the threshold) is
                // published before its relist's answer heals it.
                let mut next = Some(m);
                while let Some(m) = next {
                    let stuck = matches!(m.msg, Msg::Idle(_));
                    t.on_msg(m);
                    next = if stuck { None } else { msg_rx.try_recv().ok() };
                }
            }
            Some((key, sent, answer)) = confirm_rx.recv() => {
                t.in_flight -= 1;
                t.feed.on_confirm(key, sent, answer, Instant::now());
            }
            _ = tokio::time::sleep_until(t.wake().into()) => {}
        }
        t.send_confirmations();
        if Instant::now() >= t.next_probe {
            t.probe().await;
        }
        t.rebuild();
        t.publish(&tx, event_at);
    }
}

impl Task {
    fn spawn(&self, i: usize, generation: u64) -> Running {
        let ctl = Arc::new(StreamCtl::default());
        let stream = &self.feed.streams[i];
        let task = driver::spawn(
            &self.client,
            &self.cfg,
            stream,
            i,
            generation,
            ctl.clone(),
            self.msg_tx.clone(),
            self.lb_filter.clone(),
        );
        Running {
            task,
            generation,
            ctl,
            last_kick: Instant::now(),
        }
    }

    /// The next deadline: a Lease expiry, the staleness threshold, the probe.
    fn wake(&self) -> Instant {
        let now = Instant::now();
        let f = &self.feed;
        [
            f.model.next_expiry(now),
            f.failing_since(now).map(|t| t + f.threshold()),
        ]
        .into_iter()
        .flatten()
        .filter(|t| *t > now)
        .fold(self.next_probe, Instant::min)
    }

    /// A message of a stream's current task (a replaced task's are ignored).
    fn on_msg(&mut self, m: StreamMsg) {
        let current = self.running.get(m.stream);
        if current.is_some_and(|r| r.generation == m.generation) {
            self.feed.on_msg(m.stream, m.msg, Instant::now());
        }
    }

    /// A Lease past its deadline is confirmed before it changes anything.
    fn send_confirmations(&mut self) {
        for key in self.feed.due_confirmations(Instant::now(), self.in_flight) {
            self.in_flight += 1;
            let (client, tx) = (self.client.clone(), self.confirm_tx.clone());
            let sent = Instant::now();
            tokio::spawn(async move {
                let (key, answer) = confirm(client, key).await;
                let _ = tx.send((key, sent, answer)).await;
            });
        }
    }

    /// A one-item list: is the API there at all?
    async fn probe(&mut self) {
        let api = Api::<Service>::all(self.client.clone());
        let lp = ListParams::default().limit(1);
        let probe = tokio::time::timeout(PROBE_TIMEOUT, api.list_metadata(&lp)).await;
        let now = Instant::now();
        match probe {
            Ok(Ok(_)) => {
                self.feed.ok(None, now);
                self.unstick(now);
            }
            Ok(Err(e)) => self.feed.failed(None, &Failure::of("list", &e), now),
            Err(_) => (self.feed).failed(None, &Failure::timeout("list", PROBE_TIMEOUT), now),
        }
        self.next_probe = now + PROBE_EVERY;
    }

    /// The API answers but a stream has not delivered since its error for a
    /// while. Waiting in back-off: cut it short. Hung in a request the probe
    /// shows would have been answered long ago (a connection dead since an
    /// outage): rebuild it. A request merely in flight is left alone.
    fn unstick(&mut self, now: Instant) {
        for (i, h) in self.feed.health.iter().enumerate() {
            let failing = h
                .failing_since
                .is_some_and(|t| now.duration_since(t) >= REBUILD_AFTER);
            let r = &mut self.running[i];
            if !failing || now.duration_since(r.last_kick) < REBUILD_AFTER {
                continue;
            }
            r.last_kick = now;
            match r.ctl.busy_for() {
                None => {
                    tracing::info!(stream = %self.feed.name(i), "Kubernetes API answers again; retrying now");
                    r.ctl.kick();
                }
                Some(busy) if busy >= HUNG_REQUEST => {
                    self.feed.rebuild.entry(i).or_insert("api_back");
                }
                Some(_) => {}
            }
        }
    }

    /// Replace the tasks of streams the feed found stuck.
    fn rebuild(&mut self) {
        for (i, why) in self.feed.take_rebuilds() {
            let name = self.feed.name(i);
            if why == "api_back" {
                tracing::info!(stream = %name, "Kubernetes API answers again, this stream's request hangs; relisting");
            }
            OPS.feed_rebuild(name, why);
            self.running[i].task.abort();
            let generation = self.running[i].generation + 1;
            self.running[i] = self.spawn(i, generation);
        }
    }

    /// Publish the view if it changed; log entering and leaving degradation
    /// and the first sync.
    fn publish(&mut self, tx: &watch::Sender<ClusterView>, event_at: Option<Instant>) {
        let Some(view) = self.feed.changed_view(Instant::now(), event_at) else {
            return;
        };
        let f = &self.feed;
        if view.degraded != self.was_degraded {
            self.was_degraded = view.degraded;
            if view.degraded {
                tracing::warn!(
                    after = ?f.threshold(),
                    error = f.last_error.as_deref().unwrap_or(""),
                    "ownership feed stale: every foreign LB IP is treated as unknown until the API is back \
                     (IPs this node owns stay owned)"
                );
            } else {
                tracing::info!("ownership feed fresh again: foreign LB IPs are enforced again");
            }
        }
        if view.synced && !self.announced_sync {
            self.announced_sync = true;
            tracing::info!(
                services = f.model.services.len(),
                leases = f.model.leases.len(),
                l2statuses = f.model.l2.len(),
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
