//! The start-up sequence: checks that fail early and say why, the sources
//! started, the program loaded and its maps filled, then attached; only then
//! does the daemon vouch for the policy with its first heartbeat.

use std::{sync::Arc, time::Duration};

use anyhow::{bail, Context as _, Result};
use guard_common::Ownership;
use tokio::{
    net::TcpListener,
    signal::unix::{Signal, SignalKind},
    sync::watch,
    task::JoinHandle,
};

use super::{
    attachments::Attachments, interval, preflight, publish, signal, Daemon, Inputs, RunConfig,
    Sources,
};
use crate::{
    api::{self, Shared},
    datapath::{sys::ifindex, wire::Wire, Datapath},
    model::refresh::Refresher,
    model::{addrs::AddrTable, cluster::ClusterView, ownership::OwnershipFile},
    ops::Ops,
    senders::refresh,
    sources::{
        addrs,
        cluster::{task, ClusterConfig},
        file, file_watch,
    },
    telemetry::{census, clients, memory},
};

/// The ownership file as parsed at start, with the text it was parsed from.
type FileAtStart = (OwnershipFile, String);

/// Everything up to "arp-guard is enforcing".
pub(super) async fn start(cfg: RunConfig) -> Result<(Daemon, Inputs)> {
    preflight::check_capabilities()?;
    let node = preflight::node_name(cfg.daemon.node_name.clone())?;
    for i in &cfg.sources.lb_ifaces {
        if ifindex(i).is_err() {
            tracing::warn!(interface = %i, "--lb-ips-from {i}: no such interface (yet); its addresses count once it appears");
        }
    }
    let file_job = read_file(&cfg);
    // Before anything is attached: a signal during start-up must also end in
    // a clean detach, not in the default action. SIGHUP's default action
    // would kill the daemon: it re-reads everything instead.
    let signals = (
        signal(SignalKind::terminate(), "SIGTERM")?,
        signal(SignalKind::interrupt(), "SIGINT")?,
        signal(SignalKind::hangup(), "SIGHUP")?,
    );
    // A taken port fails the start before anything is loaded or attached.
    let listeners = Listeners {
        api: bind(cfg.api.listen, "--listen").await?,
        metrics: bind(cfg.api.metrics_listen, "--metrics-listen").await?,
    };
    let (nl, notifications) = addrs::connect()?;
    let table = addrs::dump(&nl).await?;
    // The operation counters: one set for the daemon, counted in by the
    // feed (started here) and everything the daemon starts later.
    let ops = Arc::new(Ops::default());
    let (announcers, cluster_rx) = match &cfg.sources.cluster {
        Some(c) => start_cluster(c, ops.clone()).await?,
        None => (Vec::new(), None),
    };
    let dp = Datapath::load(&cfg.datapath)?;
    let file = match file_job {
        Some(job) => Some(job.await.context("reading the ownership file")??),
        None => None,
    };
    let takeover = super::takeover::Takeover::new(&cfg.daemon.takeover)?;
    let node_api = super::report::node_api(&cfg, &node).await;
    let hints = super::attachments::hints(&cfg, node_api.as_ref());
    let mut daemon = Daemon::new(cfg, node, dp, &table, announcers, takeover, ops);
    daemon.enforce(file.as_ref().map(|(f, _)| f), &table, cluster_rx.is_some())?;
    let held = daemon.start_held_reader();
    let heard = daemon.start_telemetry(listeners);
    let cluster_now = cluster_rx.as_ref().map(|c| c.borrow().clone());
    daemon.publish(cluster_now.as_ref(), &super::publish::Changed::All);
    // After the first publish: the presence record is read from what it
    // fills (the uplinks and their MACs). Started before, the first Lease
    // could go out naming no interface (tests/presence.rs saw it).
    daemon.presence = daemon.start_presence();
    daemon.start_report(node_api.as_ref());
    daemon.announce();

    // The sources keep their facts current from now on.
    let (addr_tx, addr_rx) = watch::channel(table);
    let resync = daemon.cfg.sources.resync;
    tokio::spawn(addrs::watch(nl, notifications, addr_tx, resync));
    let file_rx = match (daemon.cfg.sources.file.clone(), file) {
        (Some(f), Some((now, text))) => {
            let (tx, rx) = watch::channel(now);
            tokio::spawn(file_watch::watch(f, text, tx));
            Some(rx)
        }
        _ => None,
    };
    let sources = Sources {
        addrs: addr_rx,
        file: file_rx,
        cluster: cluster_rx,
        hints,
    };
    let mut inputs = inputs(&daemon.cfg, sources, signals).await;
    (inputs.held, inputs.heard) = (held, heard);
    Ok((daemon, inputs))
}

