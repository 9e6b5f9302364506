//! Command line of `arp-guard`: the arguments (here) and their turning into
//! one typed config per part (`config`).

mod cluster_args;
mod config;
mod doctor;
mod events_args;
mod parse;
mod probe;
mod tool_args;

pub use cluster_args::{PresenceArgs, StatusArgs};
pub use doctor::DoctorArgs;
pub use tool_args::{CountersArgs, UninstallArgs, ValidateArgs};

use std::{path::PathBuf, time::Duration};

use clap::{Args, Parser, Subcommand, ValueEnum};
use guard_common::{LeakAction, Mode};

pub use crate::daemon::config::OnExit;
use crate::sources::file::DEFAULT_MAX_BYTES;

use parse::parse_listen;
pub use parse::{parse_duration, Listen};
pub use probe::{ConnectTarget, NeighArg, ProbeArgs};

#[derive(Debug, Parser)]
#[command(
    name = "arp-guard",
    version,
    about = "Keeps this node from answering ARP and NDP for LoadBalancer IPs it does not own.",
    long_about = "Keeps this node from answering ARP and NDP for LoadBalancer IPs it does not own.\n\n\
        An eBPF program on the egress of each uplink (--interface) drops ARP replies, gratuitous \
        ARP and announce leaks, and their IPv6 Neighbor Discovery counterparts, that would teach a \
        neighbour \"LB IP -> this node's MAC\" when this node is not the IP's owner. Ownership \
        comes from the Kubernetes API (MetalLB, kube-vip or Cilium L2 announcements: --announcer), \
        a cluster-wide ownership file (--ownership-file) and/or the addresses kube-proxy puts on \
        kube-ipvs0 (--lb-ips-from).",
    after_help = "Run `arp-guard <command> --help` for the options of each command."
)]
pub struct Cli {
    /// Log format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "ARP_GUARD_LOG_FORMAT")]
    pub log_format: LogFormat,

    /// Log filter, e.g. `info`, `debug`, `arp_guard=debug` (RUST_LOG syntax).
    #[arg(long, global = true, default_value = "info", env = "ARP_GUARD_LOG")]
    pub log_level: String,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Attach the guard to interfaces and enforce ownership until SIGTERM/SIGINT.
    Run(Box<RunArgs>),
    /// Print the kernel-side counters of the guard attached to an interface.
    Counters(CountersArgs),
    /// Check an ownership file and print the view a node derives from it.
    Validate(ValidateArgs),
    /// Remove every pin and attachment a guard left (pinned TCX links, maps,
    /// program; netlink filters in arp-guard's slot).
    Uninstall(UninstallArgs),
    /// What the running daemon guards: attachments, mode, feed health, and a
    /// table per LB IP (owner, state, counters).
    Status(StatusArgs),
    /// Why this node treats an IP as it does, and what the program would do
    /// with each kind and origin of frame.
    Explain(ExplainArgs),
    /// Tail the drop events (and responder conflicts) of the running daemon.
    Events(ClientArgs),
    /// Who claims each LB IP on the segment, as the running daemon's census
    /// saw it arrive: MACs, how often, when; conflicts (exit 1 if any).
    Responders(LbIpArgs),
    /// Clients whose traffic for an LB IP another node owns arrives at this
    /// node (their neighbour cache points here): after a move, who has not
    /// followed yet and how long the others took; stale clients (exit 1 if any).
    Clients(LbIpArgs),
    /// Ask the segment who answers for IPs (ARP for IPv4, Neighbor
    /// Solicitations for IPv6), every --interval for --duration, from any host
    /// on it; optionally connect through each answer.
    Probe(ProbeArgs),
    /// Check this node for what makes it answer ARP or NDP for LB IPs it does
    /// not own: sysctls, addresses, kube-proxy, routes, the guard. One line per
    /// check; exits 1 when a check fails.
    Doctor(Box<DoctorArgs>),
    /// Write docs/reference (every flag, metric, alert and Event reason) into
    /// a directory: what `cargo xtask docs` runs.
    #[command(hide = true)]
    Reference(ReferenceArgs),
}

#[derive(Debug, Args)]
pub struct ReferenceArgs {
    /// The directory to write into.
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
}

/// The daemon's API address.
pub const DEFAULT_API: &str = "127.0.0.1:9477";

#[derive(Debug, Args)]
pub struct ClientArgs {
    /// The daemon's --listen address.
    #[arg(long, value_name = "ADDR", default_value = DEFAULT_API, env = "ARP_GUARD_API")]
    pub api: std::net::SocketAddr,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

#[derive(Debug, Args)]
pub struct ExplainArgs {
    /// The LB IP (IPv4 or IPv6) to explain.
    pub ip: std::net::IpAddr,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, Args)]
