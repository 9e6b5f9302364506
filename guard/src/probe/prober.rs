//! The probe's bookkeeping, pure: it writes the requests and reads what comes
//! back, given the time; it never touches a socket or a clock (`run.rs` does),
//! so every case is a unit test.
//!
//! Per IP: requests sent, rounds answered, every frame that claims the IP
//! (ARP replies, gratuitous ARP and announce leaks, as the guard classifies
//! them) per sender MAC with first and last time, and the TCP connects
//! attributed to the MAC the host's neighbour table held. Memory is bounded:
//! at most [`MAX_IPS`] IPs and [`MAX_MACS`] MACs per IP (frames from further
//! MACs are only counted); each frame costs one hash lookup and a scan of at
//! most [`MAX_MACS`] entries.

use std::{collections::HashMap, net::Ipv4Addr, time::Duration};

use guard_common::{
    build::{write_arp, ArpPacket, Ethernet, BROADCAST, FRAME_BUF},
    classify,
    frame::{parse, Parsed},
    Kind,
};

/// The most IPs one probe asks about.
pub const MAX_IPS: usize = 1024;
/// The most MACs recorded per IP; frames from further MACs are counted.
pub const MAX_MACS: usize = 64;

/// Why a TCP connect failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectError {
    /// No answer within the timeout (a dropped SYN).
    TimedOut,
    /// RST: the host is there, nothing listens.
    Refused,
    /// The kernel could not resolve the IP (no ARP answer) or route to it.
    Unreachable,
    Other,
}

/// Outcomes of the connects attributed to one MAC.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConnectStats {
    pub ok: u64,
    pub timed_out: u64,
    pub refused: u64,
    pub unreachable: u64,
    pub other: u64,
}

impl ConnectStats {
    pub fn failed(&self) -> u64 {
        self.timed_out + self.refused + self.unreachable + self.other
    }

    fn add(&mut self, r: Result<(), ConnectError>) {
        let n = match r {
            Ok(()) => &mut self.ok,
            Err(ConnectError::TimedOut) => &mut self.timed_out,
            Err(ConnectError::Refused) => &mut self.refused,
            Err(ConnectError::Unreachable) => &mut self.unreachable,
            Err(ConnectError::Other) => &mut self.other,
        };
        *n += 1;
    }
}

/// One MAC that claimed an IP (or that the neighbour table held for it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MacSeen {
    pub mac: [u8; 6],
    pub replies: u64,
    pub gratuitous: u64,
    pub leaks: u64,
    /// Rounds in which this MAC replied.
    pub answered: u64,
    /// First and last frame, since the start; `None` for a MAC known only
    /// from the neighbour table (a stale entry nobody answers for).
    pub first: Option<Duration>,
    pub last: Option<Duration>,
    pub connect: ConnectStats,
    last_claim_round: u64,
    last_reply_round: u64,
}

impl MacSeen {
    fn new(mac: [u8; 6]) -> Self {
        MacSeen {
            mac,
            replies: 0,
            gratuitous: 0,
            leaks: 0,
            answered: 0,
            first: None,
            last: None,
            connect: ConnectStats::default(),
            last_claim_round: u64::MAX,
            last_reply_round: u64::MAX,
        }
    }

    /// Frames from this MAC that claim the IP.
    pub fn claims(&self) -> u64 {
        self.replies + self.gratuitous + self.leaks
    }
}

/// What the probe concluded about one IP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    NoResponder,
    OneResponder,
    /// Several MACs claimed the IP within one round: an ARP race.
    Conflict,
    /// Several MACs, never within one round: the IP moved (a failover, or a
    /// stale announcer) during the probe.
    Moved,
}

/// Everything known about one probed IP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub ip: Ipv4Addr,
    pub requests: u64,
    pub send_errors: u64,
    /// Rounds in which at least one reply came.
    pub answered: u64,
    /// Rounds in which two or more MACs claimed the IP.
    pub several: u64,
    pub replies: u64,
    pub gratuitous: u64,
    pub leaks: u64,
    /// In first-seen order, at most [`MAX_MACS`].
    pub macs: Vec<MacSeen>,
    /// Frames from MACs past [`MAX_MACS`].
    pub unlisted_frames: u64,
    /// Connects while the neighbour table held no MAC for the IP.
    pub unresolved: ConnectStats,
    round: u64,
    round_macs: u8,
    round_answered: bool,
    pin_next: usize,
}

