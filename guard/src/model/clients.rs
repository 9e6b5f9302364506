//! Misdirected and stale clients, from the census's table (pure).
//!
//! The census records every packet that arrives here, addressed to this
//! host, for an LB IP that is `foreign` here, by (LB IP, client MAC). Here
//! the entries are judged against what the daemon published for each IP:
//!
//! - after this node **lost** the IP (it was `owned` here and no longer
//!   is; the moment is the daemon's, `lost_ns`), a client that keeps sending
//!   here has not followed the move yet. Its **failover time** as it lived
//!   it is its last packet here minus the moment of the move, known once it
//!   has gone quiet (no packet for `stale_after`); a client still sending
//!   `stale_after` after the move is **stale**;
//! - to an IP this node has not owned since the daemon started, a client
//!   is **misdirected** all the same (its cache points here for another
//!   reason: this node's kernel answered ARP for it, a static entry, a move
//!   before the daemon started); it is stale once it has sent here for
//!   `stale_after` without a break.
//!
//! Entries older than the move (a previous foreign period) are history and
//! are not listed. [`assess`] keeps what it needs from one read to the
//! next in [`Memory`]: each client's packet count at the last read (so
//! that packets are counted once, and "since the move" starts from the
//! count at the move) and whether its failover time was observed and its
//! staleness reported. Everything in it is bounded by what one walk of the
//! kernel table returns (at most twice its capacity, under churn) or the LB
//! set.

use std::{
    collections::{BTreeMap, HashMap},
    net::IpAddr,
    time::Duration,
};

use guard_common::Ownership;
use serde::{Deserialize, Serialize};

use super::{census::MAX_LISTED, fmt_mac};

mod carry;
pub use carry::{kept, totals, Kept, Restore};
/// The clients as they are served (a wire type: the plugin reads them too).
pub use guard_wire::clients::{Cause, Client, ClientState, Clients, IpClients};

/// One entry of the census's client table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub ip: IpAddr,
    pub mac: [u8; 6],
    /// The IP source of its latest packet.
    pub client_ip: IpAddr,
    /// Start of the current run of packets, and the latest (CLOCK_MONOTONIC ns).
    pub first_ns: u64,
    pub last_ns: u64,
    /// Packets since the entry was created.
    pub packets: u64,
    pub ifindex: u32,
    /// The VLAN ID in the frame's metadata (0: none).
    pub vlan: u16,
}

/// This node's relation to one LB IP, as the daemon published it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpState {
    pub state: Ownership,
    /// When this node last lost the IP (it stopped being `owned` here), on
    /// the entries' clock; None: not since the daemon started, or owned now.
    pub lost_ns: Option<u64>,
}

/// What the entries are judged against.
#[derive(Debug, Clone, Default)]
pub struct Context {
    /// Now, on the entries' clock.
    pub now_ns: u64,
    /// `--stale-client-after`: a client still sending this long after the
    /// move is stale; one quiet this long has gone.
    pub stale_after: Duration,
    /// Every LB IP.
    pub ips: BTreeMap<IpAddr, IpState>,
    /// Interface names by index.
    pub ifnames: BTreeMap<u32, String>,
}

/// A client that has just become stale (for the log and the event stream).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StaleClient {
    pub lb_ip: IpAddr,
    pub cause: Cause,
    pub mac: String,
    pub client_ip: IpAddr,
    pub misdirected_s: f64,
    pub packets: u64,
}

/// A client seen sending here for the first time in its episode (after
/// the move; not owned here: in its current run), still sending: what
/// must be acted on at once, without waiting for it to become stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewClient {
    pub lb_ip: IpAddr,
    pub cause: Cause,
    pub mac: [u8; 6],
    pub client_ip: IpAddr,
    /// Its latest packet (on the entries' clock).
    pub last_ns: u64,
}

/// What one read brought.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub clients: Clients,
    /// Failover times (seconds) of clients that went quiet since the last
    /// read, each client once per move.
    pub failovers: Vec<f64>,
    pub newly_stale: Vec<StaleClient>,
    /// Each client once per episode, at the first read that sees it.
    pub newly_misdirected: Vec<NewClient>,
}

/// What is remembered of one client from one read to the next.
#[derive(Debug, Clone, Copy, Default)]
struct Seen {
    /// Its packet count at the last read.
    packets: u64,
    /// Its count when this node last lost the IP (0: it came after).
    baseline: u64,
    /// The start of the run its staleness was reported for.
    run: u64,
    observed: bool,
    stale_reported: bool,
    announced: bool,
}

