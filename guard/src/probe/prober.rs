//! The probe's bookkeeping, pure: it writes the requests and reads what comes
//! back, given the time; it never touches a socket or a clock (`run.rs` does),
//! so every case is a unit test.
//!
//! Per IP: requests sent, rounds answered, every frame that claims the IP per
//! sender MAC with first and last time, and the TCP connects attributed to
//! the MAC the host's neighbour table held. A claim is what the guard calls
//! one: for IPv4 an ARP reply, gratuitous ARP or announce leak (by the ARP
//! sender MAC); for IPv6 a solicited or unsolicited Neighbor Advertisement
//! about the IP, or a Neighbor Solicitation from it with a source link-layer
//! option (by the Ethernet source, as the census counts them). Both are
//! counted in the same three columns (replies, gratuitous, leaks), so the
//! verdicts are the same. Memory is bounded: at most [`MAX_IPS`] IPs and
//! [`MAX_MACS`] MACs per IP (frames from further MACs are only counted); each
//! frame costs one hash lookup and a scan of at most [`MAX_MACS`] entries.

use std::{
    collections::HashMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    time::Duration,
};

use guard_common::{classify, classify_nd, frame::Parsed, parse::parse, Kind, NdClass};

use crate::model::probing::request_frame;
pub use crate::model::probing::REQUEST_BUF;

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

/// What `arp-guard probe` concluded about one IP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeVerdict {
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
    pub ip: IpAddr,
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
    fn new(ip: IpAddr) -> Self {
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

    pub fn verdict(&self) -> ProbeVerdict {
        match self.responders().count() {
            0 if self.unlisted_frames == 0 => ProbeVerdict::NoResponder,
            1 if self.unlisted_frames == 0 => ProbeVerdict::OneResponder,
            _ if self.several > 0 || self.unlisted_frames > 0 => ProbeVerdict::Conflict,
            _ => ProbeVerdict::Moved,
        }
    }

    /// Connects that failed, whichever MAC they went to.
    pub fn connect_failures(&self) -> u64 {
        self.unresolved.failed() + self.macs.iter().map(|m| m.connect.failed()).sum::<u64>()
    }

    /// One responder and no failed connect.
    pub fn ok(&self) -> bool {
        self.verdict() == ProbeVerdict::OneResponder && self.connect_failures() == 0
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

    /// Count `c`, a claim of this IP in `round` received `at`.
    fn record(&mut self, round: u64, at: Duration, c: &HeardClaim) -> Option<NewResponder> {
        if self.round != round {
            (self.round, self.round_macs, self.round_answered) = (round, 0, false);
        }
        let column = Column::of(c.kind);
        match column {
            Column::Reply => self.replies += 1,
            Column::Gratuitous => self.gratuitous += 1,
            Column::Leak => self.leaks += 1,
        }
        if column == Column::Reply && !self.round_answered && round > 0 {
            self.round_answered = true;
            self.answered += 1;
        }
        let ip = self.ip;
        let Some(m) = self.mac_entry(c.mac) else {
            self.unlisted_frames += 1;
            return None;
        };
        let new_mac = m.claims() == 0;
        match column {
            Column::Reply => m.replies += 1,
            Column::Gratuitous => m.gratuitous += 1,
            Column::Leak => m.leaks += 1,
        }
        m.first.get_or_insert(at);
        m.last = Some(at);
        let first_claim_this_round = m.last_claim_round != round;
        m.last_claim_round = round;
        if column == Column::Reply && m.last_reply_round != round {
            m.last_reply_round = round;
            m.answered += u64::from(round > 0);
        }
        if first_claim_this_round {
            self.round_macs = self.round_macs.saturating_add(1);
            if self.round_macs == 2 {
                self.several += 1;
            }
        }
        new_mac.then(|| NewResponder {
            ip,
            mac: c.mac,
            at,
            responders: self.responders().count(),
        })
    }
}

/// The column a claim is counted in, for both families.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Column {
    Reply,
    Gratuitous,
    Leak,
}

impl Column {
    fn of(kind: Kind) -> Self {
        match kind {
            Kind::Reply | Kind::NaSolicited => Column::Reply,
            Kind::Gratuitous | Kind::NaUnsolicited => Column::Gratuitous,
            Kind::AnnounceLeak | Kind::NsLeak => Column::Leak,
        }
    }
}

