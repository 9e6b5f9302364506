//! `kubectl arp-guard`: its arguments. kubectl passes a plugin's arguments
//! as they are, so the usual kubectl flags (`--kubeconfig`, `--context`,
//! `-n`) are the plugin's own.
//!
//! Here rather than in the plugin's crate: the daemon's generated reference
//! (`arp-guard reference`: docs/reference/flags.md, and the check of every
//! flag the pages name) lists the plugin's flags from this definition, and
//! would otherwise link the plugin's crate, its client and its kube-rs
//! features into the daemon's build.

use std::{net::IpAddr, path::PathBuf, time::Duration};

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::cli::parse_duration;

#[derive(Debug, Parser)]
#[command(
    name = "kubectl-arp_guard",
    bin_name = "kubectl arp-guard",
    version,
    about = "The segment's story from a laptop: every arp-guard of the cluster, read from the API server.",
    long_about = "The segment's story from a laptop: every arp-guard of the cluster, read from the \
        API server.\n\n\
        `status`, `clients`, `responders` and `events` only read (get/list): each guard keeps its \
        node's findings in its ArpGuardNode (the LB IPs it owns with their last takeover, the IPs \
        in conflict and who claims them, the clients still reaching it, its uplinks), written \
        when they change; one list of those, the LoadBalancer Services, the guard Pods' readiness \
        and arp-guard's Events, each from the API server's cache. Every row says how fresh it is \
        (its objects' last write) and whose guard is not Ready. What only a node knows now \
        (`explain`, `doctor`, and any view with --live) is asked of each guard by running its own \
        `arp-guard ... -o json` in its Pod (pods/exec), a bounded number at a time, each within \
        --node-timeout and all within --timeout.\n\n\
        Exit codes: 0 nothing found, 1 a finding (a conflict, stale clients, a silent takeover, a \
        Warning Event, a guard that did not report or answer or is not Ready; a node without a \
        guard Pod is listed, not counted), 2 could not ask (no access, API unreachable, no guard \
        reported or answered, or not the one --node named).",
    after_help = "RBAC: deploy/components/kubectl-plugin: arp-guard-viewer (read-only: status, clients, responders, events) and arp-guard-operator (exec into the guard Pods: explain, doctor, --live; not read-only, docs/kubectl-arp-guard.md)."
)]
pub struct PluginCli {
    #[command(flatten)]
    pub conn: ConnArgs,
    #[command(subcommand)]
    pub command: PluginCommand,
}

/// How to reach the cluster and its guards (flags of every subcommand).
#[derive(Debug, Clone, Args)]
pub struct ConnArgs {
    /// The kubeconfig file (default: $KUBECONFIG, else ~/.kube/config).
    #[arg(long, global = true, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use.
    #[arg(long, global = true, value_name = "NAME")]
    pub context: Option<String>,
    /// The guards' namespace.
    #[arg(
        short = 'n',
        long,
        global = true,
        value_name = "NS",
        default_value = "arp-guard"
    )]
    pub namespace: String,
    /// Label selector of the guard Pods.
    #[arg(
        long,
        global = true,
        value_name = "SELECTOR",
        default_value = "app.kubernetes.io/name=arp-guard"
    )]
    pub selector: String,
    /// The guard's container in its Pod.
    #[arg(long, global = true, value_name = "NAME", default_value = "arp-guard")]
    pub container: String,
    /// Ask only this node's guard.
    #[arg(long, global = true, value_name = "NODE")]
    pub node: Option<String>,
    /// Guards asked at once.
    #[arg(long, global = true, value_name = "N", default_value_t = 32,
          value_parser = clap::value_parser!(u32).range(1..=512))]
    pub parallel: u32,
    /// How long one guard may take to answer (then it is listed as not
    /// answering).
    #[arg(long, global = true, value_name = "DURATION", default_value = "15s", value_parser = parse_duration)]
    pub node_timeout: Duration,
    /// How long the command may take to ask the guards, in all (then those
    /// that have not answered are listed as such): a cluster of hung guards
    /// is reported in minutes, not in nodes / --parallel x --node-timeout.
    #[arg(long, global = true, value_name = "DURATION", default_value = "2m", value_parser = parse_duration)]
    pub timeout: Duration,
    /// How long a read of the API may take.
    #[arg(long, global = true, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub request_timeout: Duration,
    /// Output format.
    #[arg(short, long, global = true, value_enum, default_value_t = Format::Table)]
    pub output: Format,
    /// Ask each guard now (pods/exec) instead of reading its ArpGuardNode:
    /// `status`, `clients` (with each client's MAC and IP) and `responders`
    /// (every MAC the census saw). Needs the arp-guard-operator role.
    #[arg(long, global = true)]
    pub live: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Table,
    /// The table with more columns.
    Wide,
    Json,
    Yaml,
}

#[derive(Debug, Subcommand)]
pub enum PluginCommand {
    /// One row per LB IP for the whole cluster: its Service, the owner,
    /// the owner's guard, who claims it on the wire, the last takeover,
    /// stale clients and the last hour's Warning Events; then every guard
    /// that did not answer.
    Status {
        /// Only this LB IP.
        ip: Option<IpAddr>,
    },
    /// Clients whose traffic for an LB IP reaches a node that does not own
    /// it, from every node that has any, each line labelled with its node.
    Clients {
        /// Only this LB IP.
        ip: Option<IpAddr>,
    },
    /// Who claims each LB IP on the wire, as each node's census saw it.
    Responders {
        /// Only this LB IP.
        ip: Option<IpAddr>,
    },
    /// How each node treats an LB IP, and why.
    Explain {
        /// The LB IP (IPv4 or IPv6).
        ip: IpAddr,
    },
    /// arp-guard's Kubernetes Events (on the Services of LB IPs), each with
    /// the node that posted it.
    Events {
        /// Only Events of this LB IP's Service.
        ip: Option<IpAddr>,
        /// Only Events seen within this long.
        #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = parse_duration)]
        since: Duration,
    },
    /// Run `arp-guard doctor` on a node (--node) or on every node.
    Doctor {
        /// Every node (else --node is required).
        #[arg(long)]
        all_nodes: bool,
    },
}
