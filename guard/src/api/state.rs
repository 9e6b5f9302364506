//! What the API serves from: the state the daemon's main loop publishes, the
//! kernel counter maps (on fds of the API's own), and the event channel.

use std::{
    collections::BTreeMap,
    net::IpAddr,
    sync::{atomic::AtomicU64, Arc, Mutex, RwLock},
    time::{Duration, Instant, SystemTime},
};

use anyhow::{Context as _, Result};
use guard_common::{LeakAction, Mode};
use tokio::sync::broadcast;

use super::types::IpEntry;
use crate::{
    model::{takeover::TakeoverRecord, view::View},
    ops::Ops,
    telemetry::{
        census::CensusDoc, clients::ClientsDoc, counters::Snapshot, metrics::Fold,
        status::DaemonStatus, takeover::TakeoverStats,
    },
};

/// What the main loop publishes for the API.
#[derive(Debug, Clone, Default)]
pub struct ApiState {
    pub status: Option<DaemonStatus>,
    /// The memory watch's last sample (the one place it is kept: the
    /// status carries a copy, refreshed by both writers).
    pub memory: Option<crate::telemetry::memory::MemoryStatus>,
    /// Reasons the daemon is not ready (empty: ready).
    pub not_ready: Vec<String>,
    pub ips: BTreeMap<IpAddr, IpEntry>,
    pub mode: Option<Mode>,
    pub leak_action: Option<LeakAction>,
    /// Uplink (an interface the guard is attached to) -> has a primary IPv4
    /// to rewrite leaks to.
    pub uplinks: BTreeMap<String, bool>,
    /// The Kubernetes feed: failing since (None: healthy or not used).
    pub feed_failing_since: Option<Instant>,
    pub feed_enabled: bool,
    /// The responder census (None: off or not read yet).
    pub census: Option<CensusDoc>,
    /// Held announcements and takeover timing (None: not started yet).
    pub takeover: Option<TakeoverStats>,
    /// The last takeover of each LB IP by this node.
    pub takeovers: BTreeMap<IpAddr, TakeoverRecord>,
    /// When this node last lost each LB IP (it stopped being `owned` here;
    /// CLOCK_MONOTONIC ns, as the census's timestamps), while the IP is not
    /// owned here again: the moment of the move misdirected clients are
    /// measured from. One entry per LB IP at most.
    pub lost: BTreeMap<IpAddr, u64>,
    /// Misdirected and stale clients (None: the census is off or not read yet).
    pub clients: Option<ClientsDoc>,
    /// The census's claims of LB IPs foreign here, kept from before a
    /// restart (the census's table starts empty): who announced an IP since
    /// the move, for `--refresh-stale-clients`. Each goes once its IP is no
    /// longer foreign here.
    pub claims_kept: BTreeMap<IpAddr, Vec<crate::model::census::CensusEntry>>,
    /// Every guard's presence record, and the cluster's nodes (None: off).
    pub presence: Option<crate::model::presence::Seen>,
    /// The active census, while it runs.
    pub probes: Option<crate::telemetry::probing::ProbesDoc>,
    /// When this node's kernel last answered ARP, unstopped, for an LB IP
    /// another node owns that is held on another interface (arp_ignore=0;
    /// CLOCK_MONOTONIC ns): `model::kube_events::kernel`.
    pub kernel_answered_ns: Option<u64>,
}

/// Everything the API serves from, shared with the main loop.
pub struct Shared {
    pub state: RwLock<ApiState>,
    /// When the main loop last wrote a heartbeat (CLOCK_MONOTONIC ns).
    pub heartbeat_ns: AtomicU64,
    /// Our own COUNTERS and STATS maps, on fds of their own for this thread.
    pub maps: Option<(aya::maps::Map, aya::maps::Map)>,
    /// Drop events, one line of JSON each, for `/events` subscribers.
    pub events: broadcast::Sender<String>,
    /// `--metrics-max-ip-series`.
    pub metrics_max_ip_series: usize,
    /// Which counter rows /metrics labels with their IP.
    pub fold: Mutex<Fold>,
    /// The daemon's operation counters (the same the feed counts in).
    pub ops: Arc<Ops>,
    /// Notified when `/cluster` wants the cluster's Nodes (presence reads
    /// them only when asked, or on the one guard that keeps coverage).
    pub nodes_wanted: Arc<tokio::sync::Notify>,
    /// Misdirected clients between their reader and the history kept
    /// across restarts (`daemon/history.rs`).
    pub clients_history: Mutex<ClientsHandoff>,
}