/// A MAC seen claiming an IP for the first time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewResponder {
    pub ip: IpAddr,
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
    source6: Ipv6Addr,
    targets: Vec<Target>,
    index: HashMap<IpAddr, usize>,
    round: u64,
    /// ARP or NDP frames that did not parse (truncated, not Ethernet/IPv4,
    /// NDP its receiver would discard...).
    pub malformed: u64,
    /// Claims about IPs not probed.
    pub unrelated: u64,
}

/// What one frame says, if it claims an address.
struct HeardClaim {
    ip: IpAddr,
    mac: [u8; 6],
    /// Counted as a reply (ARP reply, solicited NA), a gratuitous
    /// announcement (gratuitous ARP, unsolicited NA) or a leak (announce
    /// leak, NS from the IP with a source link-layer option).
    kind: Kind,
}

impl Prober {
    /// A probe of `ips` (duplicates dropped) from `mac`, asking ARP as
    /// `source` (0.0.0.0: an RFC 5227 ARP probe) and NDP as `source6`.
    /// `None` past [`MAX_IPS`].
    pub fn new(ips: &[IpAddr], mac: [u8; 6], source: Ipv4Addr, source6: Ipv6Addr) -> Option<Self> {
        let mut p = Prober {
            mac,
            source,
            source6,
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

    /// The request for target `i`: a broadcast ARP request for an IPv4
    /// target; for an IPv6 one a Neighbor Solicitation to the target's
    /// solicited-node group (and its multicast MAC), hop limit 255, with a
    /// source link-layer option, as the kernel sends one.
    pub fn request(&self, i: usize) -> ([u8; REQUEST_BUF], usize) {
        match self.targets.get(i) {
            Some(t) => request_frame(self.mac, self.source, self.source6, t.ip),
            None => ([0; REQUEST_BUF], 0),
        }
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

    /// The claim `frame` makes, classified as the guard does; malformed
    /// ARP and NDP counted.
    fn heard_claim(&mut self, frame: &[u8]) -> Option<HeardClaim> {
        let ethertype = u16::from_be_bytes([*frame.get(12)?, *frame.get(13)?]);
        match parse(frame, ethertype) {
            Parsed::Arp(arp) => Some(HeardClaim {
                ip: Ipv4Addr::from(arp.spa).into(),
                mac: arp.sha,
                kind: classify(&arp)?,
            }),
            Parsed::Nd(nd) => {
                // A DAD solicitation (from ::) claims nothing.
                let ip = Ipv6Addr::from(nd.claimed()?).into();
                match classify_nd(frame, &nd) {
                    NdClass::Announces(kind) => Some(HeardClaim {
                        ip,
                        mac: nd.eth_src,
                        kind,
                    }),
                    NdClass::Nothing => None,
                    NdClass::Malformed => {
                        self.malformed += 1;
                        None
                    }
                }
            }
            // A chain of extension headers longer than the parser follows
            // (Ipv6Unfollowed) is not NDP we can read: counted with the
            // malformed, as it cannot be attributed.
            Parsed::Malformed | Parsed::NdMalformed | Parsed::Ipv6Unfollowed => {
                self.malformed += 1;
                None
            }
            Parsed::Other => None,
        }
    }

    /// A frame received `at` after the start. Returns the responder when it
    /// is the first claim of its MAC for the IP.
    pub fn on_frame(&mut self, at: Duration, frame: &[u8]) -> Option<NewResponder> {
        let claim = self.heard_claim(frame)?;
        if claim.mac == self.mac {
            return None; // our own requests, looped back
        }
        let Some(&i) = self.index.get(&claim.ip) else {
            self.unrelated += 1;
            return None;
        };
        let round = self.round;
        self.targets.get_mut(i)?.record(round, at, &claim)
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
    use guard_common::{
        build::{write_arp, ArpPacket, Ethernet, FRAME_BUF},
        ndp_build::{write_nd, NdSpec, ND_FRAME_BUF},
    };

    const ME: [u8; 6] = [2, 0, 0, 0, 0, 1];
    const SRC: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);
    const SRC6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);
    const LB: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 100);
    const LB6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 0x100);
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

