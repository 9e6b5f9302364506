//! The active census, decided (pure): which LB IPs this node asks about,
//! when, and what the answers mean.
//!
//! The passive census hears broadcast claims only: a reply to a client is
//! unicast, and an owner that stopped answering makes no frame at all. So
//! each guard asks, at a low rate, about LB IPs it does not own; the reply
//! comes back unicast to the asker, whose census records it.
//!
//! - **Sharing.** Each LB IP is asked by [`Pace::askers`] live guards (2),
//!   chosen by rendezvous hashing over the live guards' node names (the
//!   presence records) without the owner: every guard computes the same
//!   choice from the same records, with no coordination, and a guard that
//!   comes or goes moves only its own share.
//! - **Pace.** Each IP is asked every `interval` (jittered, so that the
//!   askers drift apart); the interval stretches so that the whole cluster
//!   sends at most `cluster_max` requests a second (every node computes the
//!   same stretch from the same counts), and each node at most `node_max`.
//!   The broadcast load of the segment is bounded however many IPs or nodes.
//! - **Verdicts**, per IP from the answers to each request: two MACs or more
//!   answering one request is a conflict; no answer from the owner for
//!   `silent_after` requests in a row (nobody, or only a MAC that is not the
//!   owner's) is a silent owner; the owner answering only from a MAC of an
//!   interface its guard does not guard is a wrong interface.
//!
//! The requests can teach nobody anything: an ARP request's sender IP is
//! 0.0.0.0 (an RFC 5227 probe: no neighbour entry is made from it), a
//! Neighbor Solicitation's source is the asker's own link-local address.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv6Addr},
    time::Duration,
};

use guard_common::{
    build::{write_arp, ArpPacket, Ethernet, BROADCAST, FRAME_BUF},
    ndp_build::{write_nd, NdSpec, ND_FRAME_BUF},
};
use serde::{Deserialize, Serialize};

use super::{
    fmt_mac,
    presence::{describe, whose},
};

/// Room for one request: an NS, the longer of the two (an ARP request
/// needs 60 bytes).
pub const REQUEST_BUF: usize = ND_FRAME_BUF;
const _: () = assert!(REQUEST_BUF >= FRAME_BUF);

/// The request asking who has `ip`, from `mac`: a broadcast ARP request
/// with sender IP `source` (0.0.0.0: an RFC 5227 probe) for IPv4; for IPv6 a
/// Neighbor Solicitation from `source6` to the target's solicited-node group
/// (and its multicast MAC), hop limit 255, with a source link-layer option,
/// as the kernel sends one. 0 bytes when it cannot be written.
pub fn request_frame(
    mac: [u8; 6],
    source: std::net::Ipv4Addr,
    source6: Ipv6Addr,
    ip: IpAddr,
) -> ([u8; REQUEST_BUF], usize) {
    let mut buf = [0; REQUEST_BUF];
    let n = match ip {
        IpAddr::V6(ip) => write_nd(
            &mut buf,
            &NdSpec::solicit(mac, source6.octets(), ip.octets()),
        ),
        IpAddr::V4(ip) => {
            let eth = Ethernet {
                dst: BROADCAST,
                src: mac,
                tags: &[],
            };
            let arp = ArpPacket::request(mac, u32::from(source), u32::from(ip));
            let mut frame = [0; FRAME_BUF];
            // Without tags the frame always fits; 0 bytes would be sent otherwise.
            let n = write_arp(&mut frame, &eth, &arp).unwrap_or(0);
            buf[..FRAME_BUF].copy_from_slice(&frame);
            n
        }
    };
    (buf, n)
}

/// How often, by how many, and at most how fast.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pace {
    /// Each IP is asked this often (before any stretch).
    pub interval: Duration,
    /// Live guards asking about each IP.
    pub askers: usize,
    /// Requests a second, this node.
    pub node_max: u32,
    /// Requests a second, the whole cluster (all askers together).
    pub cluster_max: u32,
    /// Requests in a row without the owner's answer that make it silent.
    pub silent_after: u32,
}

