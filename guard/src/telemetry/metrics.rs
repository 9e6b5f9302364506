//! `/metrics`: Prometheus text format, built with `prometheus-client` from
//! the kernel-side counters (read at scrape time) and the daemon's state.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `arp_guard_arp_frames_total` | counter | lb_ip, family, interface, kind, origin, state, verdict (ARP and NDP) |
//! | `arp_guard_datapath_frames_total` | counter | class (frames, arp, malformed, not_lb, ...) |
//! | `arp_guard_drop_events_total` | counter | outcome (delivered, suppressed) |
//! | `arp_guard_lb_ips` | gauge | state, family |
//! | `arp_guard_lb_ips_not_enforced` | gauge | |
//! | `arp_guard_feed_unhealthy_seconds` | gauge | |
//! | `arp_guard_feed_degraded` | gauge | |
//! | `arp_guard_programs_attached` | gauge | interface, attach |
//! | `arp_guard_mode` | gauge | mode |
//! | `arp_guard_map_memory_bytes` | gauge | |
//! | `arp_guard_feed_events_total` | counter | source |
//! | `arp_guard_map_updates_total` | counter | op |
//! | `arp_guard_errors_total` | counter | cause |
//! | `arp_guard_metrics_folded_series` | gauge | |
//! | `arp_guard_feed_stream_healthy` | gauge | stream |
//! | `arp_guard_feed_unconfirmed_leases` | gauge | |
//! | `arp_guard_feed_rebuilds_total` | counter | stream, reason |
//! | `arp_guard_feed_undecodable_objects_total` | counter | stream |
//! | `arp_guard_feed_unreadable_objects` | gauge | stream |
//! | `arp_guard_feed_not_admitted_total` | counter | stream |
//! | `arp_guard_memory_bytes` | gauge | kind (resident, maps) |
//! | `arp_guard_memory_limit_bytes` | gauge | |
//! | `arp_guard_memory_pressure` | gauge | |
//! | `arp_guard_responders` | gauge | lb_ip, family (current claims only, at most --metrics-max-ip-series) |
//! | `arp_guard_responder_conflicts` | gauge | reason |
//! | `arp_guard_census_frames_total` | counter | outcome |
//! | `arp_guard_census_entries` | gauge | |

use std::sync::atomic::Ordering;

use anyhow::Result;
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric as _},
    metrics::{counter::ConstCounter, gauge::ConstGauge, MetricType},
    registry::Registry,
};

use super::{
    counters::{Row, Snapshot},
    ops::OPS,
    status::{Feed, InterfaceState, Status},
};
use crate::{model::census::Reason, telemetry::census::CensusDoc};

type Labels = Vec<(&'static str, String)>;
/// (name, help, series).
type Family<V> = (&'static str, &'static str, Vec<(Labels, V)>);

/// One scrape's worth of values.
#[derive(Debug, Default)]
struct Values {
    counters: Vec<Family<u64>>,
    gauges: Vec<Family<f64>>,
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
        Ok(())
    }
}

/// Which counter rows keep their own `lb_ip` in /metrics, and what the
/// folded rest has added up to. Chosen first come, first labelled, and
/// stable: a labelled row stays labelled and a folded one stays folded until
/// its IP's rows are reclaimed, so no series flaps and `lb_ip="other"` only
/// grows (it adds each folded row's increase), as a counter must. Passed
/// frames may take at most three quarters of the labels: rows of frames
/// stopped (what alerts need) always find room.
#[derive(Debug, Default)]
pub struct Fold {
    labelled: std::collections::HashSet<guard_common::CounterKey>,
    labelled_passed: usize,
    /// Folded rows and the value last added to `other`.
    folded: std::collections::HashMap<guard_common::CounterKey, u64>,
    other: std::collections::BTreeMap<Labels, u64>,
}

impl Fold {
    /// The per-IP series for this scrape, and how many rows are folded.
    fn series(&mut self, snap: &Snapshot, max: usize) -> (Vec<(Labels, u64)>, usize) {
        let present: std::collections::HashSet<_> = snap.rows.iter().map(|r| r.key).collect();
        let passed = guard_common::Verdict::Passed as u8;
        // Reclaimed rows give their label back.
        let before = self.labelled.len();
        self.labelled.retain(|k| present.contains(k));
        if self.labelled.len() != before {
            self.labelled_passed = self.labelled.iter().filter(|k| k.verdict == passed).count();
        }
        self.folded.retain(|k, _| present.contains(k));
        let labels = |r: &Row, ip: Option<String>| -> Labels {
            let l = r.labels();
            vec![
                ("lb_ip", ip.unwrap_or(l.lb_ip)),
                ("family", l.family),
                ("interface", l.interface),
                ("kind", l.kind),
                ("origin", l.origin),
                ("state", l.state),
                ("verdict", l.verdict),
            ]
        };
        let mut out = Vec::new();
        for r in &snap.rows {
            if !self.labelled.contains(&r.key) && !self.folded.contains_key(&r.key) {
                let is_passed = r.key.verdict == passed;
                let room = self.labelled.len() < max
                    && (!is_passed || self.labelled_passed < max - max / 4);
                if room {
                    self.labelled.insert(r.key);
                    self.labelled_passed += usize::from(is_passed);
                } else {
                    self.folded.insert(r.key, 0);
                }
            }
            if self.labelled.contains(&r.key) {
                out.push((labels(r, None), r.value.packets));
            } else if let Some(last) = self.folded.get_mut(&r.key) {
                let grown = r.value.packets.saturating_sub(*last);
                *last = r.value.packets.max(*last);
                *self
                    .other
                    .entry(labels(r, Some("other".into())))
                    .or_default() += grown;
            }
        }
        out.extend(self.other.iter().map(|(l, v)| (l.clone(), *v)));
        (out, self.folded.len())
    }
}

