//! Takeovers as this node lives them, pure (time is passed in, in the
//! kernel's clock: CLOCK_MONOTONIC ns):
//!
//! - [`Holds`]: announcements the program dropped because the IP was
//!   `foreign` here, kept for a window. At a takeover the announcer usually
//!   speaks before the guard hears of it (Cilium and kube-vip write their
//!   Lease, then announce at once; MetalLB announces, then writes its
//!   status), so the guard must not be the reason a takeover announcement
//!   is lost: if the IP becomes owned here within the window, the daemon
//!   re-sends the same bytes. If not, they are discarded (a split-brain
//!   speaker stays stopped).
//! - [`Takeovers`]: for each IP that becomes owned here, the time from the
//!   ownership change to the first announcement that left this node (or was
//!   re-sent); none within a threshold is a silent takeover.
//! - [`Fates`]: what the frames of an IP foreign here turned out to be: a
//!   takeover's own, a late feed's, or split brain (`fates.rs`).

mod fates;

use std::{collections::BTreeMap, net::IpAddr, time::Duration};

pub use fates::{Fates, Tally};
use guard_common::{Kind, Origin, Ownership, Verdict};
/// The record a takeover leaves in the status (a wire type: the plugin
/// reads it too).
pub use guard_wire::takeover::TakeoverRecord;

/// An announcement held back ([`guard_common::HeldFrame`], decoded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub ip: IpAddr,
    pub ifindex: u32,
    /// When the program dropped it.
    pub at_ns: u64,
    pub kind: Kind,
    pub origin: Origin,
    /// The frame as it was to leave, VLAN tag from metadata put back.
    pub bytes: Vec<u8>,
}

impl Held {
    /// Whether one of `local` (this node's MACs) sent it: its Ethernet
    /// source.
    pub fn sent_by(&self, local: &[[u8; 6]]) -> bool {
        self.bytes
            .get(6..12)
            .is_some_and(|src| local.iter().any(|m| m[..] == *src))
    }

    /// The frame the program copied, with a VLAN tag that travelled in skb
    /// metadata (a VLAN device above an interface that offloads tagging)
    /// put back in front of the ethertype: re-sent on the same interface,
    /// it leaves exactly as it would have. None for a record that is not
    /// one (too short, unknown kind or origin).
    pub fn from_frame(f: &guard_common::HeldFrame) -> Option<Held> {
        let len = usize::from(f.len).min(guard_common::HELD_FRAME_MAX);
        let data = f.data.get(..len).filter(|d| d.len() >= 14)?;
        let mut bytes = Vec::with_capacity(len + 4);
        bytes.extend_from_slice(&data[..12]);
        if f.vlan_proto != 0 {
            // The kernel keeps the protocol in network byte order.
            bytes.extend_from_slice(&f.vlan_proto.to_ne_bytes());
            bytes.extend_from_slice(&f.vlan_tci.to_be_bytes());
        }
        bytes.extend_from_slice(&data[12..]);
        Some(Held {
            ip: guard_common::ip_of_key(f.ip),
            ifindex: f.ifindex,
            at_ns: f.at_ns,
            kind: Kind::from_u8(f.kind)?,
            origin: Origin::from_u8(f.origin)?,
            bytes,
        })
    }
}

/// A frame of an LB IP as the program reports it: an announcement that
/// left this node (`Passed`: the first after each change of the IP's
/// entry), or one stopped, or that would have been (a drop event of an IP
/// foreign here: what [`Fates`] and the kernel's answers are told from).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heard {
    pub ip: IpAddr,
    pub at_ns: u64,
    pub via: Origin,
    /// The state it was judged with.
    pub state: Ownership,
    pub kind: Kind,
    pub ifindex: u32,
    pub verdict: Verdict,
}

/// What [`Holds::admit`] did with a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    Held,
    /// The same bytes on the same interface are held already (an announcer
    /// repeating itself, as MetalLB does for 5 s): one copy is kept, with
    /// the latest time, so that the hold runs from the last repeat.
    Duplicate,
    /// Older than the window already (the daemon fell behind): discarded.
    Late,
    /// The store is full (per IP or in all): discarded.
    Full,
}

/// Distinct frames kept per LB IP: MetalLB sends a request and a reply,
/// kube-vip alternates them; a few interfaces at most.
pub const PER_IP: usize = 8;

