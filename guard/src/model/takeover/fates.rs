//! What became of a speaker's frames for an LB IP foreign here (pure; the
//! kernel's clock, CLOCK_MONOTONIC ns, passed in). A takeover is told by
//! the frames around it: the announcer speaks first, the ownership feed
//! follows (Cilium and kube-vip within milliseconds, MetalLB's
//! ServiceL2Status up to seconds later). The one rule, [`fate`]:
//!
//! - the IP became owned here within `window` (`--announce-hold`) of the
//!   frame: it was the takeover's own (**in time**; a held one was
//!   re-sent);
//! - later, but within `verdict` (`--split-brain-after`, at least the
//!   window): the feed was **late** (a held frame was not re-sent: it had
//!   been given up), not split brain;
//! - not within `verdict`: a speaker announcing an IP another node owns
//!   (**expired**): split brain.
//!
//! Held frames (enforce mode) are judged in time by [`super::Holds`];
//! those it gives up come here ([`Fates::lapsed`]) for the rest of the
//! rule. Frames that are not held (monitor mode: they passed; replies,
//! which are never held) come here when they are seen ([`Fates::note`]).

use std::{collections::BTreeMap, net::IpAddr, time::Duration};

/// What a frame turned out to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// The IP became owned here within the window.
    InTime,
    /// Owned here after the window, within the verdict: a late feed.
    Late,
    /// Not owned here within the verdict: split brain.
    Expired,
}

/// The rule for a frame stopped (or seen) at `at_ns`: its fate once the IP
/// became owned here at `owned_ns`, or, while it is not, at `now_ns` (None:
/// not decided yet).
pub fn fate(
    at_ns: u64,
    owned_ns: Option<u64>,
    now_ns: u64,
    window_ns: u64,
    verdict_ns: u64,
) -> Option<Fate> {
    let verdict_ns = verdict_ns.max(window_ns);
    match owned_ns {
        Some(t) if t.saturating_sub(at_ns) <= window_ns => Some(Fate::InTime),
        Some(t) if t.saturating_sub(at_ns) <= verdict_ns => Some(Fate::Late),
        Some(_) => Some(Fate::Expired),
        None if now_ns.saturating_sub(at_ns) > verdict_ns => Some(Fate::Expired),
        None => None,
    }
}

/// Frames of one IP within a second are kept as one.
const BUCKET_NS: u64 = 1_000_000_000;
/// Buckets kept per IP (a speaker that never stops fills them; the last
/// one then takes the rest).
const PER_IP: usize = 64;
/// IPs with frames waiting for their fate.
pub const MAX_IPS: usize = 65_536;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Bucket {
    at_ns: u64,
    frames: u64,
    /// Held frames the hold gave up: never in time any more.
    lapsed: bool,
}

/// Frames whose fate is not decided yet, per IP.
#[derive(Debug)]
pub struct Fates {
    window_ns: u64,
    verdict_ns: u64,
    by_ip: BTreeMap<IpAddr, Vec<Bucket>>,
}

/// How many frames of an IP that became owned here were in time, and late.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    pub in_time: u64,
    pub late: u64,
    pub expired: u64,
}

impl Fates {
    pub fn new(window: Duration, verdict: Duration) -> Self {
        let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        Fates {
            window_ns: ns(window),
            verdict_ns: ns(verdict).max(ns(window)),
            by_ip: BTreeMap::new(),
        }
    }

    fn add(&mut self, ip: IpAddr, b: Bucket) -> bool {
        if self.by_ip.len() >= MAX_IPS && !self.by_ip.contains_key(&ip) {
            return false;
        }
        let v = self.by_ip.entry(ip).or_default();
        let full = v.len() >= PER_IP;
        match v.last_mut() {
            // Within a second of the last, or no room for more: one bucket,
            // with the later time (a merged frame is never judged older than
            // it is: late is never called split brain).
            Some(l)
                if full
                    || (l.lapsed == b.lapsed && b.at_ns.saturating_sub(l.at_ns) < BUCKET_NS) =>
            {
                l.at_ns = l.at_ns.max(b.at_ns);
                l.frames += b.frames;
                l.lapsed &= b.lapsed;
            }
            _ => v.push(b),
        }
        true
    }

    /// A frame not held, seen at `at_ns`. False: no room (its fate is
    /// unknown: the caller counts it as given up).
    pub fn note(&mut self, ip: IpAddr, at_ns: u64) -> bool {
        self.add(
            ip,
            Bucket {
                at_ns,
                frames: 1,
                lapsed: false,
            },
        )
    }

    /// `frames` held frames of `ip` that the hold gave up at `now_ns` (they
    /// were dropped about a window before).
    pub fn lapsed(&mut self, ip: IpAddr, frames: u64, now_ns: u64) -> bool {
        self.add(
            ip,
            Bucket {
                at_ns: now_ns.saturating_sub(self.window_ns),
                frames,
                lapsed: true,
            },
        )
    }

