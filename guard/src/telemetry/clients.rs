//! Misdirected and stale clients kept current for the API, the metrics and
//! the log: every read period the census's client totals are read, the
//! table walked when a packet was recorded since the last walk (off the
//! main loop, on a thread of its own), judged against what the daemon
//! published for each LB IP (pure: `model::clients`), and published. A
//! client that becomes stale is logged once and goes to `/events`
//! subscribers; the failover time of each client that followed a move goes
//! into a histogram.
//!
//! Cost: a read with nothing new is one syscall per total. A walk is two
//! syscalls per entry; the pause after a walk is at least [`MAX_DUTY`]
//! times the walk's own time, so that a full table (a flood of forged
//! MACs) cannot make the reader take more than 1/[`MAX_DUTY`] of a core.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    time::{Duration, Instant},
};

use guard_common::{ClientStat, MAX_CLIENTS};
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

use super::clients_metrics::IpSeries;
pub use super::histogram::Histogram;
use super::histogram::FAILOVER_SECONDS;
use crate::{
    datapath::{clients::ClientsReader, sys::monotonic_ns},
    model::clients::{
        assess, kept, totals, Context, Entry, IpState, Kept, Memory, Restore, StaleClient,
    },
};

/// `/clients`: misdirected and stale clients per LB IP, with the per-LB-IP
/// metric series chosen for it beside it (not served: the metrics' own).
pub type ClientsDoc = guard_wire::clients::ClientsDoc<IpSeries>;

/// What the task needs from the daemon: the published state of the LB IPs
/// asked (and of every IP this node has lost), on the census's clock; and,
/// once after a restart, what the previous daemon knew of the clients
/// (with the states of its IPs, read at the same instant).
pub type IpStates =
    Box<dyn Fn(&BTreeSet<IpAddr>) -> (BTreeMap<IpAddr, IpState>, Option<Restore>) + Send + Sync>;

/// Where the task leaves what it knows for the next daemon (its clients,
/// its counts per LB IP).
pub type Keep = Box<dyn Fn(Vec<Kept>, BTreeMap<IpAddr, u64>) + Send + Sync>;

/// How often what the task knows is left for the next daemon.
const KEEP_PERIOD: Duration = Duration::from_secs(2);

pub struct ClientsTask {
    pub reader: ClientsReader,
    /// How often the totals are read (`--clients-read-period`).
    pub period: Duration,
    pub stale_after: Duration,
    /// `--metrics-max-ip-series`.
    pub max_ip_series: usize,
    pub states: IpStates,
    pub publish: Box<dyn Fn(ClientsDoc) + Send + Sync>,
    pub events: broadcast::Sender<String>,
    /// `--refresh-stale-clients`: the healer (None: off).
    pub healer: Option<Box<dyn Heal>>,
    /// The history across restarts (None: none is kept).
    pub keep: Option<Keep>,
}

/// What the reader hands the clients of each read to (the healer of
/// `--refresh-stale-clients`, `senders::refresh`): it sends what it
/// judges allowed and counts why it did or did not.
pub trait Heal: Send {
    /// Consider the clients with packets since `since_ns`, judged by
    /// `ips`' states.
    fn heal(
        &mut self,
        entries: &[Entry],
        ips: &BTreeMap<IpAddr, IpState>,
        since_ns: u64,
        now_ns: u64,
    );
    /// Refreshes by outcome (`sent`, `send_failed`, or why not).
    fn outcomes(&self) -> &BTreeMap<&'static str, u64>;
}

/// After a walk the reader pauses at least this many times the walk's own
/// time: at most 1/50 of a core, whatever the table holds.
pub const MAX_DUTY: u32 = 50;
/// At most this many stale-client lines per read; the rest are summed up.
const LOG_PER_READ: usize = 20;

/// Start the reader on a thread of its own (blocking map syscalls; one
/// long-lived thread keeps what aya caches per thread).
pub fn spawn(task: ClientsTask) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("clients".into())
        .spawn(move || run(task))
        .map(drop)
}

/// What the loop keeps from one read to the next.
struct Loop {
    memory: Memory,
    entries: Vec<Entry>,
    /// The recorded total at the last walk.
    walked_at: Option<u64>,
    failover: Histogram,
    series: IpSeries,
    last: ClientsDoc,
    read_failing: bool,
    /// When the last walk began, and the one before it: packets after the
    /// earlier one are new to the latest walk (one that came while a walk
    /// ran is in the next).
    walk_ns: (u64, u64),
    /// When what it knows was last left for the next daemon.
    kept_at: Option<Instant>,
}

fn run(mut task: ClientsTask) {
    let mut l = Loop {
        memory: Memory::default(),
        entries: Vec::new(),
        walked_at: None,
        failover: Histogram::new(FAILOVER_SECONDS),
        series: IpSeries::default(),
        last: ClientsDoc::empty(task.stale_after),
        read_failing: false,
        walk_ns: (monotonic_ns(), monotonic_ns()),
        kept_at: None,
    };
    let mut pause = task.period;
    loop {
        std::thread::sleep(pause);
        pause = task.period;
        match read(&task, &mut l) {
            Ok((stats, walk)) => {
                l.read_failing = false;
                if let Some(took) = walk {
                    pause = pause.max(took * MAX_DUTY);
                }
                assess_read(&mut task, &mut l, stats);
            }
            Err(e) => {
                if !l.read_failing {
                    tracing::warn!(error = %format!("{e:#}"), "cannot read the census's client table; keeping the last state");
                }
                l.read_failing = true;
                l.last.error = Some(format!("{e:#}"));
            }
        }
        (task.publish)(l.last.clone());
    }
}

