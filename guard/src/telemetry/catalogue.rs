//! Every metric family the daemon can export, with its type, help and
//! labels: read off one scrape rendered with every part present (a sample
//! of each document), so that the list is the exporter's own and cannot
//! drift from it. The reference (`docs/reference/metrics.md`), the
//! dashboard and the alerts are checked against it.

use std::collections::{BTreeMap, BTreeSet};

use guard_common::{CounterKey, CounterValue, Kind, Origin, Ownership, Verdict};

use crate::ops::Ops;

use super::{
    census::CensusDoc,
    clients::ClientsDoc,
    counters::{Row, Snapshot},
    fold::Fold,
    memory::MemoryStatus,
    metrics::{render, Scrape},
    probing::ProbesDoc,
    status::DaemonStatus,
    takeover::{TakeoverStats, OUTCOMES},
};

/// One metric family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Family {
    pub name: String,
    /// counter, gauge or histogram.
    pub kind: String,
    pub help: String,
    /// Its labels, as the sample scrape shows them.
    pub labels: BTreeSet<String>,
}

/// Every family, by name.
pub fn families() -> Vec<Family> {
    let text = sample_scrape();
    let mut out: BTreeMap<String, Family> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            out.entry(name.to_owned()).or_insert_with(|| Family {
                name: name.to_owned(),
                kind: String::new(),
                help: help.to_owned(),
                labels: BTreeSet::new(),
            });
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            if let Some(f) = out.get_mut(name) {
                f.kind = kind.to_owned();
            }
        } else if !line.starts_with('#') {
            sample_labels(line, &mut out);
        }
    }
    out.into_values().collect()
}

/// A sample line's labels, credited to its family (a histogram's series
/// are NAME_bucket, NAME_sum, NAME_count; `le` is the bucket's own).
fn sample_labels(line: &str, out: &mut BTreeMap<String, Family>) {
    let series = line.split(' ').next().unwrap_or("");
    let (name, labels) = series.split_once('{').unwrap_or((series, ""));
    let family = ["_bucket", "_sum", "_count", "_total"]
        .iter()
        .filter_map(|s| name.strip_suffix(s))
        .chain(std::iter::once(name))
        .find(|n| out.contains_key(*n));
    let Some(f) = family.and_then(|n| out.get_mut(n)) else {
        return;
    };
    for kv in labels.trim_end_matches('}').split(',') {
        if let Some((k, _)) = kv.split_once('=') {
            if k != "le" && !k.is_empty() {
                f.labels.insert(k.to_owned());
            }
        }
    }
}

/// One scrape with every part present.
fn sample_scrape() -> String {
    let snapshot = Snapshot {
        rows: vec![Row {
            key: CounterKey {
                ip: guard_common::key_of_ip(std::net::Ipv4Addr::new(198, 51, 100, 100).into()),
                ifindex: 1,
                kind: Kind::Reply as u8,
                origin: Origin::Kernel as u8,
                state: Ownership::Foreign as u8,
                verdict: Verdict::Dropped as u8,
            },
            value: CounterValue {
                packets: 1,
                bytes: 42,
            },
        }],
        stats: [("frames", 1), ("events_delivered", 1)]
            .into_iter()
            .collect(),
    };
    let status: DaemonStatus = sample(STATUS);
    let census: CensusDoc = sample(CENSUS);
    let mut clients: ClientsDoc = sample(CLIENTS);
    // The per-LB-IP series are chosen as the clients task chooses them
    // (not part of the document): without them the families show no labels.
    clients.series.update(&clients.ips, 16);
    let probes: ProbesDoc = sample(PROBES);
    let mut takeover = TakeoverStats::default();
    for o in OUTCOMES {
        takeover.count(o, 1);
    }
    let memory = MemoryStatus {
        limit_bytes: Some(256 << 20),
        ..MemoryStatus::default()
    };
    let mut fold = Fold::default();
    let ops = Ops::default();
    ops.error(crate::ops::ErrorCause::ApiAccept);
    ops.feed_event("leases");
    ops.feed_rebuild("leases", crate::ops::Rebuild::Stuck);
    ops.feed_undecodable("leases");
    ops.feed_not_admitted("leases");
    ops.kube_event("SilentTakeover", crate::ops::EventOutcome::Published);

    let scrape = Scrape {
        snapshot: &snapshot,
        fold: &mut fold,
        max_ip_series: 16,
        status: Some(&status),
        feed_unhealthy_seconds: Some(0.0),
        census: Some(&census),
        takeover: Some(&takeover),
        clients: Some(&clients),
        presence_nodes: Some(vec![("live", 1.0)]),
        probes: Some(&probes),
        memory: Some(&memory),
        ops: &ops,
    };
    render(scrape).unwrap_or_default()
}