/// Every metric name the daemon exports (dashboards and alerts are checked against it).
#[cfg(any(test, feature = "testing"))]
pub const NAMES: &[&str] = &[
    "arp_guard_arp_frames_total",
    "arp_guard_datapath_frames_total",
    "arp_guard_drop_events_total",
    "arp_guard_lb_ips",
    "arp_guard_lb_ips_not_enforced",
    "arp_guard_feed_unhealthy_seconds",
    "arp_guard_feed_degraded",
    "arp_guard_programs_attached",
    "arp_guard_mode",
    "arp_guard_map_memory_bytes",
    "arp_guard_feed_events_total",
    "arp_guard_map_updates_total",
    "arp_guard_errors_total",
    "arp_guard_metrics_folded_series",
    "arp_guard_feed_stream_healthy",
    "arp_guard_feed_unconfirmed_leases",
    "arp_guard_feed_rebuilds_total",
    "arp_guard_feed_undecodable_objects_total",
    "arp_guard_feed_unreadable_objects",
    "arp_guard_feed_not_admitted_total",
    "arp_guard_memory_bytes",
    "arp_guard_memory_limit_bytes",
    "arp_guard_memory_pressure",
    "arp_guard_responders",
    "arp_guard_responder_conflicts",
    "arp_guard_census_frames_total",
    "arp_guard_census_entries",
];

/// What one scrape is made of.
pub struct Scrape<'a> {
    /// The kernel counters, read now.
    pub snapshot: &'a Snapshot,
    /// Which rows keep their IP label (kept from scrape to scrape).
    pub fold: &'a mut Fold,
    /// `--metrics-max-ip-series`.
    pub max_ip_series: usize,
    pub status: Option<&'a Status>,
    /// With a Kubernetes feed: seconds it has been failing (0: healthy).
    pub feed_unhealthy_seconds: Option<f64>,
    /// The responder census, when it runs.
    pub census: Option<&'a CensusDoc>,
}

/// The Prometheus text of one scrape.
pub fn render(scrape: Scrape<'_>) -> Result<String> {
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
    if let Some(m) = super::memory::latest() {
        memory(&mut v, &m);
    }
    operations(&mut v);
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
fn daemon(v: &mut Values, status: &Status) {
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
        "arp_guard_mode",
        "1 for the mode in force.",
        vec![(vec![("mode", status.mode.clone())], 1.0)],
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

/// The Kubernetes feed's health.
fn cluster(v: &mut Values, feed: &Feed) {
    v.gauges.push((
        "arp_guard_feed_degraded",
        "1 while foreign is degraded to unknown for lack of a fresh feed.",
        vec![(vec![], f64::from(u8::from(feed.degraded)))],
    ));
    v.gauges.push((
        "arp_guard_feed_stream_healthy",
        "1 while a Kubernetes watch stream delivers (0: failing or stuck).",
        feed.streams
            .iter()
            .map(|s| {
                (
                    vec![("stream", s.name.clone())],
                    f64::from(u8::from(s.healthy)),
                )
            })
            .collect(),
    ));
    v.gauges.push((
        "arp_guard_feed_unreadable_objects",
        "Objects whose latest version cannot be decoded, by stream (skipped; their IPs are not trusted).",
        (feed.streams.iter())
            .map(|s| (vec![("stream", s.name.clone())], s.undecodable as f64))
            .collect(),
    ));
    v.gauges.push((
        "arp_guard_feed_unconfirmed_leases",
        "Leases in use past their deadline that the API has not confirmed (their holders keep their claims).",
        vec![(vec![], feed.unconfirmed_leases as f64)],
    ));
}

/// The daemon's memory against its cgroup's limit.
fn memory(v: &mut Values, m: &super::memory::MemoryStatus) {
    v.gauges.push((
        "arp_guard_memory_bytes",
        "What the memory cgroup counts of the daemon: resident memory and BPF maps.",
        vec![
            (vec![("kind", "resident".into())], m.rss_bytes as f64),
            (vec![("kind", "maps".into())], m.maps_bytes as f64),
        ],
    ));
    if let Some(l) = m.limit_bytes {
        v.gauges.push((
            "arp_guard_memory_limit_bytes",
            "The memory limit of the daemon's cgroup.",
            vec![(vec![], l as f64)],
        ));
    }
    let pressure = m.level == super::memory::Level::Pressure;
    v.gauges.push((
        "arp_guard_memory_pressure",
        "1 while memory is so near the limit that no new Kubernetes object is taken in.",
        vec![(vec![], f64::from(u8::from(pressure)))],
    ));
}

/// One counter family by stream, from an operation counter.
fn by_stream(m: &std::sync::Mutex<std::collections::BTreeMap<String, u64>>) -> Vec<(Labels, u64)> {
    (m.lock().unwrap_or_else(|p| p.into_inner()).iter())
        .map(|(k, n)| (vec![("stream", k.clone())], *n))
        .collect()
}

/// What the daemon did: feed events, rebuilds, map updates, errors.
fn operations(v: &mut Values) {
    let ops = &*OPS;
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
        "Kubernetes watch streams rebuilt (relisted), by stream and reason (idle, stuck, api_back).",
        ops.feed_rebuilds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|((s, r), n)| (vec![("stream", s.clone()), ("reason", (*r).to_owned())], *n))
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
            .map(|(k, n)| (vec![("cause", (*k).to_owned())], *n))
            .collect(),
    ));
}