/// What the clients' reader and the history hand each other.
#[derive(Debug, Default)]
pub struct ClientsHandoff {
    /// What the previous daemon knew, for the reader to take back once the
    /// view has settled (put here under the state's write lock, with the
    /// losses it was counted from; taken under its read lock).
    pub restore: Option<crate::model::clients::Restore>,
    /// What the reader knows, refreshed every few seconds, for the next
    /// daemon: its clients and its counts per LB IP.
    pub kept: Option<(Vec<crate::model::clients::Kept>, BTreeMap<IpAddr, u64>)>,
}

impl Shared {
    /// The handoff, however a holder of its lock ended.
    pub fn clients_history(&self) -> std::sync::MutexGuard<'_, ClientsHandoff> {
        self.clients_history
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }
}

impl Shared {
    pub fn new(
        maps: Option<(aya::maps::Map, aya::maps::Map)>,
        metrics_max_ip_series: usize,
        ops: Arc<Ops>,
    ) -> Self {
        Shared {
            state: Default::default(),
            heartbeat_ns: AtomicU64::new(crate::datapath::sys::monotonic_ns()),
            maps,
            events: broadcast::channel(1024).0,
            metrics_max_ip_series,
            fold: Default::default(),
            ops,
            nodes_wanted: Default::default(),
            clients_history: Default::default(),
        }
    }

    pub fn snapshot(&self) -> Result<Snapshot> {
        let (counters, stats) = self.maps.as_ref().context("kernel maps not available")?;
        Snapshot::read(|name| {
            Ok(if name == guard_common::MAP_COUNTERS {
                counters
            } else {
                stats
            })
        })
    }

    /// A cheap read of the STATS map: can the metrics path see the kernel?
    pub fn stats_readable(&self) -> Result<()> {
        let (_, stats) = self.maps.as_ref().context("kernel maps not available")?;
        let stats: aya::maps::PerCpuArray<&aya::maps::MapData, u64> =
            aya::maps::PerCpuArray::try_from(stats)?;
        stats.get(&0, 0).context("reading STATS")?;
        Ok(())
    }

    /// Age of the main loop's last heartbeat (None: none yet).
    pub fn heartbeat_age(&self) -> Option<Duration> {
        let hb = self.heartbeat_ns.load(std::sync::atomic::Ordering::Relaxed);
        (hb != 0)
            .then(|| Duration::from_nanos(crate::datapath::sys::monotonic_ns().saturating_sub(hb)))
    }

    /// The main loop is alive: it wrote a heartbeat.
    pub fn beat(&self) {
        self.heartbeat_ns.store(
            crate::datapath::sys::monotonic_ns(),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    pub fn read(&self) -> std::sync::RwLockReadGuard<'_, ApiState> {
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }

    pub fn write(&self) -> std::sync::RwLockWriteGuard<'_, ApiState> {
        self.state.write().unwrap_or_else(|p| p.into_inner())
    }
}

/// The per-IP table for the API, keeping `since` for IPs whose state and
/// source did not change.
pub fn ip_entries(
    old: &BTreeMap<IpAddr, IpEntry>,
    view: &View,
    ifnames: &BTreeMap<u32, String>,
) -> BTreeMap<IpAddr, IpEntry> {
    let now = unix_now();
    let mut on: BTreeMap<IpAddr, Vec<String>> = BTreeMap::new();
    for (i, a) in &view.if_addrs {
        if let Some(name) = ifnames.get(i) {
            on.entry(IpAddr::V4(*a)).or_default().push(name.clone());
        }
    }
    view.lb
        .iter()
        .map(|(ip, l)| {
            let source = l.source.to_string();
            let since_unix = match old.get(ip) {
                Some(o) if o.state == l.state && o.source == source => o.since_unix,
                _ => now,
            };
            (
                *ip,
                IpEntry {
                    state: l.state,
                    source,
                    since_unix,
                    on_interfaces: on.get(ip).cloned().unwrap_or_default(),
                    service: service_of(l),
                    owner: l.source.owner().map(str::to_owned),
                    split: split_of(l),
                },
            )
        })
        .collect()
}

/// The split election of an LB IP's Services, from the cluster feed only.
fn split_of(l: &crate::model::view::LbIp) -> Option<guard_wire::api::SplitElection> {
    match &l.source {
        crate::model::view::Provenance::Cluster { split, .. } => split.as_deref().cloned(),
        _ => None,
    }
}

