//! `arp-guard run`: the daemon. It starts the sources, loads and fills the
//! datapath, attaches it, then turns every event (a source changed, a link
//! changed, a tick, a signal) into one handler call that keeps the maps equal
//! to the view, until SIGTERM/SIGINT.
//!
//! Data flows one way: sources -> view (pure) -> datapath maps -> program;
//! program -> counters and events -> telemetry -> API.

mod attachments;
mod changes;
pub mod config;
mod history;
mod kernel;
mod kube_events;
mod preflight;
mod presence;
mod probing;
mod publish;
mod report;
mod startup;
mod status_file;
mod takeover;

use std::{sync::Arc, time::Duration};

use anyhow::{Context as _, Result};
use tokio::{signal::unix::Signal, sync::watch};

use crate::{
    api::Shared,
    datapath::{CounterReclaimer, Datapath},
    model::{addrs::AddrTable, cluster::ClusterView, ownership::OwnershipFile, view::View},
    ops::ErrorCause,
    telemetry::status::DaemonStatus,
};
pub use config::{
    ApiConfig, ClientsConfig, DaemonConfig, KubeEventsConfig, OnExit, RunConfig, SourcesConfig,
    TakeoverConfig,
};
pub use preflight::{check_capabilities, effective_caps, node_name};

/// Run the daemon until SIGTERM/SIGINT.
pub async fn run(cfg: RunConfig) -> Result<()> {
    let (daemon, inputs) = startup::start(cfg).await?;
    daemon.serve(inputs).await
}

/// The receivers of the sources' facts.
struct Sources {
    addrs: watch::Receiver<AddrTable>,
    /// None without `--ownership-file`.
    file: Option<watch::Receiver<OwnershipFile>>,
    /// None without an announcer that reads the API.
    cluster: Option<watch::Receiver<ClusterView>>,
    /// What the cluster says of this node's uplinks (None: no API, or no
    /// `--interface auto`).
    hints: Option<watch::Receiver<crate::model::uplinks::Hints>>,
}

/// Signals and timers the loop waits on.
struct Inputs {
    sources: Sources,
    /// Announcements the program dropped for IPs foreign here (None: none
    /// are held).
    held: Option<tokio::sync::mpsc::Receiver<crate::model::takeover::Held>>,
    /// Announcements that left, as the program reports them.
    heard: Option<tokio::sync::mpsc::Receiver<crate::model::takeover::Heard>>,
    sigterm: Signal,
    sigint: Signal,
    sighup: Signal,
    heartbeat: tokio::time::Interval,
    reconcile: tokio::time::Interval,
    reclaim: tokio::time::Interval,
    stats: tokio::time::Interval,
}

