//! The arguments of presence (`run`: every guard says who it is, in a Lease
//! of its namespace) and of `status` (`--cluster`: every guard's record).

use std::time::Duration;

use clap::Args;

use super::{parse_duration, ClientArgs};

#[derive(Debug, Clone, Args)]
pub struct PresenceArgs {
    /// How often this guard renews its presence Lease `arp-guard-<node>`
    /// (its interfaces' MACs, mode, version, health; it lasts 3 periods) and
    /// reads every guard's. Needs the Kubernetes API (an announcer that
    /// reads it); 0 turns presence off.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub presence_period: Duration,
    /// Namespace of the presence Leases: the guard's own ($POD_NAMESPACE from
    /// the downward API), else the service account's, else the kubeconfig's.
    #[arg(long, env = "POD_NAMESPACE", value_name = "NS")]
    pub presence_namespace: Option<String>,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Every guard of the cluster instead: nodes with a live guard (mode,
    /// health, MACs, age of their record) and nodes without one.
    #[arg(long)]
    pub cluster: bool,
    #[command(flatten)]
    pub client: ClientArgs,
}