impl Target {
    fn new(ip: Ipv4Addr) -> Self {
        Target {
            ip,
            requests: 0,
            send_errors: 0,
            answered: 0,
            several: 0,
            replies: 0,
            gratuitous: 0,
            leaks: 0,
            macs: Vec::new(),
            unlisted_frames: 0,
            unresolved: ConnectStats::default(),
            round: u64::MAX,
            round_macs: 0,
            round_answered: false,
            pin_next: 0,
        }
    }

    /// MACs that claimed the IP on the wire.
    pub fn responders(&self) -> impl Iterator<Item = &MacSeen> {
        self.macs.iter().filter(|m| m.claims() > 0)
    }

    pub fn verdict(&self) -> Verdict {
        match self.responders().count() {
            0 if self.unlisted_frames == 0 => Verdict::NoResponder,
            1 if self.unlisted_frames == 0 => Verdict::OneResponder,
            _ if self.several > 0 || self.unlisted_frames > 0 => Verdict::Conflict,
            _ => Verdict::Moved,
        }
    }

    /// Connects that failed, whichever MAC they went to.
    pub fn connect_failures(&self) -> u64 {
        self.unresolved.failed() + self.macs.iter().map(|m| m.connect.failed()).sum::<u64>()
    }

    /// One responder and no failed connect.
    pub fn ok(&self) -> bool {
        self.verdict() == Verdict::OneResponder && self.connect_failures() == 0
    }

    /// The entry for `mac`, made if there is room.
    fn mac_entry(&mut self, mac: [u8; 6]) -> Option<&mut MacSeen> {
        let at = match self.macs.iter().position(|m| m.mac == mac) {
            Some(at) => at,
            None if self.macs.len() < MAX_MACS => {
                self.macs.push(MacSeen::new(mac));
                self.macs.len() - 1
            }
            None => return None,
        };
        self.macs.get_mut(at)
    }
}

/// A MAC seen claiming an IP for the first time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewResponder {
    pub ip: Ipv4Addr,
    pub mac: [u8; 6],
    pub at: Duration,
    /// Responders for the IP now, this one included.
    pub responders: usize,
}

/// The probe's state; see the module documentation.
#[derive(Debug)]
pub struct Prober {
    mac: [u8; 6],
    source: Ipv4Addr,
    targets: Vec<Target>,
    index: HashMap<Ipv4Addr, usize>,
    round: u64,
    /// ARP frames that did not parse (truncated, not Ethernet/IPv4...).
    pub malformed: u64,
    /// ARP frames about IPs not probed.
    pub unrelated: u64,
}

impl Prober {
    /// A probe of `ips` (duplicates dropped) from `mac`, asking as `source`
    /// (0.0.0.0: an RFC 5227 ARP probe). `None` past [`MAX_IPS`].
    pub fn new(ips: &[Ipv4Addr], mac: [u8; 6], source: Ipv4Addr) -> Option<Self> {
        let mut p = Prober {
            mac,
            source,
            targets: Vec::new(),
            index: HashMap::new(),
            round: 0,
            malformed: 0,
            unrelated: 0,
        };
        for ip in ips {
            if !p.index.contains_key(ip) {
                if p.targets.len() == MAX_IPS {
                    return None;
                }
                p.index.insert(*ip, p.targets.len());
                p.targets.push(Target::new(*ip));
            }
        }
        Some(p)
    }

    pub fn targets(&self) -> &[Target] {
        &self.targets
    }

    pub fn rounds(&self) -> u64 {
        self.round
    }

    /// Start the next round; frames from now on count for it.
    pub fn next_round(&mut self) {
        self.round += 1;
    }

    /// The broadcast request for target `i`.
    pub fn request(&self, i: usize) -> ([u8; FRAME_BUF], usize) {
        let mut buf = [0; FRAME_BUF];
        let tpa = self.targets.get(i).map_or(0, |t| u32::from(t.ip));
        let eth = Ethernet {
            dst: BROADCAST,
            src: self.mac,
            tags: &[],
        };
        let arp = ArpPacket::request(self.mac, u32::from(self.source), tpa);
        // Without tags the frame always fits; 0 bytes would be sent otherwise.
        let n = write_arp(&mut buf, &eth, &arp).unwrap_or(0);
        (buf, n)
    }

    /// Whether the request for target `i` went out.
    pub fn sent(&mut self, i: usize, ok: bool) {
        if let Some(t) = self.targets.get_mut(i) {
            if ok {
                t.requests += 1;
            } else {
                t.send_errors += 1;
            }
        }
    }