/// What woke the loop.
enum Event {
    Stop(&'static str),
    /// A source published new facts (true: the ownership file).
    SourceChanged(bool),
    /// A source's task ended: its last facts would stay in force for good.
    SourceStopped(&'static str),
    Heartbeat,
    Reconcile,
    Reclaim,
    Stats,
    Hangup,
    Held(crate::model::takeover::Held),
    Heard(crate::model::takeover::Heard),
}

pub(crate) struct Daemon {
    cfg: RunConfig,
    node: String,
    dp: Datapath,
    attachments: attachments::Attachments,
    /// The view the maps were last brought to.
    view: View,
    /// Links as last seen (attachments follow their changes).
    links: std::collections::BTreeMap<String, u32>,
    /// The interface table the view was last derived from.
    addrs: AddrTable,
    /// The cluster feed's (synced, degraded) the view was last derived with.
    cluster_flags: Option<(bool, bool)>,
    /// Derive the whole view at the next change (at start, and whenever the
    /// changed IPs cannot be known).
    full_next: bool,
    /// The version of the feed's claims this daemon last read (its change
    /// log says what changed since).
    claims_seen: u64,
    /// A map write failed: retried with every heartbeat.
    dirty: bool,
    pins_ok: bool,
    node_warned: bool,
    shared: Arc<Shared>,
    /// The last status document written to --status-file.
    last_status: Option<DaemonStatus>,
    /// Kernel memory of the maps (sized at load, read once).
    memlock: u64,
    announcers: Vec<&'static str>,
    reclaimer: Option<Arc<tokio::sync::Mutex<CounterReclaimer>>>,
    takeover: takeover::Takeover,
    /// Presence, while it runs (its Lease is deleted at a clean exit).
    presence: Option<crate::sources::presence::Handle>,
    /// What it knew of recent moves, kept across restarts.
    history: history::HistoryState,
    /// This node's findings for its ArpGuardNode's writer, and when it
    /// started (None: off).
    report: Option<(
        watch::Sender<guard_wire::node::NodeReport>,
        std::time::Instant,
    )>,
    /// Heartbeats since start (the findings are looked at every fourth).
    beats: u64,
}

impl Daemon {
    async fn serve(mut self, mut inputs: Inputs) -> Result<()> {
        let signal = loop {
            match next_event(&mut inputs).await {
                Event::Stop(signal) => break signal,
                Event::SourceChanged(file) => self.on_source_changed(&mut inputs.sources, file),
                Event::SourceStopped(which) => anyhow::bail!("{which} stopped"),
                Event::Heartbeat => self.on_heartbeat(&inputs.sources),
                Event::Reconcile => self.on_reconcile(&mut inputs.sources),
                Event::Reclaim => self.on_reclaim(),
                Event::Stats => publish::log_counters(&self.dp, "counters"),
                Event::Hangup => {
                    tracing::info!("SIGHUP: re-reading the maps and re-applying the view");
                    inputs.reconcile.reset_immediately();
                }
                Event::Held(h) => {
                    self.on_held(h);
                    self.publish_takeovers();
                }
                Event::Heard(h) => {
                    self.on_heard(h);
                    self.publish_takeovers();
                }
            }
        };
        self.shutdown(signal);
        Ok(())
    }

    /// Until the Kubernetes feed has synced, maps are only added to: pinned
    /// maps still hold what the previous daemon learned from the cluster.
    fn additive(sources: &Sources) -> bool {
        sources.cluster.as_ref().is_some_and(|c| !c.borrow().synced)
    }

    /// Every 500 ms: vouch for the policy (the program's liveness gate),
    /// forward the program's diagnostics, retry a failed map write.
    fn on_heartbeat(&mut self, sources: &Sources) {
        match self.dp.heartbeat() {
            Ok(()) => self.shared.beat(),
            Err(e) => {
                self.shared.ops.error(ErrorCause::Heartbeat);
                tracing::warn!(error = %format!("{e:#}"), "cannot write the heartbeat");
            }
        }
        self.dp.flush_program_logs();
        self.beats += 1;
        if self.beats.is_multiple_of(4) {
            self.refresh_report();
        }
        self.takeover_tick();
        self.save_history(false);
        if self.dirty {
            let view = self.view.clone();
            self.dirty = !self.apply(&view, Self::additive(sources));
        }
    }

    /// Every --resync (and on SIGHUP): the view derived again in full from
    /// the sources (the safety net under the per-change updates: anything
    /// they missed is repaired here), the pins are still there, and the maps
    /// hold what we wrote (anything changed behind our back is repaired).
    fn on_reconcile(&mut self, sources: &mut Sources) {
        self.full_next = true;
        self.on_source_changed(sources, false);
        self.check_pins();
        let view = self.view.clone();
        let additive = Self::additive(sources);
        match self.dp.reload_from_kernel() {
            Ok(0) if self.dp.not_enforced() == 0 => {}
            // Entries that met a full map get another try.
            Ok(0) => self.dirty = !self.apply(&view, additive),
            Ok(n) => {
                tracing::warn!(
                    entries = n,
                    "BPF maps drifted from the view (changed outside arp-guard); repairing"
                );
                self.dirty = !self.apply(&view, additive);
            }
            Err(e) => tracing::warn!(error = %format!("{e:#}"), "cannot re-read the BPF maps"),
        }
    }

    /// bpffs unmounted under us: keep enforcing from the maps we hold, pin
    /// again once a bpffs is back.
    fn check_pins(&mut self) {
        let Some(dir) = self.cfg.datapath.pin_dir.clone() else {
            return;
        };
        if crate::datapath::pins::intact(&dir) {
            return;
        }
        if self.pins_ok {
            tracing::warn!(pin_dir = %dir.display(), "the pins are gone (bpffs unmounted?); the guard keeps enforcing, re-pinning");
        }
        self.pins_ok = match self.dp.repin() {
            Ok(()) => {
                tracing::info!(pin_dir = %dir.display(), "maps and program pinned again");
                true
            }
            Err(e) => {
                if self.pins_ok {
                    tracing::warn!(error = %format!("{e:#}"), "cannot pin again; a restart will not be seamless until bpffs is back");
                }
                false
            }
        };
    }

    /// Counter rows of departed IPs go, off the main loop (it walks the
    /// whole map), one run at a time.
    fn on_reclaim(&self) {
        let Some(r) = self.reclaimer.as_ref() else {
            return;
        };
        let Ok(mut r) = r.clone().try_lock_owned() else {
            return;
        };
        let (lb, grace) = (self.dp.lb_set(), self.cfg.daemon.counter_grace);
        tokio::task::spawn_blocking(move || {
            match r.reclaim(&lb, std::time::Instant::now(), grace) {
                Ok(0) => {}
                Ok(n) => tracing::debug!(
                    rows = n,
                    "counter rows of LB IPs gone for --counter-grace removed"
                ),
                Err(e) => tracing::warn!(error = %format!("{e:#}"), "cannot reclaim counter rows"),
            }
        });
    }

    /// The view from the file and the interfaces (at start, before the
    /// cluster feed has anything to say).
    fn derive(&self, file: Option<&OwnershipFile>, table: &AddrTable) -> View {
        let uplinks = self.attachments.choice.names();
        crate::model::view::compute(&crate::model::view::Inputs {
            node: &self.node,
            file,
            lb_ifaces: &self.cfg.sources.lb_ifaces,
            uplinks: &uplinks,
            addrs: table,
            cluster: None,
        })
    }

    /// Bring the maps to `view`; false if some entry could not be written.
    fn apply(&mut self, view: &View, additive: bool) -> bool {
        publish::apply(&mut self.dp, view, additive, &self.shared.ops)
    }

    /// A node name that matches no lease holder or announcing node is most
    /// likely a NODE_NAME typo: said once (the metric
    /// `arp_guard_node_name_unmatched` says it as long as it lasts).
    fn warn_once_if_node_unknown(&mut self, c: &ClusterView) {
        let guards = (self.shared.read().presence.as_ref()).map(|p| p.table.clone());
        let unmatched = crate::telemetry::status::node_unmatched(c, &self.node, guards.as_deref());
        if self.node_warned || !unmatched {
            return;
        }
        self.node_warned = true;
        tracing::warn!(
            node = %self.node,
            holders = ?c.holders,
            "this node's name matches none of the lease holders and announcing nodes seen: \
             a likely --node-name / NODE_NAME misconfiguration (or this node announces nothing yet)"
        );
    }

    /// Log the final counters, then leave the guard attached (`--on-exit
    /// keep`) or take it off everywhere.
    fn shutdown(mut self, signal: &str) {
        tracing::info!(signal, "shutting down");
        // Before the pins may go (`--on-exit remove` takes it with them).
        self.save_history(true);
        if let Some(p) = self.presence.take() {
            p.leave();
        }
        publish::log_counters(&self.dp, "final counters");
        if self.cfg.daemon.on_exit == OnExit::Keep {
            for (iface, r) in self.dp.keep_all() {
                match r {
                    Ok(()) => {
                        tracing::info!(interface = %iface, "guard left attached for the next daemon (--on-exit keep)")
                    }
                    Err(e) => {
                        tracing::error!(interface = %iface, error = %format!("{e:#}"), "cannot leave the guard attached")
                    }
                }
            }
            return;
        }
        for (iface, r) in self.dp.detach_all() {
            match r {
                Ok(()) => tracing::info!(interface = %iface, "guard detached"),
                Err(e) => {
                    tracing::error!(interface = %iface, error = %format!("{e:#}"), "detach failed")
                }
            }
        }
    }
}

/// Wait for the next thing to do.
async fn next_event(i: &mut Inputs) -> Event {
    // A source with no sender left (never started) never fires.
    async fn changed<T>(
        rx: Option<&mut watch::Receiver<T>>,
    ) -> Result<(), watch::error::RecvError> {
        match rx {
            Some(rx) => rx.changed().await,
            None => std::future::pending().await,
        }
    }
    tokio::select! {
        _ = i.sigterm.recv() => Event::Stop("SIGTERM"),
        _ = i.sigint.recv() => Event::Stop("SIGINT"),
        r = i.sources.addrs.changed() => match r {
            Ok(()) => Event::SourceChanged(false),
            Err(_) => Event::SourceStopped("the interface watcher"),
        },
        r = changed(i.sources.file.as_mut()) => match r {
            Ok(()) => Event::SourceChanged(true),
            Err(_) => Event::SourceStopped("the ownership file watcher"),
        },
        r = changed(i.sources.cluster.as_mut()) => match r {
            Ok(()) => Event::SourceChanged(false),
            Err(_) => Event::SourceStopped("the Kubernetes feed"),
        },
        // The hints' task ends when it has nothing more to follow: the
        // choice keeps the last hints.
        Ok(()) = changed(i.sources.hints.as_mut()) => Event::SourceChanged(false),
        _ = i.heartbeat.tick() => Event::Heartbeat,
        _ = i.reconcile.tick() => Event::Reconcile,
        _ = i.reclaim.tick() => Event::Reclaim,
        _ = i.stats.tick() => Event::Stats,
        _ = i.sighup.recv() => Event::Hangup,
        Some(h) = recv(i.held.as_mut()) => Event::Held(h),
        Some(h) = recv(i.heard.as_mut()) => Event::Heard(h),
    }
}

/// The next item of a queue that may not exist (never, then).
async fn recv<T>(rx: Option<&mut tokio::sync::mpsc::Receiver<T>>) -> Option<T> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// An interval whose first tick is one period away (tokio's fires at once).
async fn interval(period: Duration) -> tokio::time::Interval {
    let mut i = tokio::time::interval(period);
    i.tick().await;
    i
}

/// Installing a signal handler, named in the error.
fn signal(kind: tokio::signal::unix::SignalKind, name: &str) -> Result<Signal> {
    tokio::signal::unix::signal(kind).with_context(|| format!("installing the {name} handler"))
}