    fn prober(ips: &[IpAddr]) -> Prober {
        Prober::new(ips, ME, SRC, SRC6).unwrap()
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// `rounds` rounds of 100 ms; in each, `who(round)` answer for LB.
    fn run(rounds: u64, who: impl Fn(u64) -> Vec<[u8; 6]>) -> Prober {
        let mut p = prober(&[LB.into()]);
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
        let p = prober(&[LB.into()]);
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
        assert_eq!(t.verdict(), ProbeVerdict::NoResponder);
        assert!(!t.ok());
    }

    #[test]
    fn one_responder() {
        let p = run(5, |_| vec![A]);
        let t = &p.targets()[0];
        assert_eq!((t.requests, t.answered, t.replies, t.several), (5, 5, 5, 0));
        assert_eq!(t.verdict(), ProbeVerdict::OneResponder);
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
        assert_eq!(t.verdict(), ProbeVerdict::Conflict);
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
        assert_eq!(t.verdict(), ProbeVerdict::Moved);
        assert_eq!(t.several, 0);
        assert_eq!(
            (t.macs[0].last, t.macs[1].first),
            (Some(ms(301)), Some(ms(401)))
        );
    }

    #[test]
    fn new_responders_are_reported_once() {
        let mut p = prober(&[LB.into()]);
        p.next_round();
        let first = p.on_frame(ms(3), &reply(A, LB)).unwrap();
        assert_eq!(
            (first.ip, first.mac, first.at, first.responders),
            (LB.into(), A, ms(3), 1)
        );
        assert_eq!(p.on_frame(ms(4), &reply(A, LB)), None);
        assert_eq!(p.on_frame(ms(5), &reply(B, LB)).unwrap().responders, 2);
    }

    #[test]
    fn gratuitous_arp_and_leaks_claim_the_ip_too() {
        let mut p = prober(&[LB.into()]);
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
        assert_eq!(t.verdict(), ProbeVerdict::Conflict);
    }

    #[test]
    fn other_ips_garbage_and_our_own_frames_are_ignored() {
        let mut p = prober(&[LB.into()]);
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
        assert_eq!(t.verdict(), ProbeVerdict::NoResponder);
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut p = prober(&[LB.into()]);
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
        // Both families count against one bound.
        let ips: Vec<IpAddr> = (0..MAX_IPS as u32 / 2)
            .flat_map(|i| {
                let v6 = u128::from(LB6) + u128::from(i);
                [
                    Ipv4Addr::from(0xc633_6400 + i).into(),
                    Ipv6Addr::from(v6).into(),
                ]
            })
            .collect();
        let p = prober(&[ips.clone(), ips.clone()].concat());
        assert_eq!(p.targets().len(), MAX_IPS);
        let mut more = ips;
        more.push(Ipv4Addr::new(203, 0, 113, 1).into());
        assert!(Prober::new(&more, ME, SRC, SRC6).is_none());
    }

    #[test]
    fn a_flood_of_macs_is_bounded_and_a_conflict() {
        let mut p = prober(&[LB.into()]);
        p.next_round();
        for i in 0..5_000u32 {
            let b = i.to_be_bytes();
            p.on_frame(ms(1), &reply([2, 1, b[0], b[1], b[2], b[3]], LB));
        }
        let t = &p.targets()[0];
        assert_eq!(t.macs.len(), MAX_MACS);
        assert_eq!(t.unlisted_frames, 5_000 - MAX_MACS as u64);
        assert_eq!((t.replies, t.answered), (5_000, 1));
        assert_eq!(t.verdict(), ProbeVerdict::Conflict);
    }

    /// An NDP frame from `mac` built as `spec` says.
    fn nd(spec: &NdSpec) -> Vec<u8> {
        let mut buf = [0; ND_FRAME_BUF];
        let n = write_nd(&mut buf, spec);
        buf[..n].to_vec()
    }

    /// `mac` answers our solicitation for LB6: a solicited NA to us.
    fn na(mac: [u8; 6]) -> Vec<u8> {
        let flags = guard_common::ndp::NA_FLAG_SOLICITED | guard_common::ndp::NA_FLAG_OVERRIDE;
        nd(&NdSpec::advert(mac, LB6.octets(), ME, SRC6.octets(), flags))
    }

    #[test]
    fn the_ipv6_request_is_a_solicitation_to_the_solicited_node_group() {
        let p = prober(&[LB.into(), LB6.into()]);
        let (buf, n) = p.request(1);
        // 33:33:ff + the target's last 24 bits, from our MAC.
        assert_eq!(&buf[..12], &[0x33, 0x33, 0xff, 0, 1, 0, 2, 0, 0, 0, 0, 1]);
        let Parsed::Nd(ns) = parse(&buf[..n], 0x86dd) else {
            panic!("not NDP: {:?}", parse(&buf[..n], 0x86dd))
        };
        assert!(!ns.is_advert());
        assert_eq!(Ipv6Addr::from(ns.target), LB6);
        assert_eq!(Ipv6Addr::from(ns.src), SRC6);
        assert_eq!(
            Ipv6Addr::from(ns.dst),
            "ff02::1:ff00:100".parse::<Ipv6Addr>().unwrap()
        );
        // Hop limit 255 (the parser checks it) and our link-layer address.
        assert_eq!(buf[14 + 7], 255);
        let opt = ns.opts_offset;
        assert_eq!(&buf[opt..opt + 8], &[1, 1, 2, 0, 0, 0, 0, 1]);
        // The IPv4 target is still asked with ARP.
        assert_eq!(p.request(0).1, ETH_ZLEN);
    }

    #[test]
    fn advertisements_and_solicitations_claim_an_ipv6_address() {
        let mut p = prober(&[LB.into(), LB6.into()]);
        p.next_round();
        let first = p.on_frame(ms(1), &na(A)).unwrap();
        assert_eq!((first.ip, first.mac), (LB6.into(), A));
        p.on_frame(ms(2), &reply(A, LB));
        // B: an unsolicited override NA, then resolving someone from LB6.
        p.on_frame(ms(3), &nd(&NdSpec::unsolicited(B, LB6.octets())));
        let peer = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 7).octets();
        p.on_frame(ms(4), &nd(&NdSpec::solicit(B, LB6.octets(), peer)));
        let t = &p.targets()[1];
        assert_eq!((t.replies, t.gratuitous, t.leaks, t.answered), (1, 1, 1, 1));
        assert_eq!(t.verdict(), ProbeVerdict::Conflict);
        assert_eq!((t.macs[1].mac, t.macs[1].claims()), (B, 2));
        assert_eq!(
            p.targets()[0].verdict(),
            ProbeVerdict::OneResponder,
            "IPv4 apart"
        );
        let mut next = p;
        next.next_round();
        next.on_frame(ms(101), &na(A));
        assert_eq!(next.targets()[1].answered, 2);
    }