#[cfg(test)]
mod tests {
    use super::{Fold, NAMES};
    use crate::telemetry::counters::{Row, Snapshot};
    use guard_common::{CounterKey, CounterValue};

    fn row(ip: u32, verdict: u8, packets: u64) -> Row {
        Row {
            key: CounterKey {
                ip: guard_common::v4_key(ip),
                ifindex: 0,
                kind: 0,
                origin: 0,
                state: 1,
                verdict,
            },
            value: CounterValue { packets, bytes: 0 },
        }
    }

    fn value(series: &[(super::Labels, u64)], ip: &str) -> Option<u64> {
        series
            .iter()
            .filter(|(l, _)| l[0].1 == ip)
            .map(|(_, v)| *v)
            .reduce(|a, b| a + b)
    }

    /// Labels are given first come and kept; the folded rest only grows,
    /// also when a folded row goes away or a busier row appears.
    #[test]
    fn folding_is_stable_and_monotonic() {
        let mut f = Fold::default();
        let snap = |rows: Vec<Row>| Snapshot {
            rows,
            stats: Default::default(),
        };
        // Two labels at most; rows are "dropped" (verdict 1).
        let (s, folded) = f.series(&snap(vec![row(1, 1, 5), row(2, 1, 5), row(3, 1, 5)]), 2);
        assert_eq!(folded, 1);
        assert_eq!(value(&s, "0.0.0.3"), None, "folded");
        assert_eq!(value(&s, "other"), Some(5));
        // IP 3 gets much busier: it stays folded; "other" grows by its increase.
        let (s, _) = f.series(&snap(vec![row(1, 1, 6), row(2, 1, 6), row(3, 1, 500)]), 2);
        assert_eq!(value(&s, "0.0.0.1"), Some(6));
        assert_eq!(value(&s, "other"), Some(500));
        // IP 3's rows are reclaimed: "other" does not go down.
        let (s, folded) = f.series(&snap(vec![row(1, 1, 7), row(2, 1, 7)]), 2);
        assert_eq!((value(&s, "other"), folded), (Some(500), 0));
        // IP 2's rows are reclaimed: its label goes to the next newcomer.
        let (s, _) = f.series(&snap(vec![row(1, 1, 8), row(4, 1, 1)]), 2);
        assert_eq!(value(&s, "0.0.0.4"), Some(1));
        assert_eq!(value(&s, "0.0.0.2"), None);
        // Passed rows (verdict 0) may not take the last quarter of the labels.
        let mut f = Fold::default();
        let rows: Vec<Row> = (1..=4)
            .map(|i| row(i, 0, 1))
            .chain([row(9, 1, 1)])
            .collect();
        let (s, folded) = f.series(&snap(rows), 4);
        assert_eq!(
            value(&s, "0.0.0.9"),
            Some(1),
            "a stopped frame keeps its label"
        );
        assert_eq!(folded, 1);
        // With 0, nothing is labelled.
        let (s, folded) = Fold::default().series(&snap(vec![row(1, 1, 2), row(2, 0, 3)]), 0);
        assert_eq!((s.len(), folded), (2, 2));
        assert_eq!(value(&s, "other"), Some(5));
    }

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
    fn dashboard_and_alerts_use_only_exported_metrics() {
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
        for e in exprs.iter().chain(&rule_exprs) {
            let names = used(e);
            assert!(!names.is_empty(), "no arp-guard metric in {e}");
            for n in names {
                assert!(
                    NAMES.contains(&n.as_str()),
                    "{n} (in `{e}`) is not exported"
                );
            }
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
