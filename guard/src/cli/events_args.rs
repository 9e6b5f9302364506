//! The flags of Kubernetes Events on the Service (`arp-guard run`).

use std::time::Duration;

use clap::Args;

use super::parse_duration;
use crate::{
    daemon::KubeEventsConfig,
    model::kube_events::{Limits, MAX_STALE_LISTED},
};

#[derive(Args, Debug, Clone)]
pub struct KubeEventsArgs {
    /// Publish Kubernetes Events on the Service of an LB IP (a responder
    /// conflict, a split-brain speaker, a silent takeover, stale clients;
    /// `kubectl describe svc`). Needs an announcer read from the API (the
    /// Service of each IP) and create/patch on events.k8s.io events.
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    pub kube_events: bool,

    /// At most one Event (or series update) per Service and reason this
    /// often from this node; what happens meanwhile waits for the next turn.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_duration)]
    pub kube_events_interval: Duration,

    /// At most this many Events a minute from this node, in all.
    #[arg(long, value_name = "N", default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub kube_events_per_minute: u32,

    /// A speaker on this node announcing an LB IP another node owns, stopped
    /// by the guard without a pause (of a minute) this long, is split brain:
    /// a SplitBrainSpeaker Event. Also how late the ownership feed may be at
    /// a takeover: a speaker's frame of an IP that becomes owned here within
    /// it (after --announce-hold) is counted late, not split brain
    /// (arp_guard_announce_total), and another MAC claiming an IP owned here
    /// is a responder conflict once it has lasted this long.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub split_brain_after: Duration,

    /// This many stale clients of one LB IP on this node make a StaleClients
    /// Event (at most 8: the clients the Event lists).
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=MAX_STALE_LISTED as i64))]
    pub kube_events_stale_clients: u32,
}

impl KubeEventsArgs {
    pub fn config(&self) -> KubeEventsConfig {
        KubeEventsConfig {
            enabled: self.kube_events,
            limits: Limits {
                per_stream: self.kube_events_interval,
                per_minute: self.kube_events_per_minute,
            },
            split_brain_after: self.split_brain_after,
            stale_clients: self.kube_events_stale_clients as usize,
            // Set with presence (`cli/config.rs`).
            review: std::time::Duration::ZERO,
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use crate::cli::{Cli, Command};

    fn run(n: &str) -> Result<Cli, clap::Error> {
        Cli::try_parse_from([
            "arp-guard",
            "run",
            "--interface",
            "eth0",
            "--lb-ips-from",
            "kube-ipvs0",
            "--kube-events-stale-clients",
            n,
        ])
    }

    /// A threshold above the clients an Event lists could never be
    /// reached: refused at start, naming the flag, rather than silent.
    #[test]
    fn the_stale_clients_threshold_is_at_most_the_clients_listed() {
        let Command::Run(args) = run("8").unwrap().command else {
            panic!("not run")
        };
        assert_eq!(args.kube_events.config().stale_clients, 8);
        let err = run("9").unwrap_err().to_string();
        assert!(err.contains("--kube-events-stale-clients"), "{err}");
    }
}