    /// A frame received `at` after the start. Returns the responder when it
    /// is the first claim of its MAC for the IP.
    pub fn on_frame(&mut self, at: Duration, frame: &[u8]) -> Option<NewResponder> {
        let ethertype = u16::from_be_bytes([*frame.get(12)?, *frame.get(13)?]);
        let arp = match parse(frame, ethertype) {
            Parsed::Arp(a) => a,
            Parsed::Malformed => {
                self.malformed += 1;
                return None;
            }
            Parsed::Other | Parsed::Nd(_) | Parsed::NdMalformed | Parsed::Ipv6Unfollowed => {
                return None
            }
        };
        let kind = classify(&arp)?;
        if arp.sha == self.mac {
            return None; // our own requests, looped back
        }
        let Some(&i) = self.index.get(&Ipv4Addr::from(arp.spa)) else {
            self.unrelated += 1;
            return None;
        };
        let round = self.round;
        let t = self.targets.get_mut(i)?;
        if t.round != round {
            (t.round, t.round_macs, t.round_answered) = (round, 0, false);
        }
        match kind {
            Kind::Reply => t.replies += 1,
            Kind::Gratuitous => t.gratuitous += 1,
            Kind::AnnounceLeak => t.leaks += 1,
            // classify() names ARP kinds only.
            Kind::NaSolicited | Kind::NaUnsolicited | Kind::NsLeak => {}
        }
        if kind == Kind::Reply && !t.round_answered && round > 0 {
            t.round_answered = true;
            t.answered += 1;
        }
        let (ip, mut new_mac) = (t.ip, false);
        let Some(m) = t.mac_entry(arp.sha) else {
            t.unlisted_frames += 1;
            return None;
        };
        new_mac |= m.claims() == 0;
        match kind {
            Kind::Reply => m.replies += 1,
            Kind::Gratuitous => m.gratuitous += 1,
            Kind::AnnounceLeak => m.leaks += 1,
            Kind::NaSolicited | Kind::NaUnsolicited | Kind::NsLeak => {}
        }
        m.first.get_or_insert(at);
        m.last = Some(at);
        let first_claim_this_round = m.last_claim_round != round;
        m.last_claim_round = round;
        if kind == Kind::Reply && m.last_reply_round != round {
            m.last_reply_round = round;
            m.answered += u64::from(round > 0);
        }
        if first_claim_this_round {
            t.round_macs = t.round_macs.saturating_add(1);
            if t.round_macs == 2 {
                t.several += 1;
            }
        }
        new_mac.then(|| NewResponder {
            ip,
            mac: arp.sha,
            at,
            responders: t.responders().count(),
        })
    }

    /// The MAC to pin for target `i`'s next connect: the responders in turn.
    pub fn pin_candidate(&mut self, i: usize) -> Option<[u8; 6]> {
        let t = self.targets.get_mut(i)?;
        let macs: Vec<[u8; 6]> = t.responders().map(|m| m.mac).collect();
        let mac = *macs.get(t.pin_next % macs.len().max(1))?;
        t.pin_next = t.pin_next.wrapping_add(1);
        Some(mac)
    }

    /// A connect to target `i` while the neighbour table held `mac`.
    pub fn on_connect(&mut self, i: usize, mac: Option<[u8; 6]>, r: Result<(), ConnectError>) {
        let Some(t) = self.targets.get_mut(i) else {
            return;
        };
        match mac.and_then(|m| t.mac_entry(m)) {
            Some(m) => m.connect.add(r),
            None => t.unresolved.add(r),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use guard_common::build::ETH_ZLEN;

    const ME: [u8; 6] = [2, 0, 0, 0, 0, 1];
    const SRC: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);
    const LB: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 100);
    const A: [u8; 6] = [2, 0, 0, 0, 0, 0xa];
    const B: [u8; 6] = [2, 0, 0, 0, 0, 0xb];

    fn frame(eth_src: [u8; 6], arp: ArpPacket) -> Vec<u8> {
        let mut buf = [0; FRAME_BUF];
        let eth = Ethernet {
            dst: ME,
            src: eth_src,
            tags: &[],
        };
        let n = write_arp(&mut buf, &eth, &arp).unwrap();
        buf[..n].to_vec()
    }

