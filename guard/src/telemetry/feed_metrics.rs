//! The metrics of the Kubernetes feed and of the daemon's memory (parts of
//! the scrape `metrics::render` assembles).

use super::{
    family::{Labels, Values},
    status::FeedHealth,
};

/// The Kubernetes feed's health.
pub(super) fn cluster(v: &mut Values, feed: &FeedHealth) {
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
        "arp_guard_node_name_unmatched",
        "1 while the synced feed names Lease holders or announcing nodes, this node's name (--node-name, NODE_NAME) is none of them and (where presence runs) one of them has no guard by that name: the announcer calls this node otherwise (without presence, a node that holds nothing looks the same). ArpGuardDroppingOwnedIP pairs it with this node's own announcer announcing IPs held by others.",
        vec![(vec![], f64::from(u8::from(feed.node_unmatched)))],
    ));
    v.gauges.push((
        "arp_guard_feed_unconfirmed_leases",
        "Leases in use past their deadline that the API has not confirmed (their holders keep their claims).",
        vec![(vec![], feed.unconfirmed_leases as f64)],
    ));
}

/// The daemon's memory against its cgroup's limit.
pub(super) fn memory(v: &mut Values, m: &crate::telemetry::memory::MemoryStatus) {
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
    let pressure = m.level == crate::telemetry::memory::Level::Pressure;
    v.gauges.push((
        "arp_guard_memory_pressure",
        "1 while memory is so near the limit that no new Kubernetes object is taken in.",
        vec![(vec![], f64::from(u8::from(pressure)))],
    ));
}

/// One counter family by stream, from an operation counter.
pub(super) fn by_stream(
    m: &std::sync::Mutex<std::collections::BTreeMap<String, u64>>,
) -> Vec<(Labels, u64)> {
    (m.lock().unwrap_or_else(|p| p.into_inner()).iter())
        .map(|(k, n)| (vec![("stream", k.clone())], *n))
        .collect()
}

/// Kubernetes Events by reason and outcome. Every reason and outcome is
/// there from the start, at 0: a series born at 1 would hide its first
/// Event from `increase()` (the dashboard's Events published, the alert on
/// Events that fail).
pub(super) fn kube_events(
    m: &std::sync::Mutex<std::collections::BTreeMap<(String, crate::ops::EventOutcome), u64>>,
) -> super::family::Family<u64> {
    use crate::{model::kube_events::Reason, ops::EventOutcome};
    let mut all: std::collections::BTreeMap<(String, EventOutcome), u64> = (Reason::ALL.iter())
        .flat_map(|r| {
            [
                EventOutcome::Published,
                EventOutcome::Failed,
                EventOutcome::Timeout,
                EventOutcome::Dropped,
            ]
            .map(|o| ((r.as_str().to_owned(), o), 0))
        })
        .collect();
    all.extend(
        m.lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(k, n)| (k.clone(), *n)),
    );
    (
        "arp_guard_kube_events",
        "Kubernetes Events on Services, by reason and outcome (published, failed, timeout, dropped).",
        (all.iter())
            .map(|((r, o), n)| (vec![("reason", r.clone()), ("outcome", o.as_str().to_owned())], *n))
            .collect(),
    )
}

/// Presence: the cluster's nodes by state of their guard's record.
pub(super) fn presence(v: &mut Values, by_state: Vec<(&'static str, f64)>) {
    v.gauges.push((
        "arp_guard_presence_nodes",
        "Nodes by their guard's presence record: live, not_ready (a record whose guard Pod is not Ready: gone or failing), uncovered (a Node without a live guard; exported by the guard that read the Nodes in the last 15 minutes).",
        (by_state.into_iter())
            .map(|(state, n)| (vec![("state", state.to_owned())], n))
            .collect(),
    ));
}