impl Pace {
    /// The interval every node uses, given the LB IPs asked cluster-wide
    /// (`ips`, each by `askers` nodes) and this node's share (`mine`):
    /// stretched so that neither the cluster's nor this node's rate is
    /// exceeded.
    pub fn interval_for(&self, ips: usize, mine: usize) -> Duration {
        let per = |n: usize, max: u32| Duration::from_secs_f64(n as f64 / f64::from(max.max(1)));
        self.interval
            .max(per(ips.saturating_mul(self.askers), self.cluster_max))
            .max(per(mine, self.node_max))
    }
}

/// A node's rank for an IP: a stable 64-bit hash of both (FNV-1a, then a
/// finaliser so that close names and IPs land far apart). The same on
/// every node and every version: a change would move every IP's askers.
pub fn score(node: &str, ip: IpAddr) -> u64 {
    hash(node.bytes().chain([0]).chain(ip_bytes(ip)))
}

fn ip_bytes(ip: IpAddr) -> impl Iterator<Item = u8> {
    let (v4, v6) = match ip {
        IpAddr::V4(a) => (Some(a.octets()), None),
        IpAddr::V6(a) => (None, Some(a.octets())),
    };
    v4.into_iter().flatten().chain(v6.into_iter().flatten())
}

fn hash(bytes: impl Iterator<Item = u8>) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    // splitmix64's finaliser.
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// Whether `me` is one of the `k` askers of `ip` among `live` (the live
/// guards' node names), the owner never asking about its own IP. Stops as
/// soon as `k` others rank above `me`: for most IPs (those `me` does not
/// ask) a few comparisons, not one per node.
pub fn asks(me: &str, ip: IpAddr, live: &[String], owner: Option<&str>, k: usize) -> bool {
    if Some(me) == owner || !live.iter().any(|n| n == me) {
        return false;
    }
    let mine = (score(me, ip), me);
    let mut above = 0;
    for n in live {
        if n == me || Some(n.as_str()) == owner {
            continue;
        }
        if (score(n, ip), n.as_str()) > mine {
            above += 1;
            if above >= k {
                return false;
            }
        }
    }
    true
}

/// The askers of `ip`, best first (what every guard computes; for the
/// docs, the tests and `explain`).
#[cfg(any(test, feature = "testing"))]
pub fn askers(ip: IpAddr, live: &[String], owner: Option<&str>, k: usize) -> Vec<String> {
    let mut ranked: Vec<(u64, &String)> = (live.iter())
        .filter(|n| Some(n.as_str()) != owner)
        .map(|n| (score(n, ip), n))
        .collect();
    ranked.sort_by(|a, b| b.cmp(a));
    ranked.into_iter().take(k).map(|(_, n)| n.clone()).collect()
}

/// What the owner's presence record says of its MACs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OwnerMacs {
    /// The MACs of its uplinks (None: no live record; the owner
    /// is whoever answers).
    pub uplinks: Option<BTreeSet<[u8; 6]>>,
    /// Its other interfaces' MACs, by MAC: interface.
    pub other: BTreeMap<[u8; 6], String>,
}

/// What one request found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "answer")]
pub enum Answer {
    /// Nobody answered.
    None,
    /// The owner answered (or, with no record of its MACs, one MAC did).
    Owner,
    /// Only the owner answered, from an interface its guard does not guard.
    WrongInterface { interface: String },
    /// One MAC answered that is not the owner's.
    Other,
    /// Two MACs or more answered the one request.
    Conflict,
}

/// What the answering MACs (not this node's) mean, given the owner's.
pub fn classify(macs: &BTreeSet<[u8; 6]>, owner: &OwnerMacs) -> Answer {
    let mut it = macs.iter();
    let (Some(mac), None) = (it.next(), it.next()) else {
        return if macs.is_empty() {
            Answer::None
        } else {
            Answer::Conflict
        };
    };
    match &owner.uplinks {
        None => Answer::Owner,
        Some(g) if g.contains(mac) => Answer::Owner,
        Some(_) => match owner.other.get(mac) {
            Some(i) => Answer::WrongInterface {
                interface: i.clone(),
            },
            None => Answer::Other,
        },
    }
}

