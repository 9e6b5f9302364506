//! Presence in the Kubernetes API (the record and the table are
//! `model::presence`'s). This guard writes its own Lease `arp-guard-<node>`
//! in its namespace when its record changes (`record`), follows every
//! presence Lease with one watch and the guard Pods' readiness with another
//! (`follow`), and reads the cluster's Nodes only when that is worth it
//! (`nodes`). With nothing changing a guard costs the API server two watch
//! requests per watch timeout (`--kube-watch-timeout`: [5, 10) minutes) and nothing else, however many
//! guards there are; a guard joining or leaving is one record and its
//! Pod's few status changes, delivered once to every guard. On SIGTERM the
//! Lease is deleted; a guard killed otherwise is no longer live once its
//! Pod is not Ready.
//!
//! On a thread and runtime of its own, every request bounded in time:
//! nothing here can delay or block guarding; failures are logged once per
//! kind, counted and shown in `/cluster`, and the last table read is kept.

use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use kube::Client;
use tokio::sync::{mpsc, Notify};

mod apply;
pub mod follow;
mod nodes;
mod objects;
mod record;
mod request;

use follow::{Collection, Step};
use objects::Pod;
pub use request::PresenceError;
use request::Result;

use crate::{
    model::presence::{self, GuardPods, Record, Seen, Table},
    ops::{ErrorCause, Ops},
    sources::cluster::{decode::Lease, dial::Dialer},
};

/// Deleting the Lease at exit waits at most this long.
pub const LEAVE_TIMEOUT: Duration = Duration::from_secs(2);
/// While this guard is degraded in its first this-long (its feed not synced
/// yet), its record is not written: a restart with nothing changed writes
/// nothing at all.
const STARTUP_GRACE: Duration = Duration::from_secs(30);
/// Failed writes are retried after a back-off of at most this long.
const WRITE_BACKOFF_MAX: Duration = Duration::from_secs(300);

#[derive(Debug, Clone)]
pub struct PresenceConfig {
    pub kubeconfig: Option<PathBuf>,
    /// None: the client's default (the service account's namespace, else
    /// the kubeconfig context's).
    pub namespace: Option<String>,
    /// This node (set at start, once its name is known).
    pub node: String,
    /// How often this guard's record is compared with what it wrote (a
    /// local check: the Lease is written only when they differ).
    pub period: Duration,
    /// The label selector of the guard Pods in the namespace (liveness).
    pub pods: String,
    /// Each watch asks for a random time in [this, twice this)
    /// (`--kube-watch-timeout`).
    pub watch_min: Duration,
}

/// What the task reads from the daemon, and where it publishes.
pub struct Hooks {
    /// This guard's record now.
    pub record: Box<dyn Fn() -> Record + Send>,
    pub publish: Box<dyn Fn(Seen) + Send>,
    /// Notified when someone asks for the cluster's Nodes (`/cluster`).
    pub nodes_wanted: Arc<Notify>,
}

/// The running task: [`Handle::leave`] deletes the Lease and ends it.
pub struct Handle {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    done: std::sync::mpsc::Receiver<()>,
}

impl Handle {
    /// Delete this guard's Lease (waiting at most [`LEAVE_TIMEOUT`] and a bit).
    pub fn leave(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
            let _ = self
                .done
                .recv_timeout(LEAVE_TIMEOUT + Duration::from_millis(500));
        }
    }
}

/// Start presence on a thread of its own.
pub fn start(cfg: PresenceConfig, hooks: Hooks, ops: Arc<Ops>) -> Result<Handle, PresenceError> {
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    let (done_tx, done) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("presence".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            match rt {
                Ok(rt) => rt.block_on(run(cfg, hooks, stop_rx, ops)),
                Err(e) => tracing::warn!(error = %e, "presence cannot start its runtime; guarding without it"),
            }
            let _ = done_tx.send(());
        })
        .map_err(PresenceError::Thread)?;
    Ok(Handle {
        stop: Some(stop_tx),
        done,
    })
}

/// The requests and streams of presence, each logged and counted on its own.
#[derive(Debug, Clone, Copy)]
enum Call {
    /// This guard's Lease.
    Write,
    /// The presence Leases' list and watch.
    Records,
    /// The guard Pods' list and watch.
    Pods,
    /// The cluster's Nodes.
    Nodes,
}

