//! `/metrics`: Prometheus text format, built with `prometheus-client` from
//! the kernel-side counters (read at scrape time) and the daemon's state.
//!
//! Every family, its type, help and labels: `catalogue` (read off a
//! rendered scrape), and docs/reference/metrics.md generated from it.

use std::sync::atomic::Ordering;

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric as _},
    metrics::{counter::ConstCounter, gauge::ConstGauge, MetricType},
    registry::Registry,
};

use super::{
    counters::Snapshot,
    histogram::Histogram,
    status::{DaemonStatus, InterfaceState},
    takeover::{TakeoverStats, OUTCOMES},
};
use crate::{
    model::census::Reason,
    ops::Ops,
    telemetry::{census::CensusDoc, clients::ClientsDoc},
};

use super::family::Values;
use super::feed_metrics::{by_stream, cluster, memory};
pub use super::fold::Fold;

/// A histogram as it stands at this scrape.
#[derive(Debug)]
struct ConstHistogram<'a>(&'a Histogram);

impl prometheus_client::encoding::EncodeMetric for ConstHistogram<'_> {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::MetricEncoder,
    ) -> Result<(), std::fmt::Error> {
        let h = self.0;
        encoder.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
            h.sum,
            h.count,
            &h.buckets(),
            None,
        )
    }
    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

impl Collector for Values {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for (name, help, series) in &self.counters {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (labels, v) in series {
                ConstCounter::new(*v).encode(family.encode_family(labels)?)?;
            }
        }
        for (name, help, series) in &self.gauges {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (labels, v) in series {
                ConstGauge::new(*v).encode(family.encode_family(labels)?)?;
            }
        }
        for (name, help, series) in &self.histograms {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Histogram)?;
            for (labels, h) in series {
                ConstHistogram(h).encode(family.encode_family(labels)?)?;
            }
        }
        Ok(())
    }
}

/// What one scrape is made of.
pub struct Scrape<'a> {
    /// The kernel counters, read now.
    pub snapshot: &'a Snapshot,
    /// Which rows keep their IP label (kept from scrape to scrape).
    pub fold: &'a mut Fold,
    /// `--metrics-max-ip-series`.
    pub max_ip_series: usize,
    pub status: Option<&'a DaemonStatus>,
    /// With a Kubernetes feed: seconds it has been failing (0: healthy).
    pub feed_unhealthy_seconds: Option<f64>,
    /// The responder census, when it runs.
    pub census: Option<&'a CensusDoc>,
    /// Held announcements and takeovers, once the daemon has started.
    pub takeover: Option<&'a TakeoverStats>,
    /// Misdirected and stale clients, when the census runs.
    pub clients: Option<&'a ClientsDoc>,
    /// Presence, when it runs: nodes by state (live, not_ready, uncovered).
    pub presence_nodes: Option<Vec<(&'static str, f64)>>,
    /// The active census, while it runs.
    pub probes: Option<&'a super::probing::ProbesDoc>,
    /// The daemon's memory against its cgroup's limit, once sampled.
    pub memory: Option<&'a super::memory::MemoryStatus>,
    /// The daemon's operation counters.
    pub ops: &'a Ops,
}

/// The Prometheus text of one scrape (it fails only if the encoder does).
pub fn render(scrape: Scrape<'_>) -> Result<String, std::fmt::Error> {
    let mut v = Values::default();
    kernel(&mut v, scrape.snapshot, scrape.fold, scrape.max_ip_series);
    if let Some(status) = scrape.status {
        daemon(&mut v, status);
        if let Some(feed) = &status.feed {
            cluster(&mut v, feed);
        }
    }
    if let Some(secs) = scrape.feed_unhealthy_seconds {
        v.gauges.push((
            "arp_guard_feed_unhealthy_seconds",
            "Seconds the Kubernetes feed has been failing (0: healthy).",
            vec![(vec![], secs)],
        ));
    }
    if let Some(c) = scrape.census {
        census(&mut v, c, scrape.max_ip_series);
    }
    if let Some(t) = scrape.takeover {
        takeovers(&mut v, t);
    }
    if let Some(c) = scrape.clients {
        let f = super::clients_metrics::families(super::clients_metrics::Parts::of(c));
        v.counters.extend(f.counters);
        v.gauges.extend(f.gauges);
        v.histograms.push((
            "arp_guard_client_failover_seconds",
            "Client-visible failover time: a client's last packet here after this node lost the LB IP, minus the moment of the move (observed once the client has gone quiet).",
            vec![(vec![], c.failover.clone())],
        ));
    }
    if let Some(m) = scrape.memory {
        memory(&mut v, m);
    }
    if let Some(p) = scrape.presence_nodes {
        super::feed_metrics::presence(&mut v, p);
    }
    if let Some(p) = scrape.probes {
        super::probing::families(&mut v, p);
    }
    operations(&mut v, scrape.ops);
    let mut registry = Registry::default();
    registry.register_collector(Box::new(v));
    let mut out = String::new();
    prometheus_client::encoding::prometheus_text::encode(&mut out, &registry)?;
    Ok(out)
}