/// Where an IP stands after the active census's latest requests (the
/// daemon's probing; `arp-guard probe`'s is `ProbeVerdict`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProbingVerdict {
    /// Not judged yet (fewer requests than it takes).
    Pending,
    Answered,
    Conflict,
    SilentOwner,
    WrongInterface,
}

impl ProbingVerdict {
    pub const ALL: [ProbingVerdict; 5] = [
        ProbingVerdict::Pending,
        ProbingVerdict::Answered,
        ProbingVerdict::Conflict,
        ProbingVerdict::SilentOwner,
        ProbingVerdict::WrongInterface,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ProbingVerdict::Pending => "pending",
            ProbingVerdict::Answered => "answered",
            ProbingVerdict::Conflict => "conflict",
            ProbingVerdict::SilentOwner => "silent_owner",
            ProbingVerdict::WrongInterface => "wrong_interface",
        }
    }

    /// Worth an operator's attention.
    pub fn bad(self) -> bool {
        matches!(
            self,
            ProbingVerdict::Conflict | ProbingVerdict::SilentOwner | ProbingVerdict::WrongInterface
        )
    }
}

/// One IP asked by this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpProbe {
    /// The owner node the ownership source names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    pub verdict: ProbingVerdict,
    /// Requests judged, and in a row without the owner's answer.
    pub asked: u64,
    pub unanswered_in_a_row: u32,
    /// The latest request's answer and who gave it, in words.
    #[serde(flatten)]
    pub last: Answer,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub answered_by: Vec<String>,
}

/// A verdict that began or ended, for the log, `/events` and Events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub ip: IpAddr,
    pub owner: Option<String>,
    pub from: ProbingVerdict,
    pub to: ProbingVerdict,
    /// The answerers in words, and the requests without the owner's answer.
    pub answered_by: Vec<String>,
    pub unanswered: u32,
    /// The interface the owner answered from (a wrong interface).
    pub interface: Option<String>,
}

/// At most this many answerers are named per IP (a flood of forged MACs
/// cannot make a verdict huge).
pub const MAX_NAMED: usize = 8;

/// The answerers in words: node and interface by presence, or outside.
pub fn in_words(
    macs: &BTreeSet<[u8; 6]>,
    known: &BTreeMap<[u8; 6], (String, String)>,
    presence: bool,
) -> Vec<String> {
    (macs.iter().take(MAX_NAMED))
        .map(|m| {
            if presence {
                describe(&whose(known, m), m)
            } else {
                fmt_mac(m)
            }
        })
        .collect()
}

/// The verdicts of the IPs this node asks about.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tracker {
    pub ips: BTreeMap<IpAddr, IpProbe>,
}

impl Tracker {
    /// Keep only the IPs still asked (an IP given to other askers, owned
    /// here or gone is forgotten, and so is its verdict).
    pub fn retain(&mut self, asked: &BTreeSet<IpAddr>) {
        self.ips.retain(|ip, _| asked.contains(ip));
    }