impl Call {
    /// Its name in the logs and in `/cluster`'s errors.
    fn as_str(self) -> &'static str {
        match self {
            Call::Write => "write",
            Call::Records => "records",
            Call::Pods => "pods",
            Call::Nodes => "nodes",
        }
    }

    /// What a failure of it counts as.
    fn cause(self) -> ErrorCause {
        match self {
            Call::Write => ErrorCause::PresenceWrite,
            Call::Records | Call::Pods => ErrorCause::PresenceList,
            Call::Nodes => ErrorCause::PresenceNodes,
        }
    }
}

/// The loop's state.
struct Task {
    own: record::Own,
    cfg: PresenceConfig,
    seen: Seen,
    table: Table,
    pods: GuardPods,
    /// Each stream's list arrived at least once.
    records_listed: bool,
    pods_listed: bool,
    /// The Pods cannot be read for want of permission (liveness falls back
    /// to "a record is live").
    pods_refused: bool,
    /// That no guard Pod runs on this node was logged (once until one does).
    no_own_pod_said: bool,
    nodes_read: Option<Instant>,
    /// No write before this (after failed ones), and how many failed in a row.
    write_after: Option<Instant>,
    write_failures: u32,
    started: Instant,
    /// Errors already logged (once per kind until it works again).
    logged: BTreeMap<&'static str, String>,
    ops: Arc<Ops>,
    /// Something to publish.
    dirty: bool,
}

async fn run(
    cfg: PresenceConfig,
    hooks: Hooks,
    mut stop: tokio::sync::oneshot::Receiver<()>,
    ops: Arc<Ops>,
) {
    let (client, dialer) = match crate::sources::cluster::task::connections(
        cfg.kubeconfig.as_deref(),
    )
    .await
    {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %format!("{e:#}"), "presence: no Kubernetes client; guarding without it");
            return;
        }
    };
    let namespace =
        (cfg.namespace.clone()).unwrap_or_else(|| client.default_namespace().to_owned());
    let (records_rx, pods_rx) = spawn_followers(&dialer, &client, &namespace, &cfg);
    let mut t = Task::new(client, namespace, cfg, ops);
    tracing::info!(namespace = %t.seen.namespace, lease = %t.own.lease, pods = %t.cfg.pods, "publishing this guard's presence");
    t.run(hooks, records_rx, pods_rx, &mut stop).await;
    t.own.leave().await;
}

/// The two watches, each on a task of its own.
fn spawn_followers(
    dialer: &Dialer,
    client: &Client,
    namespace: &str,
    cfg: &PresenceConfig,
) -> (mpsc::Receiver<Step<Lease>>, mpsc::Receiver<Step<Pod>>) {
    let (records_tx, records_rx) = mpsc::channel(256);
    let (pods_tx, pods_rx) = mpsc::channel(256);
    tokio::spawn(follow::follow(
        Collection {
            client: client.clone(),
            dialer: dialer.clone(),
            path: format!("/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"),
            labels: format!("{}={}", presence::LABEL, presence::LABEL_VALUE),
            watch_min: cfg.watch_min,
        },
        records_tx,
    ));
    tokio::spawn(follow::follow(
        Collection {
            client: client.clone(),
            dialer: dialer.clone(),
            path: format!("/api/v1/namespaces/{namespace}/pods"),
            labels: cfg.pods.clone(),
            watch_min: cfg.watch_min,
        },
        pods_tx,
    ));
    (records_rx, pods_rx)
}

impl Task {
    fn new(client: Client, namespace: String, cfg: PresenceConfig, ops: Arc<Ops>) -> Task {
        Task {
            own: record::Own {
                client,
                namespace: namespace.clone(),
                node: cfg.node.clone(),
                lease: presence::lease_name(&cfg.node),
                stored: None,
                rv: None,
            },
            seen: Seen {
                namespace,
                ..Seen::default()
            },
            cfg,
            table: Table::default(),
            pods: GuardPods::default(),
            records_listed: false,
            pods_listed: false,
            pods_refused: false,
            no_own_pod_said: false,
            nodes_read: None,
            write_after: None,
            write_failures: 0,
            started: Instant::now(),
            logged: BTreeMap::new(),
            ops,
            dirty: false,
        }
    }