    /// `ip` became owned here at `now_ns`: what its frames were.
    pub fn owned(&mut self, ip: &IpAddr, now_ns: u64) -> Tally {
        let mut t = Tally::default();
        for b in self.by_ip.remove(ip).unwrap_or_default() {
            let f = fate(
                b.at_ns,
                Some(now_ns),
                now_ns,
                self.window_ns,
                self.verdict_ns,
            );
            match f {
                Some(Fate::InTime) if !b.lapsed => t.in_time += b.frames,
                Some(Fate::InTime | Fate::Late) => t.late += b.frames,
                _ => t.expired += b.frames,
            }
        }
        t
    }

    /// `ip` is no LB IP any more: its frames, given up.
    pub fn forget(&mut self, ip: &IpAddr) -> u64 {
        (self.by_ip.remove(ip).unwrap_or_default().iter())
            .map(|b| b.frames)
            .sum()
    }

    /// The frames whose verdict has come without their IP becoming owned
    /// here: split brain, per IP.
    pub fn expire(&mut self, now_ns: u64) -> Vec<(IpAddr, u64)> {
        let (window, verdict) = (self.window_ns, self.verdict_ns);
        let mut out = Vec::new();
        self.by_ip.retain(|ip, v| {
            let mut gone = 0;
            v.retain(|b| {
                let expired = fate(b.at_ns, None, now_ns, window, verdict) == Some(Fate::Expired);
                if expired {
                    gone += b.frames;
                }
                !expired
            });
            if gone > 0 {
                out.push((*ip, gone));
            }
            !v.is_empty()
        });
        out
    }

    /// Whether `ip` has frames waiting.
    #[cfg(test)]
    pub fn waiting(&self, ip: &IpAddr) -> bool {
        self.by_ip.contains_key(ip)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn ip(n: u8) -> IpAddr {
        IpAddr::V4(std::net::Ipv4Addr::new(198, 51, 100, n))
    }

    #[test]
    fn the_rule() {
        let (w, v) = (5 * S, 30 * S);
        assert_eq!(fate(10 * S, Some(14 * S), 14 * S, w, v), Some(Fate::InTime));
        assert_eq!(fate(10 * S, Some(15 * S), 15 * S, w, v), Some(Fate::InTime));
        // MetalLB's status 8 s after its first announcement: late.
        assert_eq!(fate(10 * S, Some(18 * S), 18 * S, w, v), Some(Fate::Late));
        assert_eq!(fate(10 * S, Some(40 * S), 40 * S, w, v), Some(Fate::Late));
        assert_eq!(
            fate(10 * S, Some(41 * S), 41 * S, w, v),
            Some(Fate::Expired)
        );
        // Not owned: undecided until the verdict, then split brain.
        assert_eq!(fate(10 * S, None, 39 * S, w, v), None);
        assert_eq!(fate(10 * S, None, 41 * S, w, v), Some(Fate::Expired));
        // A verdict shorter than the window is the window.
        assert_eq!(fate(10 * S, None, 14 * S, w, S), None);
    }

    #[test]
    fn a_late_feed_is_late_and_a_speaker_that_never_owns_is_split_brain() {
        let mut f = Fates::new(Duration::from_secs(5), Duration::from_secs(30));
        // Monitor mode: MetalLB's burst passed (noted), its status came 8 s
        // after the first frame.
        for t in [0, 1, 2, 3, 4] {
            assert!(f.note(ip(1), (100 + t) * S + t * 100_000_000));
        }
        let t = f.owned(&ip(1), 108 * S);
        assert_eq!((t.in_time, t.late, t.expired), (2, 3, 0), "{t:?}");
        assert!(!f.waiting(&ip(1)));
        // Enforce mode: held frames given up by the hold are late at best.
        assert!(f.lapsed(ip(2), 2, 105 * S));
        assert_eq!(f.owned(&ip(2), 106 * S).late, 2);
        // A split-brain speaker: expired once the verdict has come.
        f.note(ip(3), 100 * S);
        f.lapsed(ip(3), 1, 105 * S);
        assert!(f.expire(129 * S).is_empty());
        assert_eq!(f.expire(131 * S), vec![(ip(3), 2)]);
        assert!(!f.waiting(&ip(3)));
        // Removed: given up.
        f.note(ip(4), 100 * S);
        assert_eq!(f.forget(&ip(4)), 1);
    }

    #[test]
    fn a_speaker_that_never_stops_is_bounded() {
        let mut f = Fates::new(Duration::from_secs(5), Duration::from_secs(30));
        for i in 0..1000 {
            f.note(ip(1), 100 * S + i * 2 * S);
        }
        assert!(f.by_ip[&ip(1)].len() <= PER_IP);
        let total: u64 = f.by_ip[&ip(1)].iter().map(|b| b.frames).sum();
        assert_eq!(total, 1000);
        // Everything older than the verdict goes; the merged tail is kept
        // with its latest time.
        let gone: u64 = f.expire(100 * S + 1998 * S).iter().map(|(_, n)| n).sum();
        assert!(gone > 0 && gone < 1000);
    }
}