/// Held announcements, per LB IP, for `window`; at most `max` frames in all
/// (each at most [`guard_common::HELD_FRAME_MAX`] bytes: 8,192 frames are
/// about 2.5 MiB).
#[derive(Debug)]
pub struct Holds {
    window_ns: u64,
    max: usize,
    by_ip: BTreeMap<IpAddr, Vec<Held>>,
    count: usize,
}

impl Holds {
    pub fn new(window: Duration, max: usize) -> Self {
        Holds {
            window_ns: u64::try_from(window.as_nanos()).unwrap_or(u64::MAX),
            max,
            by_ip: BTreeMap::new(),
            count: 0,
        }
    }

    /// Frames held now.
    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Whether `ip` has frames held.
    pub fn holds(&self, ip: &IpAddr) -> bool {
        self.by_ip.contains_key(ip)
    }

    fn fresh(&self, h: &Held, now_ns: u64) -> bool {
        now_ns.saturating_sub(h.at_ns) <= self.window_ns
    }

    /// Keep `h` until it is taken or expires.
    pub fn admit(&mut self, h: Held, now_ns: u64) -> Admission {
        if !self.fresh(&h, now_ns) {
            return Admission::Late;
        }
        let held = self.by_ip.entry(h.ip).or_default();
        if let Some(o) = (held.iter_mut()).find(|o| o.ifindex == h.ifindex && o.bytes == h.bytes) {
            o.at_ns = o.at_ns.max(h.at_ns);
            return Admission::Duplicate;
        }
        if held.len() >= PER_IP || self.count >= self.max {
            if held.is_empty() {
                self.by_ip.remove(&h.ip);
            }
            return Admission::Full;
        }
        held.push(h);
        self.count += 1;
        Admission::Held
    }

    /// The frames of `ip` still within the window, in the order they were
    /// dropped (to re-send now), and how many had expired.
    pub fn take(&mut self, ip: &IpAddr, now_ns: u64) -> (Vec<Held>, usize) {
        let Some(all) = self.by_ip.remove(ip) else {
            return (Vec::new(), 0);
        };
        self.count -= all.len();
        let total = all.len();
        let fresh: Vec<Held> = all.into_iter().filter(|h| self.fresh(h, now_ns)).collect();
        let expired = total - fresh.len();
        (fresh, expired)
    }

    /// Discard what is older than the window; how many frames went, per IP.
    pub fn expire(&mut self, now_ns: u64) -> Vec<(IpAddr, usize)> {
        let window = self.window_ns;
        let mut out = Vec::new();
        self.by_ip.retain(|ip, held| {
            let before = held.len();
            held.retain(|h| now_ns.saturating_sub(h.at_ns) <= window);
            if held.len() != before {
                out.push((*ip, before - held.len()));
            }
            !held.is_empty()
        });
        self.count -= out.iter().map(|(_, n)| n).sum::<usize>();
        out
    }
}

/// A takeover as it is kept across a restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptTakeover {
    pub record: TakeoverRecord,
    /// While no announcement has come: when the ownership change was seen
    /// (CLOCK_MONOTONIC ns), and whether the takeover was called silent.
    pub pending: Option<(u64, bool)>,
}

/// A takeover's first announcement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Announced {
    pub ip: IpAddr,
    /// From the ownership change (0: the announcement came first).
    pub after: Duration,
    pub via: Origin,
    /// It came after the takeover had been called silent.
    pub late: bool,
}

#[derive(Debug, Clone, Copy)]
struct Pending {
    since_ns: u64,
    silent: bool,
}

/// The timing of this node's takeovers.
#[derive(Debug)]
pub struct Takeovers {
    silent_after_ns: u64,
    /// An announcement this long before the ownership change counts for it
    /// (the announcer spoke first; it passed while the IP was unknown here).
    lookback_ns: u64,
    pending: BTreeMap<IpAddr, Pending>,
    /// The last announcement seen of an IP not owned here.
    before: BTreeMap<IpAddr, (u64, Origin)>,
    last: BTreeMap<IpAddr, TakeoverRecord>,
}

impl Takeovers {
    pub fn new(silent_after: Duration, lookback: Duration) -> Self {
        let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        Takeovers {
            silent_after_ns: ns(silent_after),
            lookback_ns: ns(lookback),
            pending: BTreeMap::new(),
            before: BTreeMap::new(),
            last: BTreeMap::new(),
        }
    }

    /// The last takeover of each IP.
    pub fn records(&self) -> &BTreeMap<IpAddr, TakeoverRecord> {
        &self.last
    }

