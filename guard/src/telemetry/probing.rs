//! The active census's document (`/probes`) and its metric families; the
//! census itself runs in `senders::probing`.

use std::{collections::BTreeMap, net::IpAddr, sync::Arc};

use serde::{Deserialize, Serialize};

use super::family::Values;
use crate::model::probing::{IpProbe, ProbingVerdict};

/// The active census as the API serves it (`/probes`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProbesDoc {
    /// Each IP is asked this often now (stretched by the caps).
    pub interval_seconds: f64,
    pub askers_per_ip: usize,
    pub node_max_per_second: u32,
    pub cluster_max_per_second: u32,
    pub silent_after: u32,
    /// Live guards sharing the work.
    pub live_guards: usize,
    /// Why it does not ask now, if it does not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<String>,
    /// Requests sent, by family, and sends that failed.
    pub sent: BTreeMap<String, u64>,
    pub send_errors: u64,
    /// IPs this node asks, by verdict.
    pub verdicts: BTreeMap<ProbingVerdict, usize>,
    /// Shared with the copy last published: the document goes out every
    /// second, the table only when a verdict changed (or every 10 s).
    pub ips: Arc<BTreeMap<IpAddr, IpProbe>>,
}

/// The families `/metrics` adds for the active census.
pub(super) fn families(v: &mut Values, doc: &ProbesDoc) {
    v.counters.push((
        "arp_guard_probes_sent",
        "Requests the active census sent (ARP for IPv4, Neighbor Solicitations for IPv6), by family.",
        ["ipv4", "ipv6"]
            .into_iter()
            .map(|f| {
                (
                    vec![("family", f.to_owned())],
                    doc.sent.get(f).copied().unwrap_or(0),
                )
            })
            .collect(),
    ));
    v.counters.push((
        "arp_guard_probe_send_errors",
        "Requests of the active census that could not be sent.",
        vec![(vec![], doc.send_errors)],
    ));
    v.gauges.push((
        "arp_guard_probe_ips",
        "LB IPs this node asks about, by the verdict of its latest requests (pending, answered, conflict, silent_owner, wrong_interface).",
        ProbingVerdict::ALL
            .iter()
            .map(|verdict| {
                (
                    vec![("verdict", verdict.as_str().to_owned())],
                    doc.verdicts.get(verdict).copied().unwrap_or(0) as f64,
                )
            })
            .collect(),
    ));
    v.gauges.push((
        "arp_guard_probe_interval_seconds",
        "How often each LB IP is asked about now (the configured interval, stretched by the rate caps); 0 while paused.",
        vec![(
            vec![],
            if doc.paused.is_some() {
                0.0
            } else {
                doc.interval_seconds
            },
        )],
    ));
}