pub struct LbIpArgs {
    /// Only this LB IP.
    pub ip: Option<std::net::IpAddr>,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// `--on-exit`'s values: the daemon's own type, spelled for the command line.
impl ValueEnum for OnExit {
    fn value_variants<'a>() -> &'a [Self] {
        &[OnExit::Keep, OnExit::Remove]
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        use clap::builder::PossibleValue;
        Some(match self {
            OnExit::Keep => PossibleValue::new("keep")
                .help("Leave the program attached with its pinned maps for the next daemon"),
            OnExit::Remove => {
                PossibleValue::new("remove").help("Detach everywhere and remove the pins")
            }
        })
    }
}

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub kube_events: events_args::KubeEventsArgs,

    /// Interfaces whose egress is guarded (the node's uplinks): a name, a
    /// glob (`ens*`, `bond0.*`), or `auto`: the devices of the default
    /// routes, the one holding the Node's InternalIP, and those the
    /// announcers' objects name (MetalLB L2Advertisement and
    /// CiliumL2AnnouncementPolicy `interfaces`), an upper device (bond,
    /// bridge) rather than its slaves, never tunnels, dummies, Pods' veths or
    /// CNI devices; followed as links, addresses and routes change. Repeat
    /// or mix (`-i auto,eno2`).
    #[arg(
        short = 'i',
        long = "interface",
        value_name = "IFACE",
        default_value = "auto",
        value_delimiter = ','
    )]
    pub uplinks: Vec<String>,

    /// This node's name as the ownership sources spell it (Kubernetes node name).
    /// Defaults to $NODE_NAME, then the hostname.
    #[arg(long, env = "NODE_NAME", value_name = "NAME")]
    pub node_name: Option<String>,

    /// Cluster-wide ownership file (YAML or JSON): each LB IP with its owner node.
    /// Reloaded on change; an invalid update is rejected and the last good one stays.
    #[arg(long, value_name = "PATH")]
    pub ownership_file: Option<PathBuf>,

    /// Largest ownership file read, in bytes (a Kubernetes ConfigMap holds at
    /// most 1 MiB; the default fits about 65,536 entries). Anything larger,
    /// and anything that is not a regular file, is rejected and the last good
    /// state kept.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_BYTES,
          value_parser = clap::value_parser!(u64).range(1024..=256 * 1024 * 1024))]
    pub ownership_file_max_bytes: u64,

    /// The announcers whose records in the Kubernetes API name each LB IP's
    /// owner; repeat for several (for each Service the first with a record
    /// decides). The ownership file (--ownership-file) overrides them all.
    /// Comma-separated lists are accepted too (`--announcer=metallb,kube-vip`).
    #[arg(
        long = "announcer",
        value_enum,
        value_name = "ANNOUNCER",
        value_delimiter = ','
    )]
    pub announcers: Vec<AnnouncerArg>,

    /// Kubeconfig for the Kubernetes API (default: in-cluster config, then $KUBECONFIG / ~/.kube/config).
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,

    /// Namespace of Cilium's L2 announcement Leases.
    #[arg(long, value_name = "NS", default_value = "kube-system")]
    pub cilium_namespace: String,

    /// kube-vip's election: one Lease per Service, or one global Lease for all.
    #[arg(long, value_enum, default_value_t = KubeVipElection::PerService)]
    pub kube_vip_election: KubeVipElection,

    /// Namespace of kube-vip's global Lease.
    #[arg(long, value_name = "NS", default_value = "kube-system")]
    pub kube_vip_namespace: String,

    /// Name of kube-vip's global Lease.
    #[arg(long, value_name = "NAME", default_value = "plndr-svcs-lock")]
    pub kube_vip_lease: String,

    /// Namespace of MetalLB's ServiceL2Status objects.
    #[arg(long, value_name = "NS", default_value = "metallb-system")]
    pub metallb_namespace: String,

    /// Only Services with this spec.loadBalancerClass.
    #[arg(long, value_name = "CLASS")]
    pub lb_class: Option<String>,

    /// Only Services matching this label selector (e.g. `tier=edge`).
    #[arg(long, value_name = "SELECTOR")]
    pub service_selector: Option<String>,

    /// Also guard spec.externalIPs of LoadBalancer Services.
    #[arg(long)]
    pub external_ips: bool,

    /// An LB IP shared by Services whose announcer elected different nodes
    /// (one Lease per Service): when every one of them is
    /// `externalTrafficPolicy: Cluster`, treat the node named by the first
    /// of them (by namespace/name) as the owner and stop the other nodes'
    /// announcements and replies for it. Never for `Local` Services. Off:
    /// the IP stays unknown and the split is only reported.
    #[arg(long)]
    pub settle_shared_ips: bool,

    /// Each watch asks the API server to end it after a random time between
    /// this and twice this (client-go asks for 5-10 minutes); a stream that
    /// shows no progress (event, bookmark, end of watch) for 90 s once the
    /// server has shown bookmarks through a watch, else for its time plus
    /// 10 s, is stuck and is relisted.
    #[arg(long, value_name = "DURATION", default_value = "8m", value_parser = parse_duration)]
    pub kube_watch_timeout: Duration,

    /// Treat `foreign` as `unknown` once the guard has been blind this long
    /// (default: the longest lease duration in use, between 15s and 60s).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub stale_after: Option<Duration>,

    /// Liveness gate: once the daemon's heartbeat (written every 500 ms) is this
    /// old, the program judges `foreign` as `unknown` (default: --stale-after, else 15s).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub heartbeat_stale_after: Option<Duration>,

    /// Liveness gate: once the heartbeat is this old, the program passes everything.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = parse_duration)]
    pub heartbeat_dead_after: Duration,

    /// Treat every IPv4 and global IPv6 address on this interface as an LB IP
    /// (e.g. kube-ipvs0), kept current through netlink. IPs not in the
    /// ownership file are `unknown`.
    #[arg(long = "lb-ips-from", value_name = "IFACE")]
    pub lb_ifaces: Vec<String>,

    /// `enforce` drops/rewrites; `monitor` only counts what enforce would do.
    #[arg(long, value_enum, default_value_t = ModeArg::Enforce)]
    pub mode: ModeArg,

    /// What to do with an announce leak (ARP request with SPA = LB IP) that must be stopped:
    /// `rewrite` SPA to the interface's primary IPv4 (like arp_announce=2), or `drop` it.
    #[arg(long, value_enum, default_value_t = LeakArg::Rewrite)]
    pub leak_action: LeakArg,

    /// How to attach: TCX links (kernel >= 6.6), netlink clsact filters, or the best available.
    #[arg(long, value_enum, default_value_t = AttachArg::Auto)]
    pub attach: AttachArg,

    /// How often the ownership file is re-read even without a change notification.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_duration)]
    pub file_poll: Duration,

    /// How often the kernel's interface addresses are re-read to repair missed notifications.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub resync: Duration,

    /// Capacity of the LB IP map. LB IPs beyond it are not guarded (their
    /// frames pass) and are reported in the log and the status.
    #[arg(long, value_name = "N", default_value_t = guard_common::MAX_LB_IPS, value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    pub max_lb_ips: u32,

    /// Counter rows of an LB IP that left the LB set are deleted this long
    /// after it left (long enough for a scrape to see their last values).
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = parse_duration)]
    pub counter_grace: Duration,

    /// At most this many per-LB-IP series in /metrics: past it, series of
    /// passed frames go first, then the least busy, into lb_ip="other"
    /// (0: no per-IP series at all; for large fleets).
    #[arg(long, value_name = "N", default_value_t = 4096)]
    pub metrics_max_ip_series: usize,

    /// Pin maps, program and TCX links under this bpffs directory (mounting
    /// bpffs at /sys/fs/bpf if needed). A restarted daemon takes them over
    /// without a gap. Without it nothing is pinned.
    #[arg(long, value_name = "PATH")]
    pub pin_dir: Option<PathBuf>,

    /// On SIGTERM/SIGINT: `remove` detaches and removes the pins; `keep` leaves
    /// the guard attached for the next daemon (what a DaemonSet wants).
    #[arg(long, value_enum, default_value_t = OnExit::Remove)]
    pub on_exit: OnExit,

    /// Serve /metrics, /healthz, /readyz, /status, /explain, /events,
    /// /counters, /responders, /clients, /cluster and /probes here
    /// (`none` to disable). Loopback by default: exposing it off the node is
    /// a deliberate choice.
    #[arg(long, value_name = "ADDR", default_value = DEFAULT_API, value_parser = parse_listen)]
    pub listen: Listen,

    /// Serve only /metrics here too (`none`: not at all), for a Prometheus
    /// that scrapes the node's address: the state endpoints (/status,
    /// /explain, /events, /counters) stay on --listen. In a DaemonSet with
    /// hostNetwork: `--metrics-listen=$(POD_IP):9478` (`[$(POD_IP)]:9478`
    /// on an IPv6 node).
    #[arg(long, value_name = "ADDR", default_value = "none", value_parser = parse_listen)]
    pub metrics_listen: Listen,

    /// Drop events handed to userspace per second per CPU (in-kernel rate
    /// limit; what exceeds it is counted as suppressed).
    #[arg(long, value_name = "N", default_value_t = 100, value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    pub event_rate: u32,

    /// Burst of drop events allowed above the rate.
    #[arg(long, value_name = "N", default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub event_burst: u32,

    /// Keep a JSON summary of the daemon's state (attachments, LB IP counts,
    /// Kubernetes feed health) in this file, rewritten atomically on change.
    #[arg(long, value_name = "PATH")]
    pub status_file: Option<PathBuf>,

    /// Do not load the responder census (the observe-only ingress program
    /// that records who claims each LB IP on the segment).
    #[arg(long)]
    pub no_census: bool,

    /// The census window: responders that claimed an LB IP within it are
    /// current (two at once are a conflict); a silence this long ends a
    /// claimant's run, so a failover is a move, not a conflict.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_duration)]
    pub census_window: Duration,

    /// Takeovers: an announcement (gratuitous ARP, unsolicited NA) this node
    /// sends for an LB IP foreign here is dropped, but held this long; if
    /// the IP becomes owned here within it (the ownership feed lags the
    /// announcer at a takeover), the same bytes are re-sent on the same
    /// interface at once. 0: dropped for good. Needs CAP_NET_RAW (an
    /// AF_PACKET socket to re-send).
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_duration)]
    pub announce_hold: Duration,

    /// A takeover (an LB IP becomes owned here) with no announcement leaving
    /// this node within this long is a silent takeover: logged, counted,
    /// alerted on (clients with a stale cache keep the old owner's MAC).
    #[arg(long, value_name = "DURATION", default_value = "3s", value_parser = parse_duration)]
    pub silent_takeover_after: Duration,

    /// A client still sending to this node for an LB IP another node owns,
    /// this long after this node lost the IP (or after its first packet,
    /// for an IP this node did not own), is stale: listed by `arp-guard
    /// clients` (exit 1), logged, counted in arp_guard_stale_clients. A
    /// client quiet here this long has followed the move: its failover time
    /// goes into arp_guard_client_failover_seconds.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub stale_client_after: Duration,

    /// How often the census's client totals are read (a walk of its table
    /// only when a packet was recorded since the last one; never more than
    /// 1/50 of a core).
    #[arg(long, value_name = "DURATION", default_value = "250ms", value_parser = parse_duration)]
    pub clients_read_period: Duration,

    /// Heal stale clients (enforce mode only): a unicast ARP reply / NA teaches a client
    /// sending here the owner's MAC, when certain (docs/failover.md). CAP_NET_RAW.
    #[arg(long)]
    pub refresh_stale_clients: bool,

    #[command(flatten)]
    pub presence: PresenceArgs,

    /// With --refresh-stale-clients: at most this many per client and IP a minute.
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=60))]
    pub refresh_per_minute: u32,

    /// How often a summary of the counters is logged (0 to disable).
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_duration)]
    pub stats_interval: Duration,

    /// Where the cgroup file system is mounted: the daemon's memory limit
    /// (cgroup v2 `memory.max`, else v1 `memory.limit_in_bytes`) is read
    /// under it, to warn and degrade before the limit is reached.
    #[arg(long, value_name = "PATH", default_value = "/sys/fs/cgroup")]
    pub cgroup_root: PathBuf,
}