    /// What is kept of each takeover across a restart: its record and,
    /// while it waits for its first announcement, when it began.
    pub fn kept(&self) -> BTreeMap<IpAddr, KeptTakeover> {
        (self.last.iter())
            .map(|(ip, r)| {
                let pending = self.pending.get(ip).map(|p| (p.since_ns, p.silent));
                let record = r.clone();
                (*ip, KeptTakeover { record, pending })
            })
            .collect()
    }

    /// Take back a takeover the previous daemon timed (not when this one
    /// has a record of its own for the IP: it is newer). A takeover still
    /// waiting for its first announcement waits on: called silent when its
    /// time comes (once), closed by the first announcement the program
    /// reports.
    pub fn restore(&mut self, ip: IpAddr, k: KeptTakeover) -> bool {
        if self.last.contains_key(&ip) {
            return false;
        }
        if let Some((since_ns, silent)) = k.pending {
            self.pending.insert(ip, Pending { since_ns, silent });
        }
        self.last.insert(ip, k.record);
        true
    }

    /// `ip` went from `old` to `new` here, seen at `at_ns` (`at_unix`). A
    /// change to owned starts a takeover; it is announced at once when an
    /// announcement left within the lookback before.
    pub fn changed(
        &mut self,
        ip: IpAddr,
        old: Option<Ownership>,
        new: Option<Ownership>,
        at_ns: u64,
        at_unix: u64,
    ) -> Option<Announced> {
        if new != Some(Ownership::Owned) {
            self.pending.remove(&ip);
            if new.is_none() {
                self.before.remove(&ip);
                self.last.remove(&ip);
            }
            return None;
        }
        if old == Some(Ownership::Owned) {
            return None;
        }
        self.last.insert(
            ip,
            TakeoverRecord {
                at_unix,
                first_announcement_ms: None,
                via: None,
                silent: false,
            },
        );
        match self.before.remove(&ip) {
            Some((t, via)) if at_ns.saturating_sub(t) <= self.lookback_ns => {
                self.pending.insert(
                    ip,
                    Pending {
                        since_ns: at_ns,
                        silent: false,
                    },
                );
                self.announced(ip, t, via, Ownership::Owned)
            }
            _ => {
                self.pending.insert(
                    ip,
                    Pending {
                        since_ns: at_ns,
                        silent: false,
                    },
                );
                None
            }
        }
    }

    /// An announcement of `ip` left at `at_ns`, judged `state` (the
    /// program reports the first after each change of an entry).
    pub fn announced(
        &mut self,
        ip: IpAddr,
        at_ns: u64,
        via: Origin,
        state: Ownership,
    ) -> Option<Announced> {
        let Some(p) = self.pending.remove(&ip) else {
            if state != Ownership::Owned {
                self.before.insert(ip, (at_ns, via));
            }
            return None;
        };
        let after = Duration::from_nanos(at_ns.saturating_sub(p.since_ns));
        if let Some(r) = self.last.get_mut(&ip) {
            r.first_announcement_ms = Some(after.as_millis() as u64);
            r.via = Some(via);
        }
        Some(Announced {
            ip,
            after,
            via,
            late: p.silent,
        })
    }

    /// Takeovers that have now gone `silent_after` without an announcement
    /// (each reported once; a later announcement still closes them).
    pub fn tick(&mut self, now_ns: u64) -> Vec<IpAddr> {
        let mut out = Vec::new();
        for (ip, p) in &mut self.pending {
            if !p.silent && now_ns.saturating_sub(p.since_ns) >= self.silent_after_ns {
                p.silent = true;
                out.push(*ip);
                if let Some(r) = self.last.get_mut(ip) {
                    r.silent = true;
                }
            }
        }
        let lookback = self.lookback_ns;
        self.before
            .retain(|_, (t, _)| now_ns.saturating_sub(*t) <= lookback);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const S: u64 = 1_000 * MS;

    fn ip(n: u8) -> IpAddr {
        IpAddr::V4(std::net::Ipv4Addr::new(198, 51, 100, n))
    }

    fn held(n: u8, at: u64, byte: u8) -> Held {
        Held {
            ip: ip(n),
            ifindex: 2,
            at_ns: at,
            kind: Kind::Gratuitous,
            origin: Origin::Speaker,
            bytes: vec![byte; 42],
        }
    }

    #[test]
    fn only_what_this_node_sent_is_given_back() {
        let mut h = held(1, S, 0);
        h.bytes[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 0xa]);
        assert!(h.sent_by(&[[2, 0, 0, 0, 0, 0xb], [2, 0, 0, 0, 0, 0xa]]));
        assert!(!h.sent_by(&[[2, 0, 0, 0, 0, 0xb]]), "forwarded here");
        assert!(!h.sent_by(&[]));
    }