/// What [`assess`] keeps from one read to the next.
#[derive(Debug, Default)]
pub struct Memory {
    seen: HashMap<(IpAddr, [u8; 6]), Seen>,
    /// The loss each IP's baselines were taken at.
    moves: HashMap<IpAddr, u64>,
    /// Misdirected packets per LB IP since the daemon started (and before
    /// a restart, when they were handed back).
    totals: BTreeMap<IpAddr, u64>,
    /// Clients handed back after a restart ([`carry`]).
    carried: HashMap<(IpAddr, [u8; 6]), carry::Carried>,
    /// A silence this long ends a carried client's run.
    run_gap_ns: u64,
}

impl Memory {
    /// The LB IPs it keeps totals or a move for: their state is needed at
    /// the next read, whether or not the table still holds a client of them.
    pub fn ips(&self) -> impl Iterator<Item = IpAddr> + '_ {
        (self.totals.keys().chain(self.moves.keys()))
            .chain(self.carried.keys().map(|(ip, _)| ip))
            .copied()
    }
}

/// The clients of the entries (any order), judged in `cx`; `mem` carries
/// counts, baselines and what was reported from one read to the next.
pub fn assess(entries: &[Entry], cx: &Context, mem: &mut Memory) -> Outcome {
    note_moves(cx, mem);
    let merged = carry::merge(entries, cx, mem);
    let entries = &merged[..];
    count_packets(entries, cx, mem);
    let mut out = Outcome::default();
    let mut by_ip: BTreeMap<IpAddr, Vec<(Client, u64)>> = BTreeMap::new();
    for e in entries {
        let Some(st) = cx.ips.get(&e.ip) else {
            continue;
        };
        if st.state != Ownership::Foreign {
            continue;
        }
        let Some(seen) = mem.seen.get_mut(&(e.ip, e.mac)) else {
            continue;
        };
        if let Some(c) = assess_client(e, st, seen, cx, &mut out) {
            by_ip.entry(e.ip).or_default().push((c, e.last_ns));
        }
    }
    for (ip, total) in &mem.totals {
        let Some(st) = cx.ips.get(ip) else { continue };
        let clients = by_ip.remove(ip).unwrap_or_default();
        out.clients
            .insert(*ip, one_ip(st, *total, clients, cx.now_ns));
    }
    out
}

/// A new loss of an IP: the counts of its clients at the last read (taken
/// while the IP was owned here, when nothing is recorded for it) are where
/// "since the move" starts, and each client is judged anew.
fn note_moves(cx: &Context, mem: &mut Memory) {
    mem.moves
        .retain(|ip, _| cx.ips.get(ip).is_some_and(|s| s.lost_ns.is_some()));
    for (ip, st) in &cx.ips {
        let Some(lost) = st.lost_ns else { continue };
        if mem.moves.insert(*ip, lost) == Some(lost) {
            continue;
        }
        for ((seen_ip, _), s) in mem.seen.iter_mut() {
            if seen_ip == ip {
                *s = Seen {
                    packets: s.packets,
                    baseline: s.packets,
                    ..Seen::default()
                };
            }
        }
    }
}

/// Add each client's packets since the last read to its IP's total, and
/// remember its count; forget clients the table no longer holds, and the
/// totals of IPs no longer in the LB set.
fn count_packets(entries: &[Entry], cx: &Context, mem: &mut Memory) {
    let mut now: HashMap<(IpAddr, [u8; 6]), Seen> = HashMap::with_capacity(entries.len());
    for e in entries {
        let mut s = mem.seen.get(&(e.ip, e.mac)).copied().unwrap_or_default();
        // Fewer than last time: the entry was evicted and made again.
        let (grown, baseline) = if e.packets >= s.packets {
            (e.packets - s.packets, s.baseline)
        } else {
            (e.packets, 0)
        };
        if cx.ips.contains_key(&e.ip) && grown > 0 {
            *mem.totals.entry(e.ip).or_default() += grown;
        }
        s.packets = e.packets;
        s.baseline = baseline;
        now.insert((e.ip, e.mac), s);
    }
    mem.seen = now;
    mem.totals.retain(|ip, _| cx.ips.contains_key(ip));
}