    /// The answer to one request about `ip` (owned by `owner`); the change
    /// of verdict it makes, if any. A new owner starts the count again.
    pub fn record(
        &mut self,
        ip: IpAddr,
        owner: Option<String>,
        answer: Answer,
        answered_by: Vec<String>,
        silent_after: u32,
    ) -> Option<Change> {
        let e = self.ips.entry(ip).or_insert_with(|| IpProbe {
            owner: owner.clone(),
            verdict: ProbingVerdict::Pending,
            asked: 0,
            unanswered_in_a_row: 0,
            last: Answer::None,
            answered_by: Vec::new(),
        });
        let from = e.verdict;
        if e.owner != owner {
            e.owner = owner.clone();
            e.verdict = ProbingVerdict::Pending;
            e.unanswered_in_a_row = 0;
        }
        e.asked += 1;
        let mut interface = None;
        match &answer {
            Answer::Owner | Answer::Conflict | Answer::WrongInterface { .. } => {
                e.unanswered_in_a_row = 0
            }
            Answer::None | Answer::Other => {
                e.unanswered_in_a_row = e.unanswered_in_a_row.saturating_add(1)
            }
        }
        e.verdict = match &answer {
            Answer::Conflict => ProbingVerdict::Conflict,
            Answer::Owner => ProbingVerdict::Answered,
            Answer::WrongInterface { interface: i } => {
                interface = Some(i.clone());
                ProbingVerdict::WrongInterface
            }
            Answer::None | Answer::Other if e.unanswered_in_a_row >= silent_after.max(1) => {
                ProbingVerdict::SilentOwner
            }
            // Not silent yet: what it was (a conflict seen before is not
            // resolved by a missing answer).
            Answer::None | Answer::Other => e.verdict,
        };
        e.last = answer;
        e.answered_by = answered_by.clone();
        (e.verdict != from).then_some(Change {
            ip,
            owner,
            from,
            to: e.verdict,
            answered_by,
            unanswered: e.unanswered_in_a_row,
            interface,
        })
    }

    /// IPs per verdict (every verdict present, 0 or not).
    pub fn counts(&self) -> BTreeMap<ProbingVerdict, usize> {
        let mut out: BTreeMap<ProbingVerdict, usize> =
            ProbingVerdict::ALL.iter().map(|v| (*v, 0)).collect();
        for p in self.ips.values() {
            *out.entry(p.verdict).or_default() += 1;
        }
        out
    }
}

/// When each asked IP is due, and how many requests may go now.
#[derive(Debug, Clone, Default)]
pub struct Schedule {
    /// IP -> next request (ns on the caller's clock), and the same ordered
    /// by time: taking the due ones costs what is taken, not one look at
    /// every IP per tick.
    at: BTreeMap<IpAddr, u64>,
    queue: BTreeSet<(u64, IpAddr)>,
    /// Requests this node may still send (a bucket refilled at the node's
    /// rate, at most one second's worth).
    tokens: f64,
    last_ns: u64,
}

impl Schedule {
    /// Follow the set of asked IPs: a new one is first asked at a point
    /// spread over one interval (so that a start or a move does not send a
    /// burst), a dropped one is forgotten.
    pub fn follow(&mut self, asked: &BTreeSet<IpAddr>, interval: Duration, now_ns: u64, seed: u64) {
        let queue = &mut self.queue;
        self.at.retain(|ip, t| {
            let keep = asked.contains(ip);
            if !keep {
                queue.remove(&(*t, *ip));
            }
            keep
        });
        let span = interval.as_nanos().max(1) as u64;
        for ip in asked {
            if !self.at.contains_key(ip) {
                self.set(*ip, now_ns + spread(seed, *ip, span));
            }
        }
    }

    fn set(&mut self, ip: IpAddr, t: u64) {
        if let Some(old) = self.at.insert(ip, t) {
            self.queue.remove(&(old, ip));
        }
        self.queue.insert((t, ip));
    }

    /// When the next IP is due and the bucket at `node_max` a second has a
    /// token for it (None: nothing asked).
    pub fn next_due(&self, node_max: u32) -> Option<u64> {
        let (t, _) = self.queue.first()?;
        let rate = f64::from(node_max.max(1));
        let short = (1.0 - self.tokens).max(0.0);
        let token_at = self.last_ns + (short / rate * 1e9) as u64;
        Some((*t).max(token_at))
    }