/// What the program counted in the kernel.
fn kernel(v: &mut Values, snap: &Snapshot, fold: &mut Fold, max_ip_series: usize) {
    let (frames, folded) = fold.series(snap, max_ip_series);
    v.gauges.push((
        "arp_guard_metrics_folded_series",
        "Per-LB-IP counter series folded into lb_ip=\"other\" (--metrics-max-ip-series).",
        vec![(vec![], folded as f64)],
    ));
    v.counters.push((
        "arp_guard_arp_frames",
        "Announcements of LB IPs (ARP, and IPv6 Neighbor Discovery: family=\"ipv6\") judged by the egress program, by decision.",
        frames,
    ));
    let (events, totals): (Vec<_>, Vec<_>) = snap
        .stats
        .iter()
        .partition(|(k, _)| k.starts_with("events_"));
    v.counters.push((
        "arp_guard_datapath_frames",
        "Frames seen by the egress program, by class (no LB IP label).",
        totals
            .into_iter()
            .map(|(k, n)| (vec![("class", (*k).to_owned())], *n))
            .collect(),
    ));
    v.counters.push((
        "arp_guard_drop_events",
        "Drop/rewrite events sent to userspace (delivered) or held back by the in-kernel rate limit (suppressed).",
        events.into_iter().map(|(k, n)| (vec![("outcome", k.trim_start_matches("events_").to_owned())], *n)).collect(),
    ));
}

/// The daemon's state: LB IPs, maps, attachments, mode.
fn daemon(v: &mut Values, status: &DaemonStatus) {
    let c = &status.lb_ips;
    v.gauges.push((
        "arp_guard_lb_ips",
        "LB IPs known to this node, by this node's state for them and address family.",
        [
            ("owned", c.owned, c.ipv6.owned),
            ("foreign", c.foreign, c.ipv6.foreign),
            ("unknown", c.unknown, c.ipv6.unknown),
        ]
        .into_iter()
        .flat_map(|(state, all, v6)| {
            [("ipv4", all.saturating_sub(v6)), ("ipv6", v6)].map(|(family, n)| {
                let labels = vec![("state", state.to_owned()), ("family", family.to_owned())];
                (labels, n as f64)
            })
        })
        .collect(),
    ));
    v.gauges.push((
        "arp_guard_lb_ips_not_enforced",
        "LB IPs that did not fit in the full map (not guarded).",
        vec![(vec![], status.not_enforced as f64)],
    ));
    v.gauges.push((
        "arp_guard_map_memory_bytes",
        "Kernel memory held by the program's maps.",
        vec![(vec![], status.map_memory_bytes as f64)],
    ));
    v.gauges.push((
        "arp_guard_programs_attached",
        "1 for each interface the egress program is attached to.",
        status
            .interfaces
            .iter()
            .filter(|i| i.state == InterfaceState::Attached)
            .map(|i| {
                (
                    vec![("interface", i.name.clone()), ("attach", i.detail.clone())],
                    1.0,
                )
            })
            .collect(),
    ));
    v.gauges.push((
        "arp_guard_uplink_info",
        "1 for each uplink and each reason it was chosen (chosen_by: interface, default-route, node-ip, announcer, kept).",
        (status.interfaces.iter())
            .filter(|i| i.state == InterfaceState::Attached)
            .flat_map(|i| {
                let mut kinds: Vec<&str> = i.chosen_by.iter().map(|c| c.kind.as_str()).collect();
                kinds.sort_unstable();
                kinds.dedup();
                kinds.into_iter().map(|k| {
                    let labels = vec![("interface", i.name.clone()), ("chosen_by", k.to_owned())];
                    (labels, 1.0)
                })
            })
            .collect(),
    ));
    v.gauges.push((
        "arp_guard_mode",
        "1 for the mode in force.",
        vec![(vec![("mode", status.mode.clone())], 1.0)],
    ));
    findings(v, status);
}