    #[test]
    fn held_frames_are_taken_in_order_within_the_window() {
        let mut h = Holds::new(Duration::from_secs(5), 100);
        assert_eq!(h.admit(held(1, S, 1), S), Admission::Held);
        assert_eq!(h.admit(held(1, 2 * S, 2), 2 * S), Admission::Held);
        // The same bytes again: one copy, with the latest time.
        assert_eq!(h.admit(held(1, 3 * S, 1), 3 * S), Admission::Duplicate);
        assert_eq!(h.len(), 2);
        // Taken 5.5 s after the second: it has expired, the repeated one
        // (2.5 s old) has not.
        let (fresh, expired) = h.take(&ip(1), 7 * S + 500 * MS);
        assert_eq!(expired, 1);
        assert_eq!(fresh.len(), 1);
        assert_eq!(fresh[0].bytes[0], 1);
        assert!(h.is_empty() && !h.holds(&ip(1)));
        // A frame that arrives older than the window is not kept.
        assert_eq!(h.admit(held(2, S, 1), 7 * S), Admission::Late);
    }

    #[test]
    fn a_tag_from_metadata_is_put_back() {
        let mut f = guard_common::HeldFrame {
            ip: guard_common::v4_key(0xc633_6464),
            at_ns: 7,
            ifindex: 3,
            vlan_tci: 100,
            vlan_proto: u16::from_ne_bytes([0x81, 0x00]),
            len: 42,
            kind: Kind::Gratuitous as u8,
            origin: Origin::Speaker as u8,
            _pad: [0; 4],
            data: [0; guard_common::HELD_FRAME_MAX],
        };
        f.data[12..14].copy_from_slice(&[0x08, 0x06]);
        let h = Held::from_frame(&f).unwrap();
        assert_eq!(h.bytes.len(), 46);
        assert_eq!(&h.bytes[12..18], &[0x81, 0x00, 0x00, 100, 0x08, 0x06]);
        assert_eq!(h.ip, ip(100));
        f.vlan_proto = 0;
        assert_eq!(Held::from_frame(&f).unwrap().bytes.len(), 42);
        f.len = 10;
        assert_eq!(Held::from_frame(&f), None, "too short to be a frame");
        f.len = 42;
        f.kind = 77;
        assert_eq!(Held::from_frame(&f), None);
    }

    #[test]
    fn holds_are_bounded_per_ip_and_in_all() {
        let mut h = Holds::new(Duration::from_secs(5), 10);
        for b in 0..PER_IP as u8 {
            assert_eq!(h.admit(held(1, S, b), S), Admission::Held);
        }
        assert_eq!(h.admit(held(1, S, 99), S), Admission::Full);
        assert_eq!(h.admit(held(2, S, 1), S), Admission::Held);
        assert_eq!(h.admit(held(3, S, 1), S), Admission::Held);
        assert_eq!(h.admit(held(4, S, 1), S), Admission::Full);
        assert!(!h.holds(&ip(4)), "a refused IP leaves no empty entry");
        assert_eq!(h.len(), 10);
        // Everything expires after the window.
        let gone = h.expire(7 * S);
        assert_eq!(gone.iter().map(|(_, n)| n).sum::<usize>(), 10);
        assert!(h.is_empty());
    }

    #[test]
    fn a_takeover_is_timed_to_its_first_announcement() {
        let mut t = Takeovers::new(Duration::from_secs(3), Duration::from_secs(5));
        let a = ip(1);
        assert_eq!(
            t.changed(
                a,
                Some(Ownership::Foreign),
                Some(Ownership::Owned),
                10 * S,
                100
            ),
            None
        );
        assert!(t.pending.contains_key(&a));
        let ann = t
            .announced(a, 10 * S + 40 * MS, Origin::Guard, Ownership::Owned)
            .unwrap();
        assert_eq!(ann.after, Duration::from_millis(40));
        assert_eq!((ann.via, ann.late), (Origin::Guard, false));
        assert_eq!(t.records()[&a].first_announcement_ms, Some(40));
        // Only the first counts.
        assert_eq!(
            t.announced(a, 11 * S, Origin::Speaker, Ownership::Owned),
            None
        );
        assert!(t.tick(20 * S).is_empty());
    }