/// The file must be valid at start: there is no "last good state" yet. It
/// is read and parsed while the BPF program loads (a big file takes a few
/// hundred ms), and checked before anything is attached.
fn read_file(cfg: &RunConfig) -> Option<JoinHandle<Result<FileAtStart>>> {
    let f = cfg.sources.file.clone()?;
    Some(tokio::spawn(async move {
        let text = file_watch::read(&f.path, f.max_bytes)
            .await
            .context("cannot read the ownership file")?;
        tokio::task::spawn_blocking(move || file::parse(&f.path, &text).map(|p| (p, text)))
            .await
            .context("parsing the ownership file")?
            .context("invalid ownership file")
    }))
}

/// The Kubernetes feed, when an announcer asks for it. A missing or broken
/// configuration is a start-up error; an unreachable API is not (the feed
/// retries, and its staleness rules apply).
async fn start_cluster(
    c: &ClusterConfig,
    ops: Arc<Ops>,
) -> Result<(Vec<&'static str>, Option<watch::Receiver<ClusterView>>)> {
    let names: Vec<&'static str> = c.feed.announcers.iter().map(|a| a.name()).collect();
    tracing::info!(announcers = ?names, "reading ownership from the Kubernetes API");
    let rx = task::start(c.clone(), ops).await?;
    Ok((names, Some(rx)))
}

/// The timers of the loop, and its sources and signals.
async fn inputs(cfg: &RunConfig, sources: Sources, signals: (Signal, Signal, Signal)) -> Inputs {
    let d = &cfg.daemon;
    let (sigterm, sigint, sighup) = signals;
    Inputs {
        sources,
        held: None,
        heard: None,
        sigterm,
        sigint,
        sighup,
        // Heartbeats (and program log forwarding, and retries of failed writes).
        heartbeat: tokio::time::interval(Duration::from_millis(500)),
        reconcile: interval(cfg.sources.resync.max(Duration::from_secs(1))).await,
        // Counter rows of IPs that left are looked at often enough to go
        // soon after their grace period, and no more often than needed.
        reclaim: interval(
            (d.counter_grace / 2).clamp(Duration::from_secs(1), Duration::from_secs(30)),
        )
        .await,
        stats: interval(if d.stats_interval.is_zero() {
            Duration::from_secs(3600 * 24 * 365)
        } else {
            d.stats_interval
        })
        .await,
    }
}

