//! What the guard knew of recent moves, kept across restarts: the losses
//! of LB IPs (`ApiState::lost`, with their state, source and since), the
//! takeover records (a takeover still waiting for its first announcement
//! waits on), the misdirected clients and their counts since the move. The
//! content and its rules are `model::history`'s, the store
//! `datapath::history`'s (a pinned map under `--pin-dir`; without one
//! nothing is kept).
//!
//! The census's claims of those IPs are kept too (its table starts empty
//! after a restart): who announced an IP since the move stays known to
//! `--refresh-stale-clients` while the IP is foreign here.
//!
//! Read once at start (a history that cannot be taken is logged once,
//! naming the pin and why, and the daemon starts without it); taken back
//! once the view has settled (the Kubernetes feed's first sync, or at once
//! without a feed), for the LB IPs still in it: a loss only while the IP is
//! not owned here, a takeover only when this daemon has none of its own, a
//! state's `since` only when state and source are the same. Written after
//! that when its content changed, at most every [`SAVE_PERIOD`], again
//! after [`REWRITE_AFTER`] without a change (so that a history left behind
//! by a daemon that keeps none, a downgrade, is recognised by its age
//! against the pinned heartbeat), and at SIGTERM; a write that fails is
//! logged (once until one succeeds) and the last one written stays.

use std::{
    collections::BTreeMap,
    net::IpAddr,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use guard_common::Ownership;

use super::Daemon;
use crate::{
    api::{state::ApiState, Shared},
    datapath::{history as store, monotonic_ns},
    model::{
        census::CensusEntry,
        clients::{IpState, Restore},
        history::{self, Clock, History, IpKnown, Known, MAX_STORED, REWRITE_AFTER},
    },
    telemetry::clients::IpStates,
};

/// The history is written at most this often (and at SIGTERM).
pub(super) const SAVE_PERIOD: Duration = Duration::from_secs(5);

pub(super) struct HistoryState {
    /// Where it is kept (None: no `--pin-dir`, nothing is kept).
    dir: Option<PathBuf>,
    /// This daemon's clock pair, fixed for its life (what it writes does
    /// not change unless what it knows does).
    clock: Clock,
    /// What was read at start, until the view settles.
    pending: Option<Known>,
    /// Taken back (or nothing to take): from now on it is written.
    settled: bool,
    /// What was written last (without its time).
    last: Option<History>,
    /// When it was last looked at, and last written.
    saved_at: Option<Instant>,
    written_at: Option<Instant>,
    failing: bool,
}

/// This boot, as the kernel names it (empty if it cannot be read).
fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().chars().take(64).collect())
        .unwrap_or_default()
}

fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

impl HistoryState {
    /// Read what the previous daemon left under `dir` (once), before this
    /// daemon's first heartbeat (`last_alive`: the previous daemon's last,
    /// in the pinned maps).
    pub(super) fn load(dir: Option<&Path>, node: &str, last_alive: Option<u64>) -> Self {
        let clock = Clock {
            boot: boot_id(),
            mono_ns: monotonic_ns(),
            unix_ns: unix_ns(),
        };
        let pending = dir.and_then(|dir| read(dir, node, &clock, last_alive));
        HistoryState {
            dir: dir.map(Path::to_owned),
            clock,
            pending,
            settled: false,
            last: None,
            saved_at: None,
            written_at: None,
            failing: false,
        }
    }
}

/// The history under `dir`, or None, said in one line either way.
fn read(dir: &Path, node: &str, clock: &Clock, last_alive: Option<u64>) -> Option<Known> {
    let path = store::history_path(dir);
    let t = Instant::now();
    let bytes = match store::read(dir, MAX_STORED) {
        Ok(Some(b)) => b,
        Ok(None) => {
            tracing::info!(history = %path.display(), "no history of recent moves to take back (a first start, or the pins were removed)");
            return None;
        }
        Err(e) => {
            tracing::warn!(history = %path.display(), error = %format!("{:#}", anyhow::Error::from(e)), "history of recent moves ignored: it cannot be read; starting without it");
            return None;
        }
    };
    match history::decode(&bytes, node, clock, last_alive) {
        Ok((known, dropped)) => {
            let count = |f: fn(&IpKnown) -> bool| known.ips.values().filter(|k| f(k)).count();
            tracing::info!(
                history = %path.display(), bytes = bytes.len(),
                losses = count(|k| k.lost_ns.is_some()),
                takeovers = count(|k| k.takeover.is_some()),
                clients = known.clients.len(), dropped_as_old = dropped,
                read_us = t.elapsed().as_micros() as u64,
                "history of recent moves read: taken back once the view has settled"
            );
            Some(known)
        }
        Err(why) => {
            tracing::warn!(history = %path.display(), reason = %why, "history of recent moves ignored; starting without it");
            None
        }
    }
}