    async fn run(
        &mut self,
        hooks: Hooks,
        mut records: mpsc::Receiver<Step<Lease>>,
        mut pods: mpsc::Receiver<Step<Pod>>,
        stop: &mut tokio::sync::oneshot::Receiver<()>,
    ) {
        let mut tick = tokio::time::interval(self.cfg.period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    self.check_record((hooks.record)()).await;
                    self.keep_coverage(false).await;
                }
                Some(s) = records.recv() => {
                    let first = !self.records_listed;
                    self.on_record(s);
                    while let Ok(s) = records.try_recv() {
                        self.on_record(s);
                    }
                    // The records are known: this guard's own goes out now,
                    // not a period later.
                    if first && self.records_listed {
                        self.check_record((hooks.record)()).await;
                    }
                }
                Some(s) = pods.recv() => {
                    self.on_pod(s);
                    while let Ok(s) = pods.try_recv() {
                        self.on_pod(s);
                    }
                }
                () = hooks.nodes_wanted.notified() => self.keep_coverage(true).await,
                _ = &mut *stop => return,
            }
            if std::mem::take(&mut self.dirty) {
                self.seen.table = Arc::new(self.table.clone());
                (hooks.publish)(self.seen.clone());
            }
        }
    }

    /// Write the record if it is not what the API holds. Not before the
    /// records were listed (the Lease may be there already, as it is), nor
    /// while this guard is degraded in its first seconds.
    async fn check_record(&mut self, r: Record) {
        let listed = self.records_listed || self.seen.errors.contains_key("records");
        let starting = r.health == "degraded" && self.started.elapsed() < STARTUP_GRACE;
        let waiting = self.write_after.is_some_and(|t| Instant::now() < t);
        if !listed || starting || waiting || !self.own.differs(&r) {
            return;
        }
        let ops = self.ops.clone();
        let w = self
            .own
            .write(&r, || ops.error(ErrorCause::PresenceConflict))
            .await;
        // A write refused (a missing Role, an API that is down) is tried
        // again after a back-off doubling from one period up to 5 minutes,
        // not every period on every node.
        self.write_after = match &w {
            Ok(()) => {
                self.write_failures = 0;
                None
            }
            Err(_) => {
                let wait = (self.cfg.period * 2u32.saturating_pow(self.write_failures.min(8)))
                    .min(WRITE_BACKOFF_MAX);
                self.write_failures += 1;
                Some(Instant::now() + wait)
            }
        };
        self.outcome(Call::Write, w);
        self.set_published();
    }

    fn set_published(&mut self) {
        let published = self.own.stored.is_some() && !self.seen.errors.contains_key("write");
        if published != self.seen.published {
            self.seen.published = published;
            self.dirty = true;
        }
    }

    /// The view moved (or was confirmed current): published.
    fn progress(&mut self) {
        let pods_known = self.pods_listed || self.seen.errors.contains_key("pods");
        if self.records_listed && pods_known {
            self.seen.read_unix = Some(jiff::Timestamp::now().as_second());
        }
        self.dirty = true;
    }

    /// Read the Nodes when asked (`asked`: from a list at most
    /// [`nodes::ASKED_FRESH`] old), or when this guard keeps coverage and
    /// its last read is [`nodes::NODES_EVERY`] old.
    async fn keep_coverage(&mut self, asked: bool) {
        let age = self.nodes_read.map(|t| t.elapsed());
        let due = if asked {
            age.is_none_or(|a| a >= nodes::ASKED_FRESH)
        } else {
            // Not while the fleet is still coming up: each guard sees a
            // different few live guards then, and would think itself keeper.
            let settled =
                self.seen.read_unix.is_some() && self.started.elapsed() >= nodes::KEEPER_GRACE;
            settled
                && nodes::keeper(&self.cfg.node, &self.table.live())
                && age.is_none_or(|a| a >= nodes::NODES_EVERY)
        };
        if !due {
            return;
        }
        self.nodes_read = Some(Instant::now());
        let r = nodes::list(&self.own.client).await;
        self.seen.nodes = Some(r.as_ref().map_err(|e| format!("{e:#}")).cloned());
        self.seen.nodes_unix = Some(jiff::Timestamp::now().as_second());
        self.outcome(Call::Nodes, r.map(drop));
        self.dirty = true;
    }

    /// Log a failure once per kind (and its end), count it, keep it for `/cluster`.
    fn outcome(&mut self, req: Call, r: Result<()>) {
        let what = req.as_str();
        match r {
            Ok(()) => {
                if self.logged.remove(what).is_some() {
                    tracing::info!(what, "presence: the Kubernetes API answers again");
                }
                if self.seen.errors.remove(what).is_some() {
                    self.dirty = true;
                }
            }
            Err(e) => {
                let msg = format!("{e:#}");
                self.ops.error(req.cause());
                if self.logged.insert(what, msg.clone()).is_none() {
                    tracing::warn!(what, error = %msg, "presence: request failed (guarding goes on; retried)");
                }
                self.seen.errors.insert(what.to_owned(), msg);
                self.dirty = true;
            }
        }
    }
}