impl Daemon {
    fn new(
        cfg: RunConfig,
        node: String,
        mut dp: Datapath,
        table: &AddrTable,
        announcers: Vec<&'static str>,
        takeover: super::takeover::Takeover,
        ops: Arc<Ops>,
    ) -> Daemon {
        if cfg.datapath.pin_dir.is_some() {
            // Pinned maps carry what the previous daemon wrote: start the diff from there.
            match dp.reload_from_kernel() {
                Ok(n) if n > 0 => tracing::info!(entries = n, "took over pinned maps"),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %format!("{e:#}"), "cannot read the pinned maps"),
            }
        }
        let warn = |what: &'static str| move |e: crate::datapath::DatapathError| tracing::warn!(error = %format!("{e:#}"), "{what}");
        let counters = dp
            .counter_maps()
            .map_err(warn("counters unavailable to the API"));
        let max_ip_series = cfg.api.metrics_max_ip_series;
        let shared = Arc::new(Shared::new(counters.ok(), max_ip_series, ops));
        let reclaimer = dp
            .counter_reclaimer()
            .map_err(warn("counter rows cannot be reclaimed"))
            .ok()
            .map(|r| Arc::new(tokio::sync::Mutex::new(r)));
        let pins = cfg.datapath.pin_dir.as_deref();
        let history = super::history::HistoryState::load(pins, &node, dp.last_heartbeat());
        let attachments = Attachments::new(
            &cfg.daemon.uplinks,
            &cfg.sources.lb_ifaces,
            cfg.datapath.attach,
        );
        Daemon {
            node,
            memlock: dp.memlock_bytes(),
            dp,
            attachments,
            view: Default::default(),
            links: table.links.clone(),
            addrs: table.clone(),
            cluster_flags: None,
            full_next: true,
            claims_seen: 0,
            dirty: false,
            pins_ok: true,
            node_warned: false,
            shared,
            last_status: None,
            announcers,
            reclaimer,
            takeover,
            presence: None,
            history,
            report: None,
            beats: 0,
            cfg,
        }
    }

    /// Fill the maps, vouch for them, attach.
    fn enforce(
        &mut self,
        file: Option<&OwnershipFile>,
        table: &AddrTable,
        cluster_on: bool,
    ) -> Result<()> {
        self.attachments.choose(table, &Default::default());
        let mut view = self.derive(file, table);
        if cluster_on {
            view.hold_previous(|ip| self.dp.map_state(ip));
        }
        // Fill the maps before attaching: the first frame already meets the policy.
        // Until the Kubernetes feed has synced, entries are only added: pinned
        // maps still hold what the previous daemon learned from the cluster.
        self.dirty = !self.apply(&view, cluster_on);
        self.view = view;
        // Only now, with the policy in place, does this daemon vouch for it.
        self.dp.heartbeat()?;
        publish::warn_if_node_unknown(&self.node, file);
        self.attachments.sync(&mut self.dp, table);
        for pin in self.dp.prune_link_pins() {
            tracing::info!(pin = %pin, "removed a pinned attachment no --interface asks for");
        }
        // With an explicit --attach that the kernel cannot do, nothing would ever attach.
        if self.attachments.attached.is_empty() {
            if let Some((name, why)) = self.attachments.failed.iter().next() {
                bail!("cannot attach the guard to {name}: {why}");
            }
        }
        Ok(())
    }

    /// The drop-event reader and the API; the queue of announcements heard
    /// (takeover timing) when the events can be read.
    fn start_telemetry(
        &mut self,
        listeners: Listeners,
    ) -> Option<tokio::sync::mpsc::Receiver<crate::model::takeover::Heard>> {
        let heard = match self.dp.take_events() {
            Ok(ring) => {
                let events = self.shared.events.clone();
                let (tx, rx) = tokio::sync::mpsc::channel(super::takeover::QUEUE);
                tokio::spawn(crate::telemetry::events::run(ring, events, tx));
                Some(rx)
            }
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "drop events unavailable");
                None
            }
        };
        self.start_census();
        self.start_clients();
        self.start_probing();
        self.start_memory_watch();
        // Events need the Service of each IP: only the cluster feed knows it.
        if let (true, Some(c)) = (self.cfg.kube_events.enabled, &self.cfg.sources.cluster) {
            super::kube_events::spawn(
                self.cfg.kube_events,
                c.kubeconfig.clone(),
                self.node.clone(),
                self.shared.clone(),
                self.cfg.daemon.takeover.silent_after,
            );
        }
        if let Some(listener) = listeners.api {
            let router = api::routes::router(self.shared.clone());
            let ops = self.shared.ops.clone();
            tokio::spawn(api::serve(listener, router, api::routes::ALL_PATHS, ops));
        }
        if let Some(listener) = listeners.metrics {
            let router = api::routes::metrics_router(self.shared.clone());
            let ops = self.shared.ops.clone();
            tokio::spawn(api::serve(listener, router, "/metrics", ops));
        }
        heard
    }

    /// The census reader: judged against the ownership the main loop
    /// publishes, its result published for the API.
    fn start_census(&self) {
        if !self.dp.census_loaded() {
            return;
        }
        let reader = match self.dp.census_reader() {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "the responder census cannot be read; guarding without it");
                return;
            }
        };
        // An empty census until the first read: "on, nothing seen yet".
        self.shared.write().census = Some(census::CensusDoc {
            window_seconds: self.cfg.datapath.census_window.as_secs(),
            capacity: guard_common::MAX_RESPONDERS,
            ..Default::default()
        });
        let (owned, publish) = (self.shared.clone(), self.shared.clone());
        let spawned = census::spawn(census::CensusTask {
            reader,
            window: self.cfg.datapath.census_window,
            period: Duration::from_secs(1),
            owned: Box::new(move || {
                census::owned_since(
                    owned
                        .read()
                        .ips
                        .iter()
                        .map(|(ip, e)| (ip, e.state, e.since_unix)),
                )
            }),
            who: super::presence::who_is(self.shared.clone()),
            publish: Box::new(move |doc| publish.write().census = Some(doc)),
            events: self.shared.events.clone(),
            claimed_elsewhere_after: self.cfg.daemon.takeover.verdict,
        });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "the responder census cannot start its thread; guarding without it");
        }
    }

    /// The reader of misdirected clients: judged against the ownership and
    /// the moves the main loop publishes, its result published for the API.
    fn start_clients(&self) {
        if !self.dp.census_loaded() {
            return;
        }
        let reader = match self.dp.clients_reader() {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "the census's client table cannot be read; guarding without it");
                return;
            }
        };
        let c = &self.cfg.clients;
        self.shared.write().clients = Some(clients::ClientsDoc::empty(c.stale_after));
        let (keep, publish) = (self.shared.clone(), self.shared.clone());
        let spawned = clients::spawn(clients::ClientsTask {
            reader,
            period: c.read_period,
            stale_after: c.stale_after,
            max_ip_series: self.cfg.api.metrics_max_ip_series,
            states: super::history::clients_states(self.shared.clone()),
            publish: Box::new(move |doc| publish.write().clients = Some(doc)),
            events: self.shared.events.clone(),
            healer: self
                .healer()
                .map(|h| -> Box<dyn clients::Heal> { Box::new(h) }),
            keep: self
                .cfg
                .datapath
                .pin_dir
                .is_some()
                .then(|| -> clients::Keep {
                    Box::new(move |k, t| keep.clients_history().kept = Some((k, t)))
                }),
        });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "the client reader cannot start its thread; guarding without it");
        }
    }

    /// With `--refresh-stale-clients`: the healer, reading what it needs
    /// from the state the main loop and the census publish. None when off,
    /// or when its socket cannot be opened (said once, guarding goes on).
    fn healer(&self) -> Option<refresh::Healer> {
        let per_minute = self.cfg.clients.refresh_per_minute?;
        let wire = match Wire::open() {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "--refresh-stale-clients: cannot open the socket to send refreshes; stale clients are not refreshed");
                return None;
            }
        };
        let shared = self.shared.clone();
        let stale_after = self.cfg.datapath.gate.stale_after.as_nanos() as u64;
        Some(refresh::Healer {
            wire,
            refresher: Refresher::new(per_minute),
            hold: self.cfg.daemon.takeover.hold,
            knowledge: Box::new(move |asked| {
                let now_ns = crate::datapath::monotonic_ns();
                let st = shared.read();
                refresh::Knowledge {
                    blind: super::probing::blind(&shared, &st, stale_after).is_some(),
                    claims: (st.census.as_ref())
                        .map(|c| crate::model::census::with_kept(&c.claims, &st.claims_kept)),
                    conflicts: (st.census.iter())
                        .flat_map(|c| c.ips.iter())
                        .filter(|(ip, c)| c.conflict.is_some() && asked.contains(*ip))
                        .map(|(ip, _)| *ip)
                        .collect(),
                    changed_ns: refresh::changed_ns(
                        (asked.iter()).filter_map(|ip| Some((*ip, st.ips.get(ip)?.since_unix))),
                        now_ns,
                    ),
                    presence: super::presence::presence_facts(&st, asked),
                }
            }),
            outcomes: Default::default(),
        })
    }

    /// The memory watch: every few seconds, the daemon's memory against
    /// its cgroup's limit (`telemetry::memory`), shown live by the API.
    fn start_memory_watch(&self) {
        let (root, maps, shared, ops) = (
            self.cfg.daemon.cgroup_root.clone(),
            self.memlock,
            self.shared.clone(),
            self.shared.ops.clone(),
        );
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(memory::PERIOD);
            let mut last: Option<memory::MemoryStatus> = None;
            loop {
                tick.tick().await;
                let s = memory::sample(&root, maps, last.as_ref());
                memory::log_level(last.as_ref(), &s);
                ops.set_memory_pressure(s.level == memory::Level::Pressure);
                {
                    let mut st = shared.write();
                    st.memory = Some(s.clone());
                    if let Some(status) = st.status.as_mut() {
                        status.memory = Some(s.clone());
                    }
                }
                last = Some(s);
            }
        });
    }

    fn announce(&self) {
        let v = &self.view;
        tracing::info!(
            node = %self.node,
            mode = self.cfg.datapath.mode.as_str(),
            leak_action = self.cfg.datapath.leak_action.as_str(),
            lb_ips = v.lb.len(),
            owned = v.count(Ownership::Owned),
            foreign = v.count(Ownership::Foreign),
            unknown = v.count(Ownership::Unknown),
            "arp-guard is enforcing"
        );
    }
}

/// The API's sockets, bound before anything is loaded or attached.
struct Listeners {
    api: Option<TcpListener>,
    metrics: Option<TcpListener>,
}

async fn bind(addr: Option<std::net::SocketAddr>, flag: &str) -> Result<Option<TcpListener>> {
    match addr {
        Some(addr) => Ok(Some(
            TcpListener::bind(addr)
                .await
                .with_context(|| format!("{flag} {addr}"))?,
        )),
        None => Ok(None),
    }
}
