//! What `arp-guard run` is asked to do, as one typed config per part: the
//! command line is turned into these once (cli/config.rs), and no part sees the
//! command line itself.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use crate::{
    datapath::DatapathConfig, sources::cluster::ClusterConfig, sources::file_watch::FileConfig,
    sources::presence::PresenceConfig,
};

/// On SIGTERM/SIGINT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnExit {
    /// Leave the program attached with its pinned maps for the next daemon.
    Keep,
    /// Detach everywhere and remove the pins.
    Remove,
}

/// The local API.
#[derive(Debug, Clone)]
pub struct ApiConfig {
    /// Where to listen (None: no API).
    pub listen: Option<SocketAddr>,
    /// Where to serve /metrics alone (None: only on `listen`).
    pub metrics_listen: Option<SocketAddr>,
    /// At most this many per-LB-IP series in /metrics.
    pub metrics_max_ip_series: usize,
}

/// The sources of ownership facts.
#[derive(Debug, Clone)]
pub struct SourcesConfig {
    pub file: Option<FileConfig>,
    /// Interfaces whose IPv4 and global IPv6 addresses are LB IPs (kube-ipvs0).
    pub lb_ifaces: Vec<String>,
    pub cluster: Option<ClusterConfig>,
    /// How often interface addresses are dumped in full (repairing missed
    /// notifications); also the period of the map reconcile.
    pub resync: Duration,
}

/// The daemon's own behaviour.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// This node's name as the sources spell it (None: $NODE_NAME was not
    /// set either; the hostname is used).
    pub node_name: Option<String>,
    /// The uplinks: `--interface` names or glob patterns.
    pub uplinks: Vec<String>,
    pub on_exit: OnExit,
    pub status_file: Option<PathBuf>,
    /// How often the counters are logged (zero: never).
    pub stats_interval: Duration,
    /// Where the memory limit is read (`--cgroup-root`).
    pub cgroup_root: PathBuf,
    /// Counter rows of a departed IP go this long after it left.
    pub counter_grace: Duration,
    pub takeover: TakeoverConfig,
}

/// Takeovers: held announcements and the timing of the first one.
#[derive(Debug, Clone, Copy)]
pub struct TakeoverConfig {
    /// How long a dropped announcement of a foreign IP is held for a
    /// takeover (zero: not held; always zero in monitor mode).
    pub hold: Duration,
    /// No announcement within this long after a takeover: a silent takeover.
    pub silent_after: Duration,
    /// `--announce-hold` in either mode: a speaker's frame of an IP foreign
    /// here is a takeover's own when the IP becomes owned here within it
    /// (`model::takeover::fates`).
    pub window: Duration,
    /// `--split-brain-after`: owned here later than the window but within
    /// this is a late feed; not by then, split brain.
    pub verdict: Duration,
}

#[derive(Debug, Clone)]
pub struct RunConfig {
    pub daemon: DaemonConfig,
    pub datapath: DatapathConfig,
    pub sources: SourcesConfig,
    /// Presence (None: off, or no Kubernetes API to write to).
    pub presence: Option<PresenceConfig>,
    /// This node's ArpGuardNode written at most this often (None: off, or
    /// no Kubernetes API).
    pub node_report: Option<Duration>,
    pub api: ApiConfig,
    pub clients: ClientsConfig,
    pub kube_events: KubeEventsConfig,
    /// The active census (None: `--probe-interval 0`). It also needs
    /// presence and the census, checked at start.
    pub probing: Option<crate::model::probing::Pace>,
}

/// Kubernetes Events on the Service of an LB IP.
#[derive(Debug, Clone, Copy)]
pub struct KubeEventsConfig {
    pub enabled: bool,
    pub limits: crate::model::kube_events::Limits,
    /// A speaker stopped this long without a pause is split brain.
    pub split_brain_after: std::time::Duration,
    /// This many stale clients of one LB IP make an Event.
    pub stale_clients: usize,
    /// Conflicts wait this long before they are judged: nodes whose kernels
    /// answer say so in their presence records within a few periods, and a
    /// conflict they explain is told by the owner's NodesAnswerARP (zero:
    /// presence off, judged at once).
    pub review: std::time::Duration,
}

/// Misdirected clients (the census's client table).
#[derive(Debug, Clone)]
pub struct ClientsConfig {
    /// A client still sending here this long after the move (or its first
    /// packet, to an IP never owned here) is stale; one quiet this long has
    /// gone.
    pub stale_after: Duration,
    /// How often the table's totals are read (and the table walked when a
    /// packet was recorded since the last walk).
    pub read_period: Duration,
    /// `--refresh-stale-clients` (enforce mode only): refreshes per client
    /// and LB IP per minute; None: off.
    pub refresh_per_minute: Option<u32>,
}