    #[test]
    fn an_announcement_before_the_change_counts_within_the_lookback() {
        let mut t = Takeovers::new(Duration::from_secs(3), Duration::from_secs(5));
        let a = ip(1);
        // It passed while the IP was unknown here (a Lease expired first).
        assert_eq!(
            t.announced(a, 9 * S, Origin::Redirect, Ownership::Unknown),
            None
        );
        let ann = t
            .changed(
                a,
                Some(Ownership::Unknown),
                Some(Ownership::Owned),
                10 * S,
                100,
            )
            .unwrap();
        assert_eq!((ann.after, ann.via), (Duration::ZERO, Origin::Redirect));
        assert!(t.pending.is_empty());
        // Too long before: the takeover waits for its own.
        let b = ip(2);
        t.announced(b, S, Origin::Speaker, Ownership::Unknown);
        assert_eq!(
            t.changed(
                b,
                Some(Ownership::Unknown),
                Some(Ownership::Owned),
                10 * S,
                100
            ),
            None
        );
    }

    /// A restart keeps the records, and a takeover waiting for its first
    /// announcement waits on: silent when its time comes, reported once.
    #[test]
    fn takeovers_are_kept_across_a_restart() {
        let mut t = Takeovers::new(Duration::from_secs(3), Duration::from_secs(5));
        let (a, b, c) = (ip(1), ip(2), ip(3));
        t.changed(a, None, Some(Ownership::Owned), 10 * S, 100);
        t.announced(a, 10 * S + 7 * MS, Origin::Speaker, Ownership::Owned);
        t.changed(b, None, Some(Ownership::Owned), 31 * S, 110);
        t.changed(c, None, Some(Ownership::Owned), 28 * S, 120);
        assert_eq!(t.tick(31 * S + 500 * MS), vec![c], "c is silent, b not yet");
        let kept = t.kept();
        assert_eq!(kept[&a].pending, None);
        assert_eq!(kept[&b].pending, Some((31 * S, false)));
        assert_eq!(kept[&c].pending, Some((28 * S, true)));

        let mut next = Takeovers::new(Duration::from_secs(3), Duration::from_secs(5));
        // This daemon's own record of c is newer than the kept one.
        next.changed(c, None, Some(Ownership::Owned), 34 * S, 124);
        for (ip, k) in kept.clone() {
            assert_eq!(next.restore(ip, k), ip != c);
        }
        assert_eq!(next.records()[&a], kept[&a].record);
        assert_eq!(next.records()[&c].at_unix, 124);
        // b waited across the restart: silent at 34 s, once.
        assert_eq!(next.tick(33 * S), Vec::<IpAddr>::new());
        assert_eq!(next.tick(34 * S), vec![b]);
        assert!(next.tick(35 * S).is_empty());
        let ann = next
            .announced(b, 36 * S, Origin::Speaker, Ownership::Owned)
            .unwrap();
        assert!(ann.late);
        assert_eq!(next.records()[&b].first_announcement_ms, Some(5_000));
    }

    #[test]
    fn no_announcement_within_the_threshold_is_a_silent_takeover() {
        let mut t = Takeovers::new(Duration::from_secs(3), Duration::from_secs(5));
        let a = ip(1);
        t.changed(a, None, Some(Ownership::Owned), 10 * S, 100);
        assert!(t.tick(12 * S).is_empty());
        assert_eq!(t.tick(13 * S), vec![a]);
        assert!(t.tick(14 * S).is_empty(), "reported once");
        assert!(t.records()[&a].silent);
        // A late announcement still closes it, marked late.
        let ann = t
            .announced(a, 20 * S, Origin::Speaker, Ownership::Owned)
            .unwrap();
        assert!(ann.late);
        assert_eq!(t.records()[&a].first_announcement_ms, Some(10_000));
        // Losing the IP ends a pending takeover; removal forgets it.
        let b = ip(2);
        t.changed(
            b,
            Some(Ownership::Foreign),
            Some(Ownership::Owned),
            30 * S,
            1,
        );
        t.changed(
            b,
            Some(Ownership::Owned),
            Some(Ownership::Foreign),
            31 * S,
            1,
        );
        assert!(t.tick(40 * S).is_empty());
        t.changed(b, Some(Ownership::Foreign), None, 41 * S, 1);
        assert!(!t.records().contains_key(&b));
        // Owned to owned (a new source) is no takeover.
        assert_eq!(
            t.changed(a, Some(Ownership::Owned), Some(Ownership::Owned), 50 * S, 1),
            None
        );
        assert!(t.pending.is_empty());
    }
}
