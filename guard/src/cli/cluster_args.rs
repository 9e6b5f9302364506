//! The arguments of presence (`run`: every guard says who it is, in a Lease
//! of its namespace) and of `status` (`--cluster`: every guard's record).

use std::time::Duration;

use clap::Args;

use super::{parse_duration, ClientArgs};

#[derive(Debug, Clone, Args)]
pub struct PresenceArgs {
    /// How often this guard compares its presence record (its interfaces'
    /// MACs, mode, version, health) with the Lease `arp-guard-<node>` it
    /// wrote: a local check, the Lease is written only when they differ.
    /// Every guard's record is followed with one watch, their liveness
    /// with a watch of the guard Pods' readiness: nothing is renewed.
    /// Needs the Kubernetes API (an announcer that reads it); 0 turns
    /// presence off.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub presence_period: Duration,
    /// Label selector of the guard Pods in the presence namespace: a guard
    /// is live while its record exists and its Pod on that node is Ready.
    #[arg(
        long,
        value_name = "SELECTOR",
        default_value = "app.kubernetes.io/name=arp-guard"
    )]
    pub presence_pods: String,
    /// Namespace of the presence Leases (the DaemonSet sets $POD_NAMESPACE,
    /// the guard's own, from the downward API); unset, the service
    /// account's namespace, else the kubeconfig's.
    #[arg(long, env = "POD_NAMESPACE", value_name = "NS")]
    pub presence_namespace: Option<String>,
    /// This node's findings (mode, health, uplinks, the LB IPs it owns with
    /// their last takeover, conflicts, clients still sending here) go into
    /// its ArpGuardNode, cluster-scoped, named after the node, owned by the
    /// Node: written when they change, at most once per this long (plus up
    /// to a fifth of it, random), never at rest; what `kubectl arp-guard
    /// status` reads. Needs the Kubernetes API and the CRD; 0 turns it off.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub node_report_interval: Duration,
    #[command(flatten)]
    pub probing: ProbingArgs,
}

/// The active census: each guard asks (ARP, NS) about a share of the LB IPs
/// it does not own, so that unicast answers and silence are seen too.
#[derive(Debug, Clone, Args)]
pub struct ProbingArgs {
    /// How often each LB IP is asked about (jittered; stretched by the caps
    /// below). Needs presence (the share is computed over the live guards)
    /// and the census; 0 turns the active census off.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub probe_interval: Duration,
    /// Guards asking about each LB IP (chosen by rendezvous hashing over the
    /// live guards, never the owner).
    #[arg(long, value_name = "N", default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=8))]
    pub probe_askers: u32,
    /// At most this many requests a second from this node.
    #[arg(long, value_name = "N", default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub probe_max_per_second: u32,
    /// At most this many requests a second from all guards together (the
    /// interval stretches to keep the segment's broadcast load under it).
    #[arg(long, value_name = "N", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=10000))]
    pub probe_cluster_max_per_second: u32,
    /// Requests in a row without the owner's answer that make it a silent owner.
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub probe_silent_after: u32,
    /// Run the active census in monitor mode too. Off by default: monitor
    /// mode sends nothing on the wire (the passive census still listens).
    #[arg(long)]
    pub probe_in_monitor_mode: bool,
}

impl ProbingArgs {
    /// The pace, or None when off.
    pub fn pace(&self) -> Option<crate::model::probing::Pace> {
        (!self.probe_interval.is_zero()).then_some(crate::model::probing::Pace {
            interval: self.probe_interval,
            askers: self.probe_askers as usize,
            node_max: self.probe_max_per_second,
            cluster_max: self.probe_cluster_max_per_second,
            silent_after: self.probe_silent_after,
        })
    }
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Every guard of the cluster instead: nodes with a live guard (mode,
    /// health, MACs, age of their record) and nodes without one.
    #[arg(long, conflicts_with = "probes")]
    pub cluster: bool,
    /// The active census instead: the LB IPs this node asks about, who
    /// answered, and the verdicts (exit 1 for a conflict, a silent owner or
    /// a wrong interface).
    #[arg(long)]
    pub probes: bool,
    /// Only the LB IPs this node has something to say about: owned here,
    /// in conflict, or with misdirected clients (what `kubectl arp-guard
    /// status` asks each node).
    #[arg(long, conflicts_with_all = ["cluster", "probes"])]
    pub brief: bool,
    /// Only this LB IP's rows.
    #[arg(conflicts_with_all = ["cluster", "probes"])]
    pub ip: Option<std::net::IpAddr>,
    #[command(flatten)]
    pub client: ClientArgs,
}