    /// The IPs due now, at most as many as the bucket allows at `node_max`
    /// a second; each is due again one jittered `interval` later. The most
    /// overdue first, so that a cap that binds delays every IP alike.
    pub fn take(
        &mut self,
        now_ns: u64,
        interval: Duration,
        node_max: u32,
        seed: u64,
    ) -> Vec<IpAddr> {
        let rate = f64::from(node_max.max(1));
        let elapsed = now_ns.saturating_sub(self.last_ns) as f64 / 1e9;
        self.tokens = (self.tokens + elapsed * rate).min(rate);
        self.last_ns = now_ns;
        let span = interval.as_nanos().max(1) as u64;
        let mut out = Vec::new();
        while self.tokens >= 1.0 {
            match self.queue.first() {
                Some((t, ip)) if *t <= now_ns => {
                    let ip = *ip;
                    self.tokens -= 1.0;
                    // +-10 %: the two askers of an IP drift apart, and no
                    // two IPs stay in step for long.
                    let jitter = spread(seed ^ now_ns, ip, span / 5);
                    self.set(ip, now_ns + span - span / 10 + jitter);
                    out.push(ip);
                }
                _ => break,
            }
        }
        out
    }
}

/// A point in `[0, span)` for `ip`, from `seed`.
fn spread(seed: u64, ip: IpAddr, span: u64) -> u64 {
    hash(seed.to_le_bytes().into_iter().chain(ip_bytes(ip))) % span.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("node-{i}")).collect()
    }

    fn ip(i: u32) -> IpAddr {
        IpAddr::V4(std::net::Ipv4Addr::from(0xc633_6400 + i))
    }

    #[test]
    fn each_ip_is_asked_by_exactly_k_live_guards_never_its_owner() {
        let live = nodes(7);
        for i in 0..500 {
            let owner = &live[i as usize % 7];
            let who: Vec<&String> = (live.iter())
                .filter(|n| asks(n, ip(i), &live, Some(owner), 2))
                .collect();
            assert_eq!(who.len(), 2, "ip {i}: {who:?}");
            assert!(!who.contains(&owner));
            let mut expected = askers(ip(i), &live, Some(owner), 2);
            expected.sort();
            let mut got: Vec<String> = who.into_iter().cloned().collect();
            got.sort();
            assert_eq!(got, expected);
        }
    }

    #[test]
    fn the_share_is_even_and_a_leaving_guard_moves_only_its_own() {
        let live = nodes(10);
        let ips: Vec<IpAddr> = (0..3000).map(ip).collect();
        let share =
            |live: &[String], n: &str| ips.iter().filter(|i| asks(n, **i, live, None, 2)).count();
        for n in &live {
            // 3000 x 2 / 10 = 600 each, within a fifth.
            let s = share(&live, n);
            assert!((480..=720).contains(&s), "{n}: {s}");
        }
        let fewer: Vec<String> = live.iter().filter(|n| *n != "node-3").cloned().collect();
        for i in &ips {
            let before = askers(*i, &live, None, 2);
            let after = askers(*i, &fewer, None, 2);
            if !before.contains(&"node-3".to_string()) {
                assert_eq!(before, after, "{i} moved although node-3 did not ask it");
            }
        }
    }

    #[test]
    fn the_rank_is_the_same_on_every_node_and_every_version() {
        // Pinned (computed apart from this code): a change would move the
        // askers of every IP in a cluster running two versions.
        assert_eq!(score("node-a", ip(100)), 6_607_494_431_927_708_381);
        assert_eq!(
            score("node-b", "fd00::100".parse().unwrap()),
            15_400_060_293_550_135_842
        );
    }

    #[test]
    fn a_node_without_a_live_record_asks_nothing() {
        assert!(!asks("node-x", ip(1), &nodes(3), None, 2));
        assert!(!asks("node-0", ip(1), &[], None, 2));
        // Alone: asks what it does not own.
        assert!(asks("node-0", ip(1), &nodes(1), Some("node-9"), 2));
        assert!(!asks("node-0", ip(1), &nodes(1), Some("node-0"), 2));
    }

    #[test]
    fn the_interval_stretches_to_the_caps() {
        let p = Pace {
            interval: Duration::from_secs(30),
            askers: 2,
            node_max: 10,
            cluster_max: 100,
            silent_after: 3,
        };
        assert_eq!(p.interval_for(300, 200), Duration::from_secs(30));
        // 10,000 IPs x 2 askers at 100/s: 200 s.
        assert_eq!(p.interval_for(10_000, 20), Duration::from_secs(200));
        // A node with 3,000 of them at 10/s: 300 s.
        assert_eq!(p.interval_for(10_000, 3_000), Duration::from_secs(300));
    }

    #[test]
    fn answers_are_classified_by_the_owners_record() {
        let (a, b, c) = (
            [2, 0, 0, 0, 0, 0xa],
            [2, 0, 0, 0, 0, 0xb],
            [2, 0, 0, 0, 0, 0xc],
        );
        let owner = OwnerMacs {
            uplinks: Some(BTreeSet::from([a])),
            other: BTreeMap::from([(c, "eth1".to_string())]),
        };
        let set = |m: &[[u8; 6]]| m.iter().copied().collect::<BTreeSet<_>>();
        assert_eq!(classify(&set(&[]), &owner), Answer::None);
        assert_eq!(classify(&set(&[a]), &owner), Answer::Owner);
        assert_eq!(classify(&set(&[b]), &owner), Answer::Other);
        assert_eq!(
            classify(&set(&[c]), &owner),
            Answer::WrongInterface {
                interface: "eth1".into()
            }
        );
        assert_eq!(classify(&set(&[a, b]), &owner), Answer::Conflict);
        // No record: whoever answers alone is taken for the owner.
        assert_eq!(classify(&set(&[b]), &OwnerMacs::default()), Answer::Owner);
    }

    #[test]
    fn silence_takes_k_requests_in_a_row_and_a_new_owner_starts_again() {
        let mut t = Tracker::default();
        let o = || Some("node-a".to_string());
        assert!(t.record(ip(1), o(), Answer::None, vec![], 3).is_none());
        assert!(t.record(ip(1), o(), Answer::Other, vec![], 3).is_none());
        // An answer breaks the run.
        let c = t.record(ip(1), o(), Answer::Owner, vec![], 3).unwrap();
        assert_eq!(
            (c.from, c.to),
            (ProbingVerdict::Pending, ProbingVerdict::Answered)
        );
        assert!(t.record(ip(1), o(), Answer::None, vec![], 3).is_none());
        assert!(t.record(ip(1), o(), Answer::None, vec![], 3).is_none());
        let c = t.record(ip(1), o(), Answer::None, vec![], 3).unwrap();
        assert_eq!((c.to, c.unanswered), (ProbingVerdict::SilentOwner, 3));
        // Another owner: judged afresh.
        assert!(t
            .record(ip(1), Some("node-b".into()), Answer::None, vec![], 3)
            .is_some());
        assert_eq!(t.ips[&ip(1)].verdict, ProbingVerdict::Pending);
        let c = t
            .record(ip(1), Some("node-b".into()), Answer::Conflict, vec![], 3)
            .unwrap();
        assert_eq!(c.to, ProbingVerdict::Conflict);
        // A missing answer does not end a conflict; the owner alone does.
        assert!(t
            .record(ip(1), Some("node-b".into()), Answer::None, vec![], 3)
            .is_none());
        let c = t
            .record(ip(1), Some("node-b".into()), Answer::Owner, vec![], 3)
            .unwrap();
        assert_eq!(
            (c.from, c.to),
            (ProbingVerdict::Conflict, ProbingVerdict::Answered)
        );
        assert_eq!(t.counts()[&ProbingVerdict::Answered], 1);
    }

    #[test]
    fn the_schedule_spreads_the_start_and_keeps_to_the_cap() {
        let mut s = Schedule::default();
        let asked: BTreeSet<IpAddr> = (0..1000).map(ip).collect();
        let interval = Duration::from_secs(30);
        s.follow(&asked, interval, 0, 7);
        let mut sent = 0;
        let mut per_second = BTreeMap::<u64, usize>::new();
        // 60 s in ticks of 100 ms, at 10 a second.
        for tick in 0..600u64 {
            let now = tick * 100_000_000;
            let n = s.take(now, interval, 10, 7).len();
            sent += n;
            *per_second.entry(now / 1_000_000_000).or_default() += n;
        }
        assert!(per_second.values().all(|n| *n <= 11), "{per_second:?}");
        assert!((580..=610).contains(&sent), "{sent}");
        // Under the cap, every IP is asked once an interval (+-10 %).
        let mut s = Schedule::default();
        let few: BTreeSet<IpAddr> = (0..20).map(ip).collect();
        s.follow(&few, interval, 0, 7);
        let mut times = BTreeMap::<IpAddr, Vec<u64>>::new();
        for tick in 0..1000u64 {
            let now = tick * 100_000_000;
            for i in s.take(now, interval, 10, 7) {
                times.entry(i).or_default().push(now);
            }
        }
        for (i, t) in times {
            assert!(t[0] < 30_000_000_000, "{i} first at {}", t[0]);
            for w in t.windows(2) {
                let gap = w[1] - w[0];
                assert!(
                    (26_900_000_000..=33_100_000_000).contains(&gap),
                    "{i}: {gap}"
                );
            }
        }
    }

    /// Woken only when `next_due` says (as the runner sleeps), the schedule
    /// sends what a fixed tick would: the cap holds, every IP is asked once
    /// an interval, and the wake-ups number about the requests, not 10 a
    /// second.
    #[test]
    fn waking_when_next_due_keeps_the_pace_with_few_wake_ups() {
        let mut s = Schedule::default();
        let asked: BTreeSet<IpAddr> = (0..150).map(ip).collect();
        let interval = Duration::from_secs(30);
        s.follow(&asked, interval, 0, 7);
        let (mut now, mut wakes, mut sent) = (0u64, 0, 0);
        let end = 120_000_000_000;
        let mut per_second = BTreeMap::<u64, usize>::new();
        while now < end {
            let n = s.take(now, interval, 10, 7).len();
            sent += n;
            *per_second.entry(now / 1_000_000_000).or_default() += n;
            wakes += 1;
            let next = s.next_due(10).unwrap().min(now + 1_000_000_000);
            now = next.max(now + 20_000_000);
        }
        // 150 IPs every 30 s over 120 s: 600 requests, 5 a second.
        assert!((570..=630).contains(&sent), "{sent}");
        assert!(per_second.values().all(|n| *n <= 11), "{per_second:?}");
        assert!(wakes <= sent + 130, "{wakes} wake-ups for {sent} requests");
        assert_eq!(Schedule::default().next_due(10), None);
    }

    #[test]
    fn requests_teach_nothing() {
        let mac = [2, 0, 0, 0, 0, 1];
        let (f, n) = request_frame(
            mac,
            std::net::Ipv4Addr::UNSPECIFIED,
            Ipv6Addr::UNSPECIFIED,
            ip(5),
        );
        assert_eq!(n, 60);
        assert_eq!(&f[..6], &[0xff; 6]);
        // ARP sender IP 0.0.0.0 (offset 14 + 14), target the IP.
        assert_eq!(&f[28..32], &[0, 0, 0, 0]);
        assert_eq!(&f[38..42], &[198, 51, 100, 5]);
        let ll: Ipv6Addr = "fe80::1".parse().unwrap();
        let t6: IpAddr = "fd00::5".parse().unwrap();
        let (f, n) = request_frame(mac, std::net::Ipv4Addr::UNSPECIFIED, ll, t6);
        assert!(n > 0);
        // To the solicited-node group's MAC, from the link-local.
        assert_eq!(&f[..3], &[0x33, 0x33, 0xff]);
        assert_eq!(&f[22..38], &ll.octets());
    }
}