/// Where `--pin-dir` defaults for commands that read or remove pins.
pub const DEFAULT_PIN_DIR: &str = "/sys/fs/bpf/arp-guard";

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AnnouncerArg {
    /// Deprecated, hidden: the ownership file is no announcer, and is read
    /// whenever --ownership-file is given; `--announcer file` still parses
    /// (and still needs --ownership-file), with a warning
    /// ([`RunArgs::deprecations`]).
    #[value(hide = true)]
    File,
    Cilium,
    KubeVip,
    Metallb,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KubeVipElection {
    PerService,
    Global,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ModeArg {
    Enforce,
    Monitor,
}

impl From<ModeArg> for Mode {
    fn from(m: ModeArg) -> Self {
        match m {
            ModeArg::Enforce => Mode::Enforce,
            ModeArg::Monitor => Mode::Monitor,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LeakArg {
    Rewrite,
    Drop,
}

impl From<LeakArg> for LeakAction {
    fn from(l: LeakArg) -> Self {
        match l {
            LeakArg::Rewrite => LeakAction::Rewrite,
            LeakArg::Drop => LeakAction::Drop,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AttachArg {
    Auto,
    Tcx,
    Netlink,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("5s").unwrap(), Duration::from_secs(5));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("7").unwrap(), Duration::from_secs(7));
        assert!(parse_duration("5 parsecs").is_err());
        assert!(parse_duration("x").is_err());
        assert_eq!(parse_duration("1h 30m").unwrap(), Duration::from_secs(5400));
        assert!(parse_duration("-5s").is_err(), "negative");
        assert!(parse_duration("99999999999999999999h").is_err());
    }

    /// The shipped RBAC grants exactly what the feed watches, what Events on
    /// Services need, Nodes for presence's coverage, what `--interface
    /// auto` reads (its Node, the announcers' interfaces) and this node's
    /// ArpGuardNode (the rendered
    /// manifests are checked against the CLI in tests/manifests.rs).
    #[test]
    fn rbac_grants_exactly_what_the_feed_watches_and_events_need() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
        let rbac = std::fs::read_to_string(root.join("base/rbac.yaml")).unwrap();
        let mut grants = Vec::new();
        for v in serde_saphyr::from_str_multiple::<serde_json::Value, Vec<_>>(&rbac).unwrap() {
            if v["kind"] != "ClusterRole" {
                continue;
            }
            for rule in v["rules"].as_array().unwrap() {
                let verbs: Vec<&str> = (rule["verbs"].as_array().unwrap().iter())
                    .map(|x| x.as_str().unwrap())
                    .collect();
                for g in rule["apiGroups"].as_array().unwrap() {
                    for r in rule["resources"].as_array().unwrap() {
                        let (g, r) = (g.as_str().unwrap(), r.as_str().unwrap());
                        grants.push(format!("{g}/{r}: {}", verbs.join(",")));
                    }
                }
            }
        }
        grants.sort();
        let l2 = crate::sources::cluster::stream::l2status_resource();
        assert_eq!(
            grants,
            [
                "/nodes: get,list".to_owned(),
                "/services: get,list,watch".into(),
                "arp-guard.io/arpguardnodes: get,create,patch".into(),
                "cilium.io/ciliuml2announcementpolicies: list,watch".into(),
                "coordination.k8s.io/leases: get,list,watch".into(),
                "events.k8s.io/events: create,patch".into(),
                "metallb.io/l2advertisements: list,watch".into(),
                format!("{}/{}: list,watch", l2.group, l2.plural)
            ]
        );
    }

    #[test]
    fn announcer_file_is_a_deprecated_alias() {
        let parse = |extra: &[&str]| {
            let mut argv = vec!["arp-guard", "run", "-i", "eth0"];
            argv.extend_from_slice(extra);
            match Cli::try_parse_from(argv).unwrap().command {
                Command::Run(run) => run,
                _ => unreachable!(),
            }
        };
        let old = parse(&["--announcer", "file", "--ownership-file", "o.yaml"]);
        assert_eq!(old.announcers, [AnnouncerArg::File]);
        let warned = old.deprecations();
        assert!(
            warned.len() == 1 && warned[0].contains("--announcer file is deprecated"),
            "{warned:?}"
        );
        let now = parse(&["--announcer", "metallb", "--ownership-file", "o.yaml"]);
        assert!(now.deprecations().is_empty());
        // Not offered any more, though still accepted.
        let hidden = |a: AnnouncerArg| a.to_possible_value().is_some_and(|v| v.is_hide_set());
        assert!(hidden(AnnouncerArg::File) && !hidden(AnnouncerArg::Metallb));
    }

    #[test]
    fn the_uplinks_are_chosen_automatically_unless_named() {
        let uplinks = |args: &[&str]| match Cli::try_parse_from(args).unwrap().command {
            Command::Run(r) => r.uplinks,
            _ => unreachable!("run"),
        };
        assert_eq!(
            uplinks(&["arp-guard", "run", "--lb-ips-from", "kube-ipvs0"]),
            ["auto"]
        );
        assert_eq!(
            uplinks(&["arp-guard", "run", "-i", "eno1", "-i", "auto"]),
            ["eno1", "auto"]
        );
        assert_eq!(
            uplinks(&["arp-guard", "run", "-i", "auto,eno2"]),
            ["auto", "eno2"]
        );
    }
}