/// What the daemon finds of its own node and of the cluster's records:
/// carrier on its uplinks, owned IPs nobody can hear, split elections.
fn findings(v: &mut Values, status: &DaemonStatus) {
    let c = &status.lb_ips;
    v.gauges.push((
        "arp_guard_uplink_carrier",
        "1 for each uplink with carrier, 0 for one without.",
        (status.interfaces.iter())
            .filter_map(|i| {
                Some((
                    vec![("interface", i.name.clone())],
                    f64::from(u8::from(i.carrier?)),
                ))
            })
            .collect(),
    ));
    v.gauges.push((
        "arp_guard_owned_ips_without_carrier",
        "LB IPs this node owns while none of its uplinks has carrier (nobody can hear it answer).",
        vec![(
            vec![],
            status
                .owner_link_down
                .as_ref()
                .map_or(0.0, |d| d.owned as f64),
        )],
    ));
    v.gauges.push((
        "arp_guard_split_election_ips",
        "LB IPs shared by Services whose announcer's records name different nodes (a split election), as this node reads them; settled: kept on one node by --settle-shared-ips.",
        [("false", c.split.saturating_sub(c.split_settled)), ("true", c.split_settled)]
            .map(|(settled, n)| (vec![("settled", settled.to_owned())], n as f64))
            .into(),
    ));
}

/// Who claims each LB IP. One series per LB IP with a current claim, at
/// most `max_ip_series` of them, IPs in conflict first: the cardinality is
/// bounded by the LB set and the flag, never by what arrives on the wire.
fn census(v: &mut Values, c: &CensusDoc, max_ip_series: usize) {
    let mut claimed: Vec<(&std::net::IpAddr, &crate::model::census::IpCensus)> =
        c.ips.iter().filter(|(_, e)| e.active > 0).collect();
    claimed.sort_by_key(|(ip, e)| (e.conflict.is_none(), **ip));
    v.gauges.push((
        "arp_guard_responders",
        "MACs that claimed the LB IP within the census window (more than 1 at once: a conflict).",
        claimed
            .iter()
            .take(max_ip_series)
            .map(|(ip, e)| {
                let family = guard_common::family(ip).to_owned();
                (
                    vec![("lb_ip", ip.to_string()), ("family", family)],
                    e.active as f64,
                )
            })
            .collect(),
    ));
    v.gauges.push((
        "arp_guard_responder_conflicts",
        "LB IPs in conflict: contested (several MACs at once) or claimed_elsewhere (owned here, claimed by another MAC).",
        [Reason::Contested, Reason::ClaimedElsewhere]
            .iter()
            .map(|r| {
                let n = c.ips.values().filter(|e| e.conflict == Some(*r)).count();
                (vec![("reason", r.as_str().to_owned())], n as f64)
            })
            .collect(),
    ));
    v.counters.push((
        "arp_guard_census_frames",
        "Frames of the ingress census: ARP parsed, claims of LB IPs recorded, claims the table refused.",
        c.totals
            .iter()
            .map(|(k, n)| (vec![("outcome", k.clone())], *n))
            .collect(),
    ));
    v.gauges.push((
        "arp_guard_census_entries",
        "Entries in the census table (LRU; capacity in the status).",
        vec![(vec![], c.entries as f64)],
    ));
}

/// Takeovers: held announcements and their fate, the first announcement.
fn takeovers(v: &mut Values, t: &TakeoverStats) {
    v.counters.push((
        "arp_guard_announce",
        "A speaker's (or datapath responder's) frames of LB IPs foreign here: announcements the program dropped and copied to the daemon (deferred), and frames not held but noted (noted: monitor mode, replies), and what became of them: this node became the owner within --announce-hold (replayed: re-sent; in_time), later within --split-brain-after (late: a late ownership feed), not by then (expired: split brain); already held (duplicate: the copy renewed, the repeat judged like a noted one), no room (overflow), re-send failed (replay_failed), not this node's (not_local).",
        OUTCOMES
            .iter()
            .map(|o| {
                let n = t.held.get(o).copied().unwrap_or(0);
                (vec![("outcome", (*o).to_owned())], n)
            })
            .collect(),
    ));
    v.gauges.push((
        "arp_guard_announcements_held",
        "Announcements held now, waiting for a takeover.",
        vec![(vec![], t.holding as f64)],
    ));
    v.counters.push((
        "arp_guard_takeovers",
        "LB IPs that became owned here.",
        vec![(vec![], t.takeovers)],
    ));
    v.counters.push((
        "arp_guard_silent_takeovers",
        "Takeovers with no announcement leaving this node within --silent-takeover-after.",
        vec![(vec![], t.silent)],
    ));
    v.histograms.push((
        "arp_guard_announce_replay_delay_seconds",
        "How long a held announcement waited between its drop and its re-send: the delay the guard added to a takeover.",
        vec![(vec![], t.replay_delay.clone())],
    ));
    v.histograms.push((
        "arp_guard_takeover_first_announcement_seconds",
        "From an ownership change that made this node an LB IP's owner (as the feed saw it) to the first announcement that left it (0: it left first).",
        vec![(vec![], t.first_announcement.clone())],
    ));
}

