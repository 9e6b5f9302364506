//! The feed running for the life of the daemon: a task per stream, the
//! confirming GETs, a probe of the API, and a [`ClusterView`] published on
//! every change and at every deadline.

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

use super::{
    cause::Failure,
    confirm::{Confirmation, CONFIRM_TIMEOUT},
    decode, driver,
    feed::Feed,
    store::Key,
    stream::{Msg, StreamCtl, StreamMsg},
    trust::{self, Trust},
    wire, ClusterConfig, FeedConfig,
};
use crate::{
    model::cluster::ClusterView,
    telemetry::ops::{Ops, Rebuild},
};

/// The probe (is the API there at all?): at most this often...
const PROBE_EVERY: Duration = Duration::from_secs(2);
/// ...and, while the feed is healthy, only once nothing has shown the API
/// alive for a while (a stream's event, bookmark or end of watch does):
/// with Leases renewed every few seconds it never runs. Its failure makes
/// the guard blind since that last sign of life, so a quieter probe never
/// delays degradation as long as it fails before the staleness threshold:
/// it runs [`PROBE_TIMEOUT`] and a second before it, and not more often
/// than every [`PROBE_QUIET_MIN`]. On a quiet cluster (MetalLB: nothing
/// renewed) that is one cached GET per 12 s per guard at the default 15 s
/// threshold, the largest of a guard's steady requests.
const PROBE_QUIET_MIN: Duration = Duration::from_secs(5);
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// A stream failing this long while the API answers has its back-off cut
/// short; one whose request has hung this long while the probe answers
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
                let c = client(cfg.kubeconfig.as_deref()).await;
                let ok = c.is_ok();
                let _ = ready_tx.send(c.as_ref().map(drop).map_err(|e| anyhow::anyhow!("{e:#}")));
                if let (true, Ok(client)) = (ok, c) {
                    run(client, cfg.feed, tx, ops).await;
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
    // No read timer in the client: every request the feed makes is bounded
    // by its own (a list page and a watch's silence by the idle deadline,
    // a probe and a confirming GET by theirs), and a read timer re-armed for
    // every chunk of every watch is a cost per event.
    config.read_timeout = None;
    let url = config.cluster_url.clone();
    match trust::settle(&mut config) {
        Trust::System => Client::try_from(config).with_context(|| {
            format!(
                "building the Kubernetes client (the configuration names no CA for {url}, so \
                 the system's CA bundle is needed: give the kubeconfig \
                 certificate-authority(-data), or the container \
                 /etc/ssl/certs/ca-certificates.crt or SSL_CERT_FILE)"
            )
        }),
        Trust::OwnCa | Trust::Unverified => {
            Client::try_from(config).context("building the Kubernetes client")
        }
    }
}

/// How long a healthy feed waits after its last sign of life before it
/// probes, for a staleness `threshold`: the probe fails (times out) a
/// second before the threshold, so that blindness is still seen in time.
fn probe_quiet(threshold: Duration) -> Duration {
    (threshold.saturating_sub(PROBE_TIMEOUT + Duration::from_secs(1))).max(PROBE_QUIET_MIN)
}