    /// `mac` answers our request for `ip`.
    fn reply(mac: [u8; 6], ip: Ipv4Addr) -> Vec<u8> {
        frame(mac, ArpPacket::reply(mac, ip.into(), ME, SRC.into()))
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// `rounds` rounds of 100 ms; in each, `who(round)` answer for LB.
    fn run(rounds: u64, who: impl Fn(u64) -> Vec<[u8; 6]>) -> Prober {
        let mut p = Prober::new(&[LB], ME, SRC).unwrap();
        for r in 0..rounds {
            p.next_round();
            p.sent(0, true);
            for (k, mac) in who(r).into_iter().enumerate() {
                p.on_frame(ms(r * 100 + 1 + k as u64), &reply(mac, LB));
            }
        }
        p
    }

    #[test]
    fn the_request_is_a_broadcast_who_has() {
        let p = Prober::new(&[LB], ME, SRC).unwrap();
        let (buf, n) = p.request(0);
        assert_eq!(n, ETH_ZLEN);
        assert_eq!(
            &buf[..12],
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 2, 0, 0, 0, 0, 1]
        );
        let Parsed::Arp(a) = parse(&buf[..n], 0x0806) else {
            panic!("not ARP")
        };
        assert_eq!((a.op, a.sha, a.tha), (1, ME, [0; 6]));
        assert_eq!((Ipv4Addr::from(a.spa), Ipv4Addr::from(a.tpa)), (SRC, LB));
    }

    #[test]
    fn no_responder() {
        let p = run(5, |_| vec![]);
        let t = &p.targets()[0];
        assert_eq!((t.requests, t.answered, t.replies), (5, 0, 0));
        assert_eq!(t.verdict(), Verdict::NoResponder);
        assert!(!t.ok());
    }

    #[test]
    fn one_responder() {
        let p = run(5, |_| vec![A]);
        let t = &p.targets()[0];
        assert_eq!((t.requests, t.answered, t.replies, t.several), (5, 5, 5, 0));
        assert_eq!(t.verdict(), Verdict::OneResponder);
        assert!(t.ok());
        let m = &t.macs[0];
        assert_eq!((m.mac, m.replies, m.answered), (A, 5, 5));
        assert_eq!((m.first, m.last), (Some(ms(1)), Some(ms(401))));
    }

    #[test]
    fn two_responders_in_one_round_are_a_conflict() {
        // B answers every other round only: a race is still a race.
        let p = run(6, |r| if r % 2 == 0 { vec![A, B] } else { vec![A] });
        let t = &p.targets()[0];
        assert_eq!(t.verdict(), Verdict::Conflict);
        assert_eq!((t.answered, t.several, t.replies), (6, 3, 9));
        assert_eq!(
            t.macs.iter().map(|m| m.answered).collect::<Vec<_>>(),
            [6, 3]
        );
    }

    #[test]
    fn a_mac_that_changes_mid_run_has_moved() {
        let p = run(10, |r| vec![if r < 4 { A } else { B }]);
        let t = &p.targets()[0];
        assert_eq!(t.verdict(), Verdict::Moved);
        assert_eq!(t.several, 0);
        assert_eq!(
            (t.macs[0].last, t.macs[1].first),
            (Some(ms(301)), Some(ms(401)))
        );
    }

    #[test]
    fn new_responders_are_reported_once() {
        let mut p = Prober::new(&[LB], ME, SRC).unwrap();
        p.next_round();
        let first = p.on_frame(ms(3), &reply(A, LB)).unwrap();
        assert_eq!(
            (first.ip, first.mac, first.at, first.responders),
            (LB, A, ms(3), 1)
        );
        assert_eq!(p.on_frame(ms(4), &reply(A, LB)), None);
        assert_eq!(p.on_frame(ms(5), &reply(B, LB)).unwrap().responders, 2);
    }

    #[test]
    fn gratuitous_arp_and_leaks_claim_the_ip_too() {
        let mut p = Prober::new(&[LB], ME, SRC).unwrap();
        p.next_round();
        p.on_frame(ms(1), &reply(A, LB));
        let garp = frame(B, ArpPacket::gratuitous(1, B, LB.into()));
        let leak = frame(B, ArpPacket::request(B, LB.into(), SRC.into()));
        p.on_frame(ms(2), &garp);
        p.on_frame(ms(3), &leak);
        let t = &p.targets()[0];
        assert_eq!((t.replies, t.gratuitous, t.leaks, t.answered), (1, 1, 1, 1));
        assert_eq!(
            (t.macs[1].gratuitous, t.macs[1].leaks, t.macs[1].answered),
            (1, 1, 0)
        );
        assert_eq!(t.verdict(), Verdict::Conflict);
    }