/// One client of a foreign IP; None when its packets predate the move.
fn assess_client(
    e: &Entry,
    st: &IpState,
    seen: &mut Seen,
    cx: &Context,
    out: &mut Outcome,
) -> Option<Client> {
    let secs = |ns: u64| Duration::from_nanos(ns).as_secs_f64();
    let stale_after = u64::try_from(cx.stale_after.as_nanos()).unwrap_or(u64::MAX);
    let (cause, anchor, packets) = match st.lost_ns {
        Some(lost) if e.last_ns < lost => return None,
        Some(lost) => (
            Cause::AfterMove,
            lost,
            e.packets.saturating_sub(seen.baseline),
        ),
        None => (Cause::NotOwnedHere, e.first_ns, e.packets),
    };
    let misdirected = e.last_ns.saturating_sub(anchor);
    let status = if cx.now_ns.saturating_sub(e.last_ns) >= stale_after {
        ClientState::Gone
    } else if misdirected >= stale_after {
        ClientState::Stale
    } else {
        ClientState::Sending
    };
    let failover =
        (cause == Cause::AfterMove && status == ClientState::Gone).then(|| secs(misdirected));
    if let (Some(f), false) = (failover, seen.observed) {
        seen.observed = true;
        out.failovers.push(f);
    }
    if cause == Cause::NotOwnedHere && seen.run != e.first_ns {
        // A new run of packets: a new episode to report.
        (seen.run, seen.stale_reported, seen.announced) = (e.first_ns, false, false);
    }
    if status != ClientState::Gone && !seen.announced {
        seen.announced = true;
        out.newly_misdirected.push(NewClient {
            lb_ip: e.ip,
            cause,
            mac: e.mac,
            client_ip: e.client_ip,
            last_ns: e.last_ns,
        });
    }
    if status == ClientState::Stale && !seen.stale_reported {
        seen.stale_reported = true;
        out.newly_stale.push(StaleClient {
            lb_ip: e.ip,
            cause,
            mac: fmt_mac(&e.mac),
            client_ip: e.client_ip,
            misdirected_s: millis(secs(misdirected)),
            packets,
        });
    }
    let ago = |t: u64| Duration::from_nanos(cx.now_ns.saturating_sub(t)).as_secs();
    Some(Client {
        mac: fmt_mac(&e.mac),
        client_ip: e.client_ip,
        status,
        packets,
        first_seen_ago_s: ago(e.first_ns.max(anchor)),
        last_seen_ago_s: ago(e.last_ns),
        misdirected_s: millis(secs(misdirected)),
        failover_s: failover.map(millis),
        interface: cx
            .ifnames
            .get(&e.ifindex)
            .cloned()
            .unwrap_or_else(|| format!("ifindex:{}", e.ifindex)),
        vlan: (e.vlan != 0).then_some(e.vlan),
    })
}

/// Seconds to the millisecond.
fn millis(s: f64) -> f64 {
    (s * 1000.0).round() / 1000.0
}