/// The Service of an LB IP (namespace/name), from the cluster feed only.
fn service_of(l: &crate::model::view::LbIp) -> Option<String> {
    match &l.source {
        crate::model::view::Provenance::Cluster { service, .. } => {
            service.as_ref().map(ToString::to_string)
        }
        _ => None,
    }
}

/// [`ip_entries`] for the LB IPs `keys` only (the others did not change).
pub fn update_ip_entries(
    entries: &mut BTreeMap<IpAddr, IpEntry>,
    view: &View,
    keys: &std::collections::BTreeSet<IpAddr>,
    ifnames: &BTreeMap<u32, String>,
) {
    let now = unix_now();
    for ip in keys {
        let Some(l) = view.lb.get(ip) else {
            entries.remove(ip);
            continue;
        };
        let source = l.source.to_string();
        let since_unix = match entries.get(ip) {
            Some(o) if o.state == l.state && o.source == source => o.since_unix,
            _ => now,
        };
        let on_interfaces = (view.if_addrs.iter())
            .filter(|(_, a)| IpAddr::V4(*a) == *ip)
            .filter_map(|(i, _)| ifnames.get(i).cloned())
            .collect();
        let e = IpEntry {
            state: l.state,
            source,
            since_unix,
            on_interfaces,
            service: service_of(l),
            owner: l.source.owner().map(str::to_owned),
            split: split_of(l),
        };
        entries.insert(*ip, e);
    }
}

/// Note the moments this node loses LB IPs: for each IP of `keys` whose
/// state goes from `owned` (as `old` published it) to anything else in
/// `view`, now; an IP owned again, or gone from the view, loses its moment.
pub fn note_losses<'a>(
    lost: &mut BTreeMap<IpAddr, u64>,
    old: &BTreeMap<IpAddr, IpEntry>,
    view: &View,
    keys: impl Iterator<Item = &'a IpAddr>,
    now_ns: u64,
) {
    use guard_common::Ownership::Owned;
    for ip in keys {
        match view.lb.get(ip).map(|l| l.state) {
            None | Some(Owned) => {
                lost.remove(ip);
            }
            Some(_) if old.get(ip).is_some_and(|e| e.state == Owned) => {
                lost.insert(*ip, now_ns);
            }
            Some(_) => {}
        }
    }
}

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::view::{LbIp, Provenance};
    use guard_common::Ownership::{self, *};

    fn view(state: Option<Ownership>) -> View {
        let mut v = View::default();
        if let Some(state) = state {
            let source = Provenance::Interface("test".into());
            v.lb.insert(IP, LbIp { state, source });
        }
        v
    }

    const IP: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(198, 51, 100, 7));

    /// The moment of a move is kept from owned to anything else, through
    /// unknown to foreign (a graceful hand-over), and goes once the IP is
    /// owned again or gone.
    #[test]
    fn a_move_is_dated_when_this_node_stops_owning_the_ip() {
        let mut lost = BTreeMap::new();
        let mut entries = ip_entries(&BTreeMap::new(), &view(Some(Owned)), &BTreeMap::new());
        let step =
            |lost: &mut BTreeMap<IpAddr, u64>, entries: &mut BTreeMap<IpAddr, IpEntry>, s, now| {
                let v = view(s);
                note_losses(lost, entries, &v, [IP].iter(), now);
                *entries = ip_entries(entries, &v, &BTreeMap::new());
            };
        step(&mut lost, &mut entries, Some(Owned), 5);
        assert!(lost.is_empty(), "owned: no move");
        step(&mut lost, &mut entries, Some(Unknown), 10);
        assert_eq!(lost.get(&IP), Some(&10));
        step(&mut lost, &mut entries, Some(Foreign), 20);
        assert_eq!(
            lost.get(&IP),
            Some(&10),
            "the move began when it left owned"
        );
        step(&mut lost, &mut entries, Some(Owned), 30);
        assert!(lost.is_empty());
        step(&mut lost, &mut entries, Some(Foreign), 40);
        assert_eq!(lost.get(&IP), Some(&40));
        step(&mut lost, &mut entries, None, 50);
        assert!(lost.is_empty(), "gone from the LB set");
        // Foreign from the start: never owned here, no move.
        step(&mut lost, &mut entries, Some(Foreign), 60);
        assert!(lost.is_empty());
    }
}