    #[test]
    fn other_ips_garbage_and_our_own_frames_are_ignored() {
        let mut p = Prober::new(&[LB], ME, SRC).unwrap();
        p.next_round();
        p.on_frame(ms(1), &reply(A, Ipv4Addr::new(198, 51, 100, 7)));
        let mut bad = reply(A, LB);
        bad[15] = 6; // ptype 0x0806: not IPv4
        p.on_frame(ms(1), &bad);
        let mut op3 = reply(A, LB);
        op3[21] = 3;
        p.on_frame(ms(1), &op3);
        p.on_frame(ms(1), &reply(A, LB)[..30]); // truncated
        let mut ipv4 = reply(A, LB);
        ipv4[12..14].copy_from_slice(&[8, 0]);
        p.on_frame(ms(1), &ipv4);
        let (own, n) = p.request(0);
        p.on_frame(ms(1), &own[..n]);
        for len in 0..14 {
            p.on_frame(ms(1), &reply(A, LB)[..len]);
        }
        let t = &p.targets()[0];
        assert_eq!((t.replies, t.macs.len()), (0, 0));
        assert_eq!((p.unrelated, p.malformed), (1, 3));
        assert_eq!(t.verdict(), Verdict::NoResponder);
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut p = Prober::new(&[LB], ME, SRC).unwrap();
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let mut f = reply(A, LB);
            let len = (x % 70) as usize;
            f.resize(len, (x >> 8) as u8);
            if let Some(b) = f.get_mut((x >> 16) as usize % 64) {
                *b = (x >> 24) as u8;
            }
            p.on_frame(ms(1), &f);
        }
        assert!(p.targets()[0].macs.len() <= MAX_MACS);
    }

    #[test]
    fn ips_are_bounded_and_deduplicated() {
        let ips: Vec<Ipv4Addr> = (0..MAX_IPS as u32)
            .map(|i| Ipv4Addr::from(0xc633_6400 + i))
            .collect();
        let p = Prober::new(&[ips.clone(), ips.clone()].concat(), ME, SRC).unwrap();
        assert_eq!(p.targets().len(), MAX_IPS);
        let mut more = ips;
        more.push(Ipv4Addr::new(203, 0, 113, 1));
        assert!(Prober::new(&more, ME, SRC).is_none());
    }

    #[test]
    fn a_flood_of_macs_is_bounded_and_a_conflict() {
        let mut p = Prober::new(&[LB], ME, SRC).unwrap();
        p.next_round();
        for i in 0..5_000u32 {
            let b = i.to_be_bytes();
            p.on_frame(ms(1), &reply([2, 1, b[0], b[1], b[2], b[3]], LB));
        }
        let t = &p.targets()[0];
        assert_eq!(t.macs.len(), MAX_MACS);
        assert_eq!(t.unlisted_frames, 5_000 - MAX_MACS as u64);
        assert_eq!((t.replies, t.answered), (5_000, 1));
        assert_eq!(t.verdict(), Verdict::Conflict);
    }

    #[test]
    fn connects_go_to_the_mac_the_neighbour_table_held() {
        let mut p = run(2, |_| vec![A, B]);
        let pins: Vec<_> = (0..5).map(|_| p.pin_candidate(0).unwrap()).collect();
        assert_eq!(pins, [A, B, A, B, A], "each responder in turn");
        p.on_connect(0, Some(A), Ok(()));
        p.on_connect(0, Some(B), Err(ConnectError::TimedOut));
        p.on_connect(0, Some(B), Err(ConnectError::Refused));
        // A stale entry: a MAC that never answered.
        let stale = [2, 0, 0, 0, 0, 0x5];
        p.on_connect(0, Some(stale), Err(ConnectError::TimedOut));
        p.on_connect(0, None, Err(ConnectError::Unreachable));
        let t = &p.targets()[0];
        assert_eq!(
            t.macs[0].connect,
            ConnectStats {
                ok: 1,
                ..Default::default()
            }
        );
        assert_eq!(
            (t.macs[1].connect.timed_out, t.macs[1].connect.refused),
            (1, 1)
        );
        assert_eq!(
            (t.macs[2].mac, t.macs[2].claims(), t.macs[2].first),
            (stale, 0, None)
        );
        assert_eq!(t.unresolved.unreachable, 1);
        assert_eq!(t.connect_failures(), 4);
        assert_eq!(t.responders().count(), 2, "the stale MAC is no responder");
        let none = Prober::new(&[LB], ME, SRC).unwrap().pin_candidate(0);
        assert_eq!(none, None, "nothing to pin before anyone answered");
    }

    #[test]
    fn one_responder_with_a_failed_connect_is_not_ok() {
        let mut p = run(1, |_| vec![A]);
        p.on_connect(0, Some(A), Err(ConnectError::TimedOut));
        assert_eq!(p.targets()[0].verdict(), Verdict::OneResponder);
        assert!(!p.targets()[0].ok());
    }
}