/// What the daemon did: feed events, rebuilds, map updates, errors.
fn operations(v: &mut Values, ops: &Ops) {
    v.counters
        .push(super::feed_metrics::kube_events(&ops.kube_events));
    v.counters.push((
        "arp_guard_feed_undecodable_objects",
        "Objects from the Kubernetes API that could not be decoded (skipped), by stream.",
        by_stream(&ops.feed_undecodable),
    ));
    v.counters.push((
        "arp_guard_feed_not_admitted",
        "New Kubernetes objects not taken in under memory pressure, by stream.",
        by_stream(&ops.feed_not_admitted),
    ));
    v.counters.push((
        "arp_guard_feed_events",
        "Watch events received from the Kubernetes API, by stream.",
        ops.feed_events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(k, n)| (vec![("source", k.clone())], *n))
            .collect(),
    ));
    v.counters.push((
        "arp_guard_feed_rebuilds",
        "Kubernetes watch streams rebuilt (relisted), by stream and reason (idle, stuck, api_back, memory).",
        ops.feed_rebuilds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|((s, r), n)| (vec![("stream", s.clone()), ("reason", r.as_str().to_owned())], *n))
            .collect(),
    ));
    v.counters.push((
        "arp_guard_map_updates",
        "BPF map entries written or removed by the daemon.",
        vec![
            (
                vec![("op", "write".into())],
                ops.map_writes.load(Ordering::Relaxed),
            ),
            (
                vec![("op", "remove".into())],
                ops.map_removes.load(Ordering::Relaxed),
            ),
        ],
    ));
    v.counters.push((
        "arp_guard_errors",
        "Errors by cause.",
        ops.errors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(k, n)| (vec![("cause", k.as_str().to_owned())], *n))
            .collect(),
    ));
}

#[cfg(test)]
mod tests {
    /// Metric names (arp_guard_...) used in a text.
    fn used(text: &str) -> Vec<String> {
        let mut out = Vec::new();
        let b = text.as_bytes();
        let mut i = 0;
        while let Some(p) = text[i..].find("arp_guard_") {
            let start = i + p;
            let mut end = start;
            while end < b.len() && (b[end].is_ascii_alphanumeric() || b[end] == b'_') {
                end += 1;
            }
            out.push(text[start..end].to_owned());
            i = end;
        }
        out
    }

    #[test]
    fn dashboard_and_alerts_are_well_formed() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
        let dash = std::fs::read_to_string(root.join("monitoring/grafana-dashboard.json")).unwrap();
        let v: serde_json::Value = serde_json::from_str(&dash).unwrap();
        let exprs: Vec<String> = v["panels"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|p| {
                p["targets"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|t| t["expr"].as_str().unwrap().to_owned())
            })
            .collect();
        assert!(exprs.len() >= 10);
        let rules = std::fs::read_to_string(root.join("monitoring/prometheusrule.yaml")).unwrap();
        let r: serde_json::Value = serde_saphyr::from_str(&rules).unwrap();
        let mut rule_exprs = Vec::new();
        for g in r["spec"]["groups"].as_array().unwrap() {
            for rule in g["rules"].as_array().unwrap() {
                assert!(
                    rule["alert"].as_str().is_some_and(|a| !a.is_empty()),
                    "{rule:?}"
                );
                assert!(
                    rule["annotations"]["summary"].as_str().is_some(),
                    "{rule:?}"
                );
                rule_exprs.push(rule["expr"].as_str().unwrap().to_owned());
            }
        }
        assert!(rule_exprs.len() >= 5);
        // That each name is exported: reference.rs, over every page too.
        for e in exprs.iter().chain(&rule_exprs) {
            assert!(!used(e).is_empty(), "no arp-guard metric in {e}");
            // Balanced parentheses and braces: a cheap check of the PromQL's shape.
            for (o, c) in [('(', ')'), ('{', '}'), ('[', ']')] {
                assert_eq!(
                    e.matches(o).count(),
                    e.matches(c).count(),
                    "unbalanced {o}{c} in {e}"
                );
            }
        }
    }
}