/// When the probe is due: not before `next` (spacing); while the feed is
/// `healthy`, not before `quiet` after its last sign of life.
fn probe_at(next: Instant, healthy: bool, last_alive: Instant, quiet: Duration) -> Instant {
    if healthy {
        next.max(last_alive + quiet)
    } else {
        next
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
pub async fn run(client: Client, cfg: FeedConfig, tx: watch::Sender<ClusterView>, ops: Arc<Ops>) {
    let (msg_tx, mut msg_rx) = mpsc::channel::<StreamMsg>(4096);
    let (confirm_tx, mut confirm_rx) = mpsc::channel(64);
    let mut t = Task {
        feed: Feed::new(cfg.clone(), Instant::now(), ops),
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
    // One timer for the loop's deadlines, moved only when the next one
    // changes (not re-armed for every event).
    let deadline = tokio::time::sleep_until(t.wake().into());
    tokio::pin!(deadline);
    loop {
        let mut event_at = None;
        let wake = tokio::time::Instant::from_std(t.wake());
        if deadline.deadline() != wake {
            deadline.as_mut().reset(wake);
        }
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
            _ = &mut deadline => {}
        }
        t.send_confirmations();
        if t.probe_due(Instant::now()) {
            t.probe().await;
        }
        t.rebuild();
        t.publish(&tx, event_at);
    }
}

impl Task {
    fn spawn(&self, i: usize, generation: u64) -> Running {
        let ctl = Arc::new(StreamCtl::default());
        let stream = &self.feed.streams[i].kind;
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
            f.store.next_expiry(now),
            f.failing_since(now).map(|t| t + f.threshold()),
        ]
        .into_iter()
        .flatten()
        .filter(|t| *t > now)
        .fold(self.probe_at(), Instant::min)
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

    /// The probe is due: spaced by [`PROBE_EVERY`], and, while all is
    /// well, only after [`PROBE_QUIET`] without a sign of life.
    fn probe_due(&self, now: Instant) -> bool {
        now >= self.probe_at()
    }

    /// When the probe is next due (the loop wakes then: one rule for both).
    fn probe_at(&self) -> Instant {
        probe_at(
            self.next_probe,
            self.feed.all_healthy(),
            self.feed.last_alive(),
            probe_quiet(self.feed.threshold()),
        )
    }

    /// Is the API there at all? The `kubernetes` Service, from the API
    /// server's cache (`resourceVersion=0`: no etcd read): any answer,
    /// 404 included, is one.
    async fn probe(&mut self) {
        let since = self.feed.last_alive();
        let path = Service::url_path(&(), Some("default"));
        let get = wire::get::<decode::Service>(&self.client, &path, "kubernetes", true);
        let probe = tokio::time::timeout(PROBE_TIMEOUT, get).await;
        let now = Instant::now();
        match probe {
            Ok(Ok(_)) => {
                self.feed.ok(None, now);
                self.unstick(now);
            }
            Ok(Err(e)) => self.feed.failed(None, &Failure::of("get", &e), since),
            Err(_) => (self.feed).failed(None, &Failure::timeout("get", PROBE_TIMEOUT), since),
        }
        self.next_probe = now + PROBE_EVERY;
    }

    /// The API answers but a stream has not delivered since its error for a
    /// while. Waiting in back-off: cut it short. Hung in a request the probe
    /// shows would have been answered long ago (a connection dead since an
    /// outage): rebuild it. A request merely in flight is left alone.
    fn unstick(&mut self, now: Instant) {
        for (i, s) in self.feed.streams.iter().enumerate() {
            let failing =
                (s.health.failing_since).is_some_and(|t| now.duration_since(t) >= REBUILD_AFTER);
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
                    self.feed.rebuild.entry(i).or_insert(Rebuild::ApiBack);
                }
                Some(_) => {}
            }
        }
    }

    /// Replace the tasks of streams the feed found stuck.
    fn rebuild(&mut self) {
        for (i, why) in self.feed.take_rebuilds() {
            let name = self.feed.name(i);
            if why == Rebuild::ApiBack {
                tracing::info!(stream = %name, "Kubernetes API answers again, this stream's request hangs; relisting");
            }
            self.feed.ops.feed_rebuild(name, why);
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
                services = f.store.services.len(),
                leases = f.store.leases.len(),
                l2statuses = f.store.l2.len(),
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

    /// The loop sleeps until the probe is due, and the probe runs then: a
    /// time in the past that the probe's rule does not call due would be a
    /// busy loop.
    #[test]
    fn the_probe_runs_when_the_loop_wakes_for_it() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let q = probe_quiet(s(15));
        // Quiet and healthy: 12 s after the last sign of life at the default
        // 15 s threshold (its timeout ends a second before the threshold).
        assert_eq!(q, s(12));
        assert_eq!(probe_at(t0, true, t0, q), t0 + q);
        // A stream delivered a moment ago: later still.
        assert_eq!(probe_at(t0, true, t0 + s(3), q), t0 + s(3) + q);
        // Failing: every PROBE_EVERY, whatever the last sign of life.
        assert_eq!(probe_at(t0 + s(2), false, t0 + s(9), q), t0 + s(2));
        // Spacing is kept either way.
        assert_eq!(probe_at(t0 + s(13), true, t0, q), t0 + s(13));
        // A short threshold: never more often than PROBE_QUIET_MIN.
        assert_eq!(probe_quiet(s(3)), PROBE_QUIET_MIN);
        assert!(probe_quiet(s(60)) + PROBE_TIMEOUT < s(60));
    }
}