/// The kernel's totals by name.
type Totals = Vec<(&'static str, u64)>;

/// The totals, and the table when a packet was recorded since the last
/// walk (with how long the walk took).
fn read(
    task: &ClientsTask,
    l: &mut Loop,
) -> Result<(Totals, Option<Duration>), crate::datapath::DatapathError> {
    let stats = task.reader.stats()?;
    let recorded = stats
        .iter()
        .find(|(k, _)| *k == ClientStat::Recorded.as_str())
        .map_or(0, |(_, v)| *v);
    if l.walked_at == Some(recorded) {
        return Ok((stats, None));
    }
    let t = Instant::now();
    let began = monotonic_ns();
    l.entries = task.reader.entries()?;
    l.walk_ns = (l.walk_ns.1, began);
    l.walked_at = Some(recorded);
    Ok((stats, Some(t.elapsed())))
}

/// Judge the entries read last, fold what happened into the histogram,
/// the series and the log, and make the document.
fn assess_read(task: &mut ClientsTask, l: &mut Loop, stats: Totals) {
    let mut asked: BTreeSet<IpAddr> = l.entries.iter().map(|e| e.ip).collect();
    asked.extend(l.memory.ips());
    let (ips, restore) = (task.states)(&asked);
    if let Some(r) = restore {
        let n = r.clients.len();
        l.memory.restore(r);
        tracing::debug!(
            clients = n,
            carried = l.memory.carried(),
            "misdirected clients taken back from before the restart"
        );
    }
    let cx = Context {
        now_ns: monotonic_ns(),
        stale_after: task.stale_after,
        ips,
        ifnames: (l.entries.iter().map(|e| e.ifindex))
            .collect::<BTreeSet<u32>>()
            .into_iter()
            .map(|i| (i, super::interface_name(i)))
            .collect(),
    };
    let out = assess(&l.entries, &cx, &mut l.memory);
    if let Some(h) = &mut task.healer {
        // Packets since the walk before the latest: each is considered at
        // the read that first sees it, and again at the next (the limiter
        // makes that harmless); with no new walk, none is new.
        h.heal(&l.entries, &cx.ips, l.walk_ns.0, cx.now_ns);
        l.walk_ns.0 = l.walk_ns.1;
    }
    for f in &out.failovers {
        l.failover.observe(*f);
    }
    if !out.failovers.is_empty() {
        tracing::debug!(target: "arp_guard::clients", failover_s = ?out.failovers, "clients followed a move");
    }
    for n in out.newly_misdirected.iter().take(LOG_PER_READ) {
        tracing::debug!(
            target: "arp_guard::clients",
            lb_ip = %n.lb_ip, cause = n.cause.as_str(), mac = %crate::model::fmt_mac(&n.mac),
            client_ip = %n.client_ip, "misdirected client"
        );
    }
    report_stale(&out.newly_stale, &task.events);
    if let Some(keep) = &task.keep {
        // What was reported is left at once: a restart must not report it again.
        let reported = !out.newly_stale.is_empty() || !out.failovers.is_empty();
        if reported || l.kept_at.is_none_or(|t| t.elapsed() >= KEEP_PERIOD) {
            l.kept_at = Some(Instant::now());
            let mut clients = kept(&l.entries, &l.memory);
            // The next daemon gets the most recent only (a flood is larger).
            let max = crate::model::history::MAX_CLIENTS;
            if clients.len() > max {
                clients.select_nth_unstable_by_key(max, |c| std::cmp::Reverse(c.entry.last_ns));
                clients.truncate(max);
            }
            keep(clients, totals(&l.memory).clone());
        }
    }
    l.series.update(&out.clients, task.max_ip_series);
    l.last = ClientsDoc {
        stale_after_seconds: task.stale_after.as_secs_f64(),
        // A walk under churn (a flood evicting as it goes) meets more keys
        // than the table holds at once.
        entries: l.entries.len().min(MAX_CLIENTS as usize),
        capacity: MAX_CLIENTS,
        totals: stats.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
        error: None,
        stale: out.clients.values().map(|c| c.stale).sum(),
        failover: l.failover.clone(),
        refreshes: task.healer.as_ref().map(|h| {
            (h.outcomes().iter())
                .map(|(k, v)| ((*k).to_owned(), *v))
                .collect()
        }),
        ips: out.clients,
        series: l.series.clone(),
    };
}

/// A stale-client event, as an `/events` line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StaleEvent {
    pub time: String,
    /// `stale_client`.
    pub event: String,
    #[serde(flatten)]
    pub client: StaleClient,
}

/// A log line and an event for each client that became stale.
fn report_stale(stale: &[StaleClient], events: &broadcast::Sender<String>) {
    for (i, c) in stale.iter().enumerate() {
        let e = StaleEvent {
            time: super::events::unix_time_millis(),
            event: "stale_client".into(),
            client: c.clone(),
        };
        if let Ok(line) = serde_json::to_string(&e) {
            // No subscriber is fine.
            let _ = events.send(line);
        }
        if i < LOG_PER_READ {
            tracing::warn!(
                target: "arp_guard::clients",
                lb_ip = %c.lb_ip, cause = c.cause.as_str(), mac = %c.mac, client_ip = %c.client_ip,
                misdirected_s = c.misdirected_s, packets = c.packets,
                "stale client: {}",
                match c.cause {
                    crate::model::clients::Cause::AfterMove => "still sending here after this node lost the LB IP (its neighbour cache holds this node's MAC)",
                    crate::model::clients::Cause::NotOwnedHere => "sending here for an LB IP this node does not own (its neighbour cache holds this node's MAC)",
                }
            );
        }
    }
    if stale.len() > LOG_PER_READ {
        tracing::warn!(target: "arp_guard::clients", more = stale.len() - LOG_PER_READ, "more clients became stale in this read (see arp-guard clients)");
    }
}