fn sample<T: serde::de::DeserializeOwned>(json: &str) -> T {
    // The samples are this file's own constants: a failure here is a bug
    // that the catalogue's unit test shows at once.
    #[allow(clippy::expect_used)]
    serde_json::from_str(json).expect("a sample document")
}

const STATUS: &str = r#"{"node": "node-a", "mode": "enforce",
  "interfaces": [{"name": "eth0", "state": "attached", "detail": "tcx", "census": "tcx", "carrier": true}],
  "lb_ips": {"total": 1, "owned": 0, "foreign": 1, "unknown": 0},
  "not_enforced": 0, "map_memory_bytes": 1,
  "feed": {"announcers": ["cilium"], "synced": true, "degraded": false, "blind": false,
    "unconfirmed_leases": 0, "threshold_seconds": 15,
    "streams": [{"name": "leases", "synced": true, "healthy": true, "undecodable": 1}]}}"#;

const CENSUS: &str = r#"{"window_seconds": 60, "entries": 1, "capacity": 4096,
  "totals": {"arp": 1, "ndp": 0, "claims": 1, "insert_failed": 0},
  "ips": {"198.51.100.100": {"active": 2, "conflict": "contested", "owner": "node-b",
    "responders": [{"mac": "02:00:5e:00:53:01", "claims": 1, "first_seen_ago_s": 1, "last_seen_ago_s": 1,
      "active": true, "local": false, "kinds": ["reply"], "interface": "eth0"}]}}}"#;

const CLIENTS: &str = r#"{"stale_after_seconds": 30, "entries": 1, "capacity": 4096,
  "totals": {"recorded": 1, "new_client": 1, "insert_failed": 0, "other_host": 0},
  "stale": 1, "failover": {"bounds": [1.0], "counts": [1, 0], "sum": 1.0, "count": 1},
  "refreshes": {"sent": 1},
  "ips": {"198.51.100.100": {"state": "foreign", "cause": "after_move", "moved_ago_s": 40, "packets_total": 3,
    "sending": 1, "stale": 1, "clients": []}}}"#;

const PROBES: &str = r#"{"interval_seconds": 30, "askers_per_ip": 2, "node_max_per_second": 10,
  "cluster_max_per_second": 100, "silent_after": 3, "live_guards": 2,
  "sent": {"arp": 1}, "send_errors": 0, "verdicts": {"answered": 1}, "ips": {}}"#;

#[cfg(test)]
mod tests {
    use super::*;

    /// The samples parse, every family has a type and a help, and the
    /// families that carry labels show them.
    #[test]
    fn every_family_has_a_type_a_help_and_its_labels() {
        let f = families();
        assert!(f.len() >= 40, "{}", f.len());
        for fam in &f {
            assert!(
                matches!(fam.kind.as_str(), "counter" | "gauge" | "histogram"),
                "{fam:?}"
            );
            assert!(!fam.help.is_empty(), "{fam:?}");
        }
        let by: BTreeMap<&str, &Family> = f.iter().map(|x| (x.name.as_str(), x)).collect();
        let labels = |n: &str| by[n].labels.iter().cloned().collect::<Vec<_>>();
        assert!(labels("arp_guard_arp_frames_total").contains(&"verdict".to_owned()));
        assert!(labels("arp_guard_announce_total").contains(&"outcome".to_owned()));
        assert!(by.contains_key("arp_guard_memory_limit_bytes"));
        for name in [
            "arp_guard_misdirected_packets_total",
            "arp_guard_misdirected_clients",
        ] {
            assert_eq!(labels(name), ["family", "lb_ip"], "{name}");
        }
    }
}