impl Daemon {
    /// Take the history back once the view has settled (`settled`: the
    /// feed has synced, or there is none), into the state the main loop
    /// is publishing (`st`) and the takeovers; the clients go to their
    /// reader through `st`'s handoff.
    pub(super) fn take_back_history(&mut self, st: &mut ApiState, settled: bool) {
        if self.history.settled || !settled {
            return;
        }
        self.history.settled = true;
        let Some(known) = self.history.pending.take() else {
            return;
        };
        let now_ns = monotonic_ns();
        let mut moves = BTreeMap::new();
        for (ip, k) in &known.ips {
            let Some(now) = self.view.lb.get(ip).map(|l| l.state) else {
                continue;
            };
            if let Some(e) = st.ips.get_mut(ip) {
                if e.state == k.state && e.source == k.source {
                    e.since_unix = k.since_unix;
                }
            }
            // Owned then, not now: lost while no daemon watched.
            let lost = match k.lost_ns {
                Some(t) => Some(t),
                None if k.state == Ownership::Owned => Some(now_ns),
                None => None,
            };
            if let (Some(t), false) = (lost, now == Ownership::Owned) {
                moves.insert(*ip, *st.lost.entry(*ip).or_insert(t));
            }
            if now == Ownership::Foreign && !k.claims.is_empty() {
                st.claims_kept.insert(*ip, k.claims.clone());
            }
            if let Some(mut t) = k.takeover.clone() {
                if now != Ownership::Owned {
                    t.pending = None;
                }
                self.takeover.timing.restore(*ip, t);
                self.takeover.changed = true;
            }
        }
        if self.dp.census_loaded() {
            let in_view = |ip: &IpAddr| self.view.lb.contains_key(ip);
            self.shared.clients_history().restore = Some(Restore {
                clients: (known.clients.into_iter())
                    .filter(|c| in_view(&c.entry.ip))
                    .collect(),
                totals: (known.ips.iter())
                    .filter(|(ip, k)| k.packets > 0 && in_view(ip))
                    .map(|(ip, k)| (*ip, k.packets))
                    .collect(),
                moves,
                run_gap: self.cfg.datapath.census_window,
            });
        }
    }

    /// Write the history if it changed, or has not been written for
    /// [`REWRITE_AFTER`] (`force`: whenever it was last looked at: at
    /// SIGTERM).
    pub(super) fn save_history(&mut self, force: bool) {
        let h = &self.history;
        let Some(dir) = h.dir.clone() else { return };
        if !h.settled || (!force && h.saved_at.is_some_and(|t| t.elapsed() < SAVE_PERIOD)) {
            return;
        }
        self.history.saved_at = Some(Instant::now());
        let known = self.known();
        let mut next = history::history(&known, &self.node, &self.history.clock, 0);
        let recent = (self.history.written_at).is_some_and(|t| t.elapsed() < REWRITE_AFTER);
        if self.history.last.as_ref() == Some(&next) && recent {
            return;
        }
        let t = Instant::now();
        let unchanged = next.clone();
        next.saved_at = unix_ns();
        let bytes = history::encode(&next);
        match store::write(&dir, &bytes) {
            Ok(()) => {
                if self.history.failing {
                    tracing::info!("history of recent moves written again");
                }
                self.history.failing = false;
                self.history.last = Some(unchanged);
                self.history.written_at = Some(Instant::now());
                tracing::debug!(
                    bytes = bytes.len(),
                    took_us = t.elapsed().as_micros() as u64,
                    "history of recent moves written"
                );
            }
            Err(e) => {
                if !self.history.failing {
                    tracing::warn!(history = %store::history_path(&dir).display(), error = %format!("{:#}", anyhow::Error::from(e)), "cannot write the history of recent moves (the last one written stays; said once until a write succeeds)");
                }
                self.history.failing = true;
            }
        }
    }

    /// What this daemon knows now, for the history.
    fn known(&self) -> Known {
        let st = self.shared.read();
        let takeovers = self.takeover.timing.kept();
        let (clients, totals) = {
            let handoff = self.shared.clients_history();
            match &handoff.restore {
                // Not taken back by the reader yet: what was read is still
                // what is known.
                Some(r) => (r.clients.clone(), r.totals.clone()),
                None => handoff.kept.clone().unwrap_or_default(),
            }
        };
        let mut known = Known {
            ips: BTreeMap::new(),
            clients,
        };
        let ips = (st.lost.keys())
            .chain(takeovers.keys())
            .chain(totals.keys())
            .copied()
            .collect::<std::collections::BTreeSet<_>>();
        let mut claims: BTreeMap<IpAddr, Vec<CensusEntry>> = BTreeMap::new();
        if let Some(c) = &st.census {
            let all = crate::model::census::with_kept(&c.claims, &st.claims_kept);
            for e in all.iter().filter(|e| ips.contains(&e.ip)) {
                claims.entry(e.ip).or_default().push(*e);
            }
        }
        for ip in ips {
            let Some(e) = st.ips.get(&ip) else { continue };
            known.ips.insert(
                ip,
                IpKnown {
                    state: e.state,
                    source: e.source.clone(),
                    since_unix: e.since_unix,
                    lost_ns: st.lost.get(&ip).copied(),
                    takeover: takeovers.get(&ip).cloned(),
                    packets: totals.get(&ip).copied().unwrap_or(0),
                    claims: claims.remove(&ip).unwrap_or_default(),
                },
            );
        }
        known
    }
}

/// What the clients' reader asks of the daemon: the published state of the
/// LB IPs asked and of every IP this node has lost, and, once, what the
/// previous daemon knew of the clients (with the states of its IPs),
/// read under one lock: the losses the clients were counted from arrive
/// with them.
pub(super) fn clients_states(shared: Arc<Shared>) -> IpStates {
    Box::new(move |asked| {
        let st = shared.read();
        let restore = {
            let mut handoff = shared.clients_history();
            let r = handoff.restore.take();
            // What the reader will leave once it has judged them; until
            // then, what it took.
            if let Some(r) = &r {
                handoff.kept = Some((r.clients.clone(), r.totals.clone()));
            }
            r
        };
        let theirs = (restore.iter())
            .flat_map(|r| (r.totals.keys()).chain(r.clients.iter().map(|c| &c.entry.ip)));
        let ips = (asked.iter().chain(st.lost.keys()).chain(theirs))
            .filter_map(|ip| {
                let e = st.ips.get(ip)?;
                let lost_ns = st.lost.get(ip).copied();
                Some((
                    *ip,
                    IpState {
                        state: e.state,
                        lost_ns,
                    },
                ))
            })
            .collect();
        (ips, restore)
    })
}
