//! Takeovers in the daemon: announcements the program dropped because the
//! IP was foreign here are held (`model::takeover::Holds`) and re-sent,
//! byte for byte, the moment the IP becomes owned here; each takeover is
//! timed to its first announcement, or called silent. A speaker's frames
//! of an IP foreign here that are not held (monitor mode; replies) are
//! noted, and every one is told in the end as a takeover's own, a late
//! feed's or split brain (`model::takeover::Fates`). The kernel reports
//! reach the main loop through two queues (held frames, frames heard);
//! every decision here is the pure model's.

use std::{
    collections::BTreeSet,
    net::IpAddr,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use aya::maps::{MapData, RingBuf};
use guard_common::{HeldFrame, Origin, Ownership, Verdict};
use tokio::{io::unix::AsyncFd, sync::mpsc};

use super::{Daemon, TakeoverConfig};
use crate::{
    datapath::{monotonic_ns, wire::Wire},
    model::takeover::{Admission, Announced, Fates, Heard, Held, Holds, Takeovers, Tally},
    telemetry::takeover::TakeoverStats,
};

/// At most this many announcements held at once (each at most 256 bytes).
const MAX_HELD: usize = 8_192;
/// Queue lengths from the ring readers to the main loop.
pub(super) const QUEUE: usize = 4_096;

/// An LB IP's change of state, as the view saw it.
pub(super) type Transition = (IpAddr, Option<Ownership>, Option<Ownership>);

/// The main loop's takeover state.
pub(super) struct Takeover {
    /// None: nothing is held (`--announce-hold 0`, monitor mode).
    holds: Option<(Holds, Wire)>,
    pub(super) timing: Takeovers,
    /// Frames whose fate is not decided yet (given up by the hold, or noted).
    fates: Fates,
    pub(super) stats: TakeoverStats,
    /// Frames the reader could not queue (counted as overflow).
    reader_overflow: Arc<AtomicU64>,
    /// IPs whose split brain was logged, until their state changes (a
    /// split-brain speaker repeating itself is logged once).
    expiry_logged: BTreeSet<IpAddr>,
    /// The API's copy is behind.
    pub(super) changed: bool,
}

impl Takeover {
    /// Open the sender when announcements are to be held: a guard that
    /// drops them must be able to give them back.
    pub(super) fn new(cfg: &TakeoverConfig) -> anyhow::Result<Self> {
        let holds = if cfg.hold.is_zero() {
            None
        } else {
            let wire = Wire::open().map_err(|e| {
                anyhow::anyhow!(
                    "{e}: --announce-hold ({:?}) re-sends held takeover announcements through an \
                     AF_PACKET socket: grant CAP_NET_RAW, or pass --announce-hold 0 (a takeover \
                     announcement dropped before this node heard of the takeover is then lost)",
                    cfg.hold
                )
            })?;
            Some((Holds::new(cfg.hold, MAX_HELD), wire))
        };
        Ok(Takeover {
            holds,
            // An announcement within the hold window before the change counts
            // for it (at least a second: the feed lags); in monitor mode too,
            // where a foreign IP's announcement passes (would_drop).
            timing: Takeovers::new(cfg.silent_after, cfg.window.max(Duration::from_secs(1))),
            fates: Fates::new(cfg.window, cfg.verdict),
            stats: TakeoverStats::default(),
            reader_overflow: Arc::new(AtomicU64::new(0)),
            expiry_logged: BTreeSet::new(),
            changed: true,
        })
    }
}

/// Read held frames from the program's ring until it fails; queue them for
/// the main loop (a full queue is counted as overflow: those frames stay
/// dropped).
pub(super) async fn read_held(
    ring: RingBuf<MapData>,
    tx: mpsc::Sender<Held>,
    overflow: Arc<AtomicU64>,
) {
    // SAFETY: the RingBuf owns its fd and moves into the AsyncFd, so the fd
    // stays open until the AsyncFd (deregistering first) drops it.
    let mut fd = match unsafe { AsyncFd::register(ring) } {
        Ok(fd) => fd,
        Err(e) => {
            tracing::error!(error = %e, "held announcements cannot be read: a takeover announcement dropped here is lost");
            return;
        }
    };
    loop {
        let Ok(mut guard) = fd.readable_mut().await else {
            return;
        };
        let ring = guard.get_inner_mut();
        while let Some(item) = ring.next() {
            if item.len() < std::mem::size_of::<HeldFrame>() {
                continue;
            }
            // SAFETY: the record holds a HeldFrame (size checked), a
            // #[repr(C)] struct of integers valid for any bits; unaligned read.
            let f: HeldFrame = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
            if let Some(h) = Held::from_frame(&f) {
                if tx.try_send(h).is_err() {
                    overflow.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        guard.clear_ready();
    }
}

impl Daemon {
    /// The reader of held frames, when announcements are held.
    pub(super) fn start_held_reader(&mut self) -> Option<mpsc::Receiver<Held>> {
        self.takeover.holds.as_ref()?;
        match self.dp.take_held() {
            Ok(ring) => {
                let (tx, rx) = mpsc::channel(QUEUE);
                let overflow = self.takeover.reader_overflow.clone();
                tokio::spawn(read_held(ring, tx, overflow));
                Some(rx)
            }
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), "held announcements unavailable: a takeover announcement dropped here is lost");
                None
            }
        }
    }

    /// The program dropped an announcement of an IP foreign here: hold it,
    /// or re-send it at once if the IP has become owned meanwhile (the copy
    /// raced the map write).
    pub(super) fn on_held(&mut self, h: Held) {
        let t = &mut self.takeover;
        t.stats.count("deferred", 1);
        t.changed = true;
        let owned = self.view.lb.get(&h.ip).map(|l| l.state) == Some(Ownership::Owned);
        let Some((holds, wire)) = t.holds.as_mut() else {
            return;
        };
        // Only what this node itself sent is given back: another node's
        // announcement forwarded through a bridge here, re-sent after a
        // takeover, would teach the segment the old owner.
        if !h.sent_by(&crate::datapath::sys::link_macs()) {
            t.stats.count("not_local", 1);
            return;
        }
        let now = monotonic_ns();
        if owned {
            let ip = h.ip;
            let (sent, failed, delays) = replay(wire, vec![h], now);
            record_replays(&mut t.stats, sent, failed, &delays);
            log_replay(ip, sent, failed, &delays);
            return;
        }
        let (ip, at) = (h.ip, h.at_ns);
        match holds.admit(h, now) {
            Admission::Held => {}
            // Its copy is held, renewed; the repeat itself is judged too (a
            // split-brain speaker repeating itself keeps its copy fresh).
            Admission::Duplicate => {
                t.stats.count("duplicate", 1);
                if !t.fates.note(ip, at) {
                    t.stats.count("overflow", 1);
                }
            }
            // Past the window already: the rest of its fate is the fates'.
            Admission::Late => lapse(&mut t.fates, &mut t.stats, ip, 1, now),
            Admission::Full => t.stats.count("overflow", 1),
        }
        t.stats.holding = holds.len();
    }

    /// The program reported an announcement that left, or a frame of an IP
    /// foreign here that it stopped (or would have, in monitor mode).
    pub(super) fn on_heard(&mut self, h: Heard) {
        if h.verdict != Verdict::Passed {
            return self.on_stopped(h);
        }
        if let Some(a) = self
            .takeover
            .timing
            .announced(h.ip, h.at_ns, h.via, h.state)
        {
            self.takeover_announced(a);
        }
    }

    /// A frame of an IP foreign here, stopped or that would have been: a
    /// speaker's is noted unless it is held (its fate decides whether it was
    /// a takeover's), one that left anyway (monitor mode) may be the
    /// takeover's announcement; the kernel's answer says how this node's
    /// kernel is set up.
    fn on_stopped(&mut self, h: Heard) {
        if h.via == Origin::Kernel {
            return self.kernel_answered(&h);
        }
        if !matches!(h.via, Origin::Speaker | Origin::Redirect) {
            return;
        }
        if h.verdict == Verdict::Dropped {
            // Stopped here on what the feed says: if the feed is blind and
            // does not know it yet, this is when it matters (a takeover it
            // missed). Monitor mode stops nothing and asks nothing.
            self.shared.ops.api_hint.notify_one();
        }
        let t = &mut self.takeover;
        if h.verdict == Verdict::WouldDrop && h.kind.is_announcement() {
            // It left: the takeover that follows is announced.
            t.timing.announced(h.ip, h.at_ns, h.via, h.state);
        }
        // A dropped announcement is held (and counted) from its copy.
        if h.verdict == Verdict::Dropped && h.kind.is_announcement() && t.holds.is_some() {
            return;
        }
        t.stats.count("noted", 1);
        // Judged foreign just before the map said owned (its report came
        // after the change): the takeover's own.
        if self.view.lb.get(&h.ip).map(|l| l.state) == Some(Ownership::Owned) {
            t.stats.count("in_time", 1);
        } else if !t.fates.note(h.ip, h.at_ns) {
            t.stats.count("overflow", 1);
        }
        t.changed = true;
    }

    /// LB IPs changed state (seen at `at_ns`, in the maps now): time new
    /// takeovers, re-send what was held for IPs now owned here, forget what
    /// was held for IPs that left.
    /// `settling`: the changes bring in the cluster's state before and at
    /// its first sync: not takeovers (held announcements still go out).
    pub(super) fn on_transitions(&mut self, changes: &[Transition], at_ns: u64, settling: bool) {
        let unix = crate::api::state::unix_now();
        let now = monotonic_ns();
        for &(ip, old, new) in changes {
            let t = &mut self.takeover;
            t.expiry_logged.remove(&ip);
            if !settling {
                if new == Some(Ownership::Owned) && old != Some(Ownership::Owned) {
                    t.stats.takeovers += 1;
                    t.changed = true;
                }
                if let Some(a) = t.timing.changed(ip, old, new, at_ns, unix) {
                    self.takeover_announced(a);
                }
            }
            let t = &mut self.takeover;
            if new == Some(Ownership::Owned) && old != Some(Ownership::Owned) {
                let tally = t.fates.owned(&ip, at_ns);
                t.changed |= count_tally(&mut t.stats, tally);
                log_late(ip, tally);
            } else if new.is_none() {
                let gone = t.fates.forget(&ip);
                t.stats.count("expired", gone);
                t.changed |= gone > 0;
            }
            let Some((holds, wire)) = t.holds.as_mut() else {
                continue;
            };
            if !holds.holds(&ip) || !(new == Some(Ownership::Owned) || new.is_none()) {
                continue;
            }
            let (fresh, lapsed) = holds.take(&ip, now);
            if new.is_none() {
                t.stats.count("expired", (fresh.len() + lapsed) as u64);
            } else {
                // Given up a moment ago, owned now: late, not split brain.
                t.stats.count("late", lapsed as u64);
                let (sent, failed, delays) = replay(wire, fresh, now);
                record_replays(&mut t.stats, sent, failed, &delays);
                log_replay(ip, sent, failed, &delays);
            }
            t.stats.holding = holds.len();
            t.changed = true;
        }
        self.publish_takeovers();
    }

    /// Every heartbeat: discard what was held too long, call takeovers
    /// without an announcement silent.
    pub(super) fn takeover_tick(&mut self) {
        let now = monotonic_ns();
        let t = &mut self.takeover;
        if let Some((holds, _)) = t.holds.as_mut() {
            let overflow = t.reader_overflow.swap(0, Ordering::Relaxed);
            if overflow > 0 {
                t.stats.count("overflow", overflow);
                t.changed = true;
            }
            let expired = if holds.is_empty() {
                Vec::new()
            } else {
                holds.expire(now)
            };
            for (ip, n) in expired {
                lapse(&mut t.fates, &mut t.stats, ip, n as u64, now);
                t.changed = true;
            }
            t.stats.holding = holds.len();
        }
        for (ip, n) in t.fates.expire(now) {
            t.stats.count("expired", n);
            t.changed = true;
            if t.expiry_logged.insert(ip) {
                tracing::warn!(
                    lb_ip = %ip, frames = n,
                    "split brain: a speaker on this node announced (or answered for) an IP another node owns, and this node did not become its owner within --split-brain-after (held announcements were discarded; in monitor mode they went out)"
                );
            }
        }
        for ip in t.timing.tick(now) {
            let t = &mut self.takeover;
            t.stats.silent += 1;
            t.changed = true;
            tracing::warn!(
                lb_ip = %ip,
                "silent takeover: this node became the IP's owner and no announcement (gratuitous ARP, unsolicited NA) left it within --silent-takeover-after: clients that cached the old owner's MAC keep it until they ask again (did the announcer announce, and on a guarded interface?)"
            );
            self.send_event(serde_json::json!({"event": "silent_takeover", "lb_ip": ip}));
        }
        self.publish_takeovers();
    }

    fn takeover_announced(&mut self, a: Announced) {
        let t = &mut self.takeover;
        t.stats.first_announcement.observe(a.after.as_secs_f64());
        t.changed = true;
        let after_ms = a.after.as_millis() as u64;
        if a.late {
            tracing::info!(lb_ip = %a.ip, after_ms, via = a.via.as_str(), "the silent takeover was announced after all");
        } else {
            tracing::info!(lb_ip = %a.ip, after_ms, via = a.via.as_str(), "takeover announced: the first announcement left this node");
        }
        self.send_event(serde_json::json!({
            "event": "takeover_announced", "lb_ip": a.ip, "after_ms": after_ms,
            "via": a.via.as_str(), "late": a.late,
        }));
    }

    /// One line for `/events` subscribers (none is fine).
    fn send_event(&self, mut v: serde_json::Value) {
        v["time"] = crate::telemetry::events::unix_time_millis().into();
        let _ = self.shared.events.send(v.to_string());
    }

    /// Copy what changed into the API's state.
    pub(super) fn publish_takeovers(&mut self) {
        if !self.takeover.changed {
            return;
        }
        self.takeover.changed = false;
        let mut st = self.shared.write();
        st.takeover = Some(self.takeover.stats.clone());
        st.takeovers = self.takeover.timing.records().clone();
    }
}

/// Re-send `frames` (their IP is owned here now); how many went, how many
/// failed, and how long each had waited since its drop.
fn replay(wire: &Wire, frames: Vec<Held>, now_ns: u64) -> (u64, u64, Vec<Duration>) {
    let (mut sent, mut failed, mut delays) = (0, 0, Vec::new());
    for h in frames {
        match wire.send(h.ifindex, &h.bytes) {
            Ok(()) => {
                sent += 1;
                delays.push(Duration::from_nanos(now_ns.saturating_sub(h.at_ns)));
            }
            Err(e) => {
                failed += 1;
                tracing::warn!(lb_ip = %h.ip, ifindex = h.ifindex, error = %e, "a held announcement could not be re-sent");
            }
        }
    }
    (sent, failed, delays)
}

/// `n` held frames of `ip` given up by the hold at `now_ns`: their fate is
/// decided later (no room to wait: given up for good, counted expired).
fn lapse(fates: &mut Fates, stats: &mut TakeoverStats, ip: IpAddr, n: u64, now_ns: u64) {
    if !fates.lapsed(ip, n, now_ns) {
        stats.count("expired", n);
    }
}

/// Count what the frames of an IP now owned here were; whether any.
fn count_tally(stats: &mut TakeoverStats, t: Tally) -> bool {
    stats.count("in_time", t.in_time);
    stats.count("late", t.late);
    stats.count("expired", t.expired);
    t != Tally::default()
}

/// One line when a takeover's frames were given up before the feed said
/// so: the feed was late (a held announcement was not re-sent).
fn log_late(ip: IpAddr, t: Tally) {
    if t.late > 0 {
        tracing::info!(
            lb_ip = %ip, frames = t.late,
            "this node became the IP's owner after --announce-hold had passed for its speaker's frames: the ownership feed was late (not split brain); held ones were not re-sent"
        );
    }
}

fn record_replays(stats: &mut TakeoverStats, sent: u64, failed: u64, delays: &[Duration]) {
    stats.count("replayed", sent);
    stats.count("replay_failed", failed);
    for d in delays {
        stats.replay_delay.observe(d.as_secs_f64());
    }
}

/// One line per takeover whose announcements were re-sent.
fn log_replay(ip: IpAddr, sent: u64, failed: u64, delays: &[Duration]) {
    if sent == 0 && failed == 0 {
        return;
    }
    let held_ms = delays.iter().max().map_or(0, |d| d.as_millis() as u64);
    tracing::info!(
        lb_ip = %ip, frames = sent, failed, held_ms,
        "held announcements re-sent: this node is now the IP's owner (the announcer spoke before the ownership change reached the guard)"
    );
}