    #[test]
    fn ndp_that_claims_nothing_is_not_a_responder() {
        let mut p = prober(&[LB6.into()]);
        p.next_round();
        let peer = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 7).octets();
        // DAD (from ::), an NS from LB6 without a link-layer option, someone
        // else asking for LB6, our own solicitation, another address's NA.
        let dad = NdSpec {
            src: [0; 16],
            sll: false,
            ..NdSpec::solicit(A, [0; 16], LB6.octets())
        };
        let bare = NdSpec {
            sll: false,
            ..NdSpec::solicit(A, LB6.octets(), peer)
        };
        let (own, n) = p.request(0);
        for f in [
            nd(&dad),
            nd(&bare),
            nd(&NdSpec::solicit(A, peer, LB6.octets())),
            own[..n].to_vec(),
            nd(&NdSpec::unsolicited(A, peer)),
        ] {
            p.on_frame(ms(1), &f);
        }
        // What its receiver discards: hop limit 64, a zero-length option.
        let mut hop = na(A);
        hop[14 + 7] = 64;
        p.on_frame(ms(1), &hop);
        let mut zero = nd(&NdSpec::solicit(B, LB6.octets(), peer));
        zero[14 + 40 + 24 + 1] = 0;
        p.on_frame(ms(1), &zero);
        let t = &p.targets()[0];
        assert_eq!((t.macs.len(), t.verdict()), (0, ProbeVerdict::NoResponder));
        assert_eq!((p.unrelated, p.malformed), (2, 2));
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
        let none = prober(&[LB.into()]).pin_candidate(0);
        assert_eq!(none, None, "nothing to pin before anyone answered");
    }

    #[test]
    fn one_responder_with_a_failed_connect_is_not_ok() {
        let mut p = run(1, |_| vec![A]);
        p.on_connect(0, Some(A), Err(ConnectError::TimedOut));
        assert_eq!(p.targets()[0].verdict(), ProbeVerdict::OneResponder);
        assert!(!p.targets()[0].ok());
    }
}