/// One IP's clients (each with its latest packet), sorted and bounded.
fn one_ip(st: &IpState, total: u64, mut clients: Vec<(Client, u64)>, now_ns: u64) -> IpClients {
    clients.sort_by(|(a, a_last), (b, b_last)| {
        (a.status, std::cmp::Reverse(*a_last), &a.mac).cmp(&(
            b.status,
            std::cmp::Reverse(*b_last),
            &b.mac,
        ))
    });
    let count = |s: ClientState| clients.iter().filter(|(c, _)| c.status == s).count();
    let stale = count(ClientState::Stale);
    let sending = stale + count(ClientState::Sending);
    let oldest_stale_s = (clients.iter())
        .filter(|(c, _)| c.status == ClientState::Stale)
        .map(|(c, _)| c.misdirected_s)
        .reduce(f64::max);
    let more = clients.len().saturating_sub(MAX_LISTED);
    IpClients {
        state: st.state,
        cause: (st.state == Ownership::Foreign).then_some(if st.lost_ns.is_some() {
            Cause::AfterMove
        } else {
            Cause::NotOwnedHere
        }),
        moved_ago_s: st
            .lost_ns
            .map(|l| Duration::from_nanos(now_ns.saturating_sub(l)).as_secs()),
        packets_total: total,
        sending,
        stale,
        oldest_stale_s,
        clients: clients
            .into_iter()
            .take(MAX_LISTED)
            .map(|(c, _)| c)
            .collect(),
        more,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The fixtures, shared with `carry`'s tests.
    pub(super) const S: u64 = 1_000_000_000;
    pub(super) const IP: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(198, 51, 100, 102));
    pub(super) const CLIENT: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(198, 51, 100, 1));
    pub(super) const A: [u8; 6] = [2, 0, 0, 0, 0, 0xa];
    pub(super) const B: [u8; 6] = [2, 0, 0, 0, 0, 0xb];

    pub(super) fn entry(mac: [u8; 6], first: u64, last: u64, packets: u64) -> Entry {
        Entry {
            ip: IP,
            mac,
            client_ip: CLIENT,
            first_ns: first * S,
            last_ns: last * S,
            packets,
            ifindex: 2,
            vlan: 0,
        }
    }

    fn cx(now: u64, state: Ownership, lost: Option<u64>) -> Context {
        Context {
            now_ns: now * S,
            stale_after: Duration::from_secs(30),
            ips: BTreeMap::from([(
                IP,
                IpState {
                    state,
                    lost_ns: lost.map(|l| l * S),
                },
            )]),
            ifnames: BTreeMap::from([(2, "eth0".to_owned())]),
        }
    }

    /// Never owned here: misdirected, stale once it has sent for the
    /// threshold without a break; reported once.
    #[test]
    fn misdirected_to_an_ip_never_owned_here() {
        let mut m = Memory::default();
        let o = assess(
            &[entry(A, 100, 110, 5)],
            &cx(111, Ownership::Foreign, None),
            &mut m,
        );
        let e = &o.clients[&IP];
        assert_eq!(e.cause, Some(Cause::NotOwnedHere));
        assert_eq!((e.sending, e.stale, e.packets_total), (1, 0, 5));
        let c = &e.clients[0];
        assert_eq!(
            (c.status, c.packets, c.misdirected_s),
            (ClientState::Sending, 5, 10.0)
        );
        assert_eq!((c.mac.as_str(), c.client_ip), ("02:00:00:00:00:0a", CLIENT));
        assert_eq!((c.first_seen_ago_s, c.last_seen_ago_s), (11, 1));
        assert_eq!(c.interface, "eth0");
        assert!(o.newly_stale.is_empty() && o.failovers.is_empty());
        assert_eq!(o.newly_misdirected.len(), 1, "seen at once, not when stale");
        assert_eq!(
            (o.newly_misdirected[0].mac, o.newly_misdirected[0].cause),
            (A, Cause::NotOwnedHere)
        );
        // Still sending 40 s after its first packet: stale, reported once.
        let o = assess(
            &[entry(A, 100, 140, 50)],
            &cx(141, Ownership::Foreign, None),
            &mut m,
        );
        assert_eq!(o.clients[&IP].stale, 1);
        assert_eq!(o.clients[&IP].oldest_stale_s, Some(40.0));
        assert_eq!(o.newly_stale.len(), 1);
        assert_eq!(o.newly_stale[0].cause, Cause::NotOwnedHere);
        let o = assess(
            &[entry(A, 100, 141, 51)],
            &cx(142, Ownership::Foreign, None),
            &mut m,
        );
        assert!(o.newly_stale.is_empty(), "reported once");
        assert!(o.newly_misdirected.is_empty(), "new once");
        assert_eq!(o.clients[&IP].packets_total, 51, "each packet counted once");
        // Quiet for the threshold: gone; no failover time without a move.
        let o = assess(
            &[entry(A, 100, 141, 51)],
            &cx(180, Ownership::Foreign, None),
            &mut m,
        );
        assert_eq!(o.clients[&IP].clients[0].status, ClientState::Gone);
        assert_eq!(o.clients[&IP].sending, 0);
        assert!(o.failovers.is_empty());
    }

    /// After a move: packets count from the move; a client that goes quiet
    /// gets its failover time (once), one that keeps sending is stale.
    #[test]
    fn after_a_move_failover_times_and_stale_clients() {
        let mut m = Memory::default();
        // Foreign before, with A and B misdirected (an earlier episode).
        let before = [entry(A, 10, 20, 7), entry(B, 10, 20, 3)];
        assess(&before, &cx(21, Ownership::Foreign, None), &mut m);
        // Owned for a while: nothing recorded.
        assess(&before, &cx(50, Ownership::Owned, None), &mut m);
        // Lost at 100: A sends until 102 then stops, B keeps sending.
        let early = [entry(A, 100, 102, 9), entry(B, 100, 108, 10)];
        let o = assess(&early, &cx(110, Ownership::Foreign, Some(100)), &mut m);
        let new: Vec<_> = o
            .newly_misdirected
            .iter()
            .map(|n| (n.mac, n.cause))
            .collect();
        assert_eq!(
            new,
            [(A, Cause::AfterMove), (B, Cause::AfterMove)],
            "a move: new again"
        );
        let e = &o.clients[&IP];
        assert_eq!(e.cause, Some(Cause::AfterMove));
        assert_eq!(e.moved_ago_s, Some(10));
        assert_eq!((e.sending, e.stale), (2, 0));
        let a = &e.clients[1];
        assert_eq!(
            (a.mac.as_str(), a.status),
            ("02:00:00:00:00:0a", ClientState::Sending)
        );
        assert_eq!(
            (a.packets, a.failover_s),
            (2, None),
            "counted from the move"
        );
        // At 141: A has been quiet for 39 s, its failover time is 2 s; B
        // still sends, 40 s after the move: stale.
        let after = [entry(A, 100, 102, 9), entry(B, 100, 140, 30)];
        let o = assess(&after, &cx(141, Ownership::Foreign, Some(100)), &mut m);
        assert_eq!(o.failovers, vec![2.0]);
        let e = &o.clients[&IP];
        assert_eq!(e.packets_total, 39, "every packet ever, each once");
        assert_eq!((e.sending, e.stale, e.oldest_stale_s), (1, 1, Some(40.0)));
        let b = &e.clients[0];
        assert_eq!(
            (b.mac.as_str(), b.status),
            ("02:00:00:00:00:0b", ClientState::Stale)
        );
        assert_eq!((b.packets, b.misdirected_s), (27, 40.0));
        assert_eq!(o.newly_stale.len(), 1);
        assert_eq!(o.newly_stale[0].cause, Cause::AfterMove);
        let a = &e.clients[1];
        assert_eq!((a.status, a.failover_s), (ClientState::Gone, Some(2.0)));
        let o = assess(&after, &cx(150, Ownership::Foreign, Some(100)), &mut m);
        assert!(o.failovers.is_empty() && o.newly_stale.is_empty(), "once");
        // B goes quiet too: its failover time is 40 s.
        let o = assess(&after, &cx(171, Ownership::Foreign, Some(100)), &mut m);
        assert_eq!(o.failovers, vec![40.0]);
        assert_eq!(o.clients[&IP].stale, 0);
    }

    /// A client whose latest packet predates the move is history; a new
    /// move is a new episode (baselines, observations, reports).
    #[test]
    fn history_before_the_move_is_not_listed() {
        let mut m = Memory::default();
        let old = [entry(A, 10, 20, 7)];
        assess(&old, &cx(21, Ownership::Foreign, None), &mut m);
        let o = assess(&old, &cx(101, Ownership::Foreign, Some(100)), &mut m);
        assert!(o.clients[&IP].clients.is_empty());
        assert_eq!(o.clients[&IP].packets_total, 7);
        // Owned again, then lost again at 200; A sends 2 packets at 201.
        assess(&old, &cx(150, Ownership::Owned, None), &mut m);
        let o = assess(
            &[entry(A, 201, 201, 9)],
            &cx(202, Ownership::Foreign, Some(200)),
            &mut m,
        );
        assert_eq!(o.clients[&IP].clients[0].packets, 2);
        // Owned now: no client listed, the total stays.
        let o = assess(
            &[entry(A, 201, 201, 9)],
            &cx(203, Ownership::Owned, None),
            &mut m,
        );
        let e = &o.clients[&IP];
        assert!(e.clients.is_empty() && e.cause.is_none());
        assert_eq!(e.packets_total, 9);
        // Out of the LB set: forgotten.
        let mut gone = cx(204, Ownership::Owned, None);
        gone.ips.clear();
        assert!(assess(&[entry(A, 201, 201, 9)], &gone, &mut m)
            .clients
            .is_empty());
    }

    /// An entry evicted and made again counts from scratch; a flood of MACs
    /// is listed bounded, and remembered only as far as the table holds.
    #[test]
    fn churn_and_floods_stay_bounded() {
        let mut m = Memory::default();
        let k = cx(101, Ownership::Foreign, None);
        assess(&[entry(A, 100, 100, 50)], &k, &mut m);
        let o = assess(&[entry(A, 100, 101, 3)], &k, &mut m);
        assert_eq!(o.clients[&IP].packets_total, 53);
        let flood: Vec<Entry> = (0..1000u32)
            .map(|i| {
                let b = i.to_be_bytes();
                entry([2, 0x66, b[0], b[1], b[2], b[3]], 100, 101, 1)
            })
            .collect();
        let o = assess(&flood, &k, &mut m);
        let e = &o.clients[&IP];
        assert_eq!(
            (e.clients.len(), e.more, e.sending),
            (MAX_LISTED, 1000 - MAX_LISTED, 1000)
        );
        assert_eq!(m.seen.len(), 1000, "A is forgotten with its entry");
    }
}
