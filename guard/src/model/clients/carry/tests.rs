use super::super::{
    assess,
    tests::{entry, A, B, IP, S},
    Cause, ClientState, Context, IpState, Outcome,
};
use super::*;
use guard_common::Ownership;

fn cx(now: u64, lost: Option<u64>) -> Context {
    Context {
        now_ns: now * S,
        stale_after: Duration::from_secs(30),
        ips: BTreeMap::from([(
            IP,
            IpState {
                state: Ownership::Foreign,
                lost_ns: lost.map(|l| l * S),
            },
        )]),
        ifnames: BTreeMap::from([(2, "eth0".to_owned())]),
    }
}

/// What the next daemon gets from `mem` and the entries it last read.
fn handed(entries: &[Entry], mem: &Memory, lost: u64) -> Restore {
    Restore {
        clients: kept(entries, mem),
        totals: totals(mem).clone(),
        moves: BTreeMap::from([(IP, lost * S)]),
        run_gap: Duration::from_secs(60),
    }
}

/// A restart between two reads changes nothing the reads say: the same
/// clients, counts since the move, first packets, statuses and failover
/// times, and nothing reported twice (a stale client, a new one, a
/// failover time).
#[test]
fn a_restart_between_two_reads_changes_nothing_they_say() {
    // The IP moved away at 100. A sent until 102 and followed; B sends on.
    let (lost, before) = (100, [entry(A, 10, 102, 9), entry(B, 10, 135, 40)]);
    let mut m = Memory::default();
    // Owned before the move: A and B each had 7 and 5 packets (an earlier
    // foreign period), the baselines.
    assess(
        &[entry(A, 10, 20, 7), entry(B, 10, 20, 5)],
        &cx(50, None),
        &mut m,
    );
    let first = assess(&before, &cx(136, Some(lost)), &mut m);
    assert_eq!(first.newly_stale.len(), 1, "B is stale");
    assert_eq!(first.failovers, vec![2.0], "A followed after 2 s");
    let r = handed(&before, &m, lost);
    assert_eq!(r.clients.len(), 2);

    // Without a restart: B's entry goes on to 140 with 5 more packets.
    let mut stay = m;
    let stayed = assess(
        &[entry(A, 10, 102, 9), entry(B, 10, 140, 45)],
        &cx(141, Some(lost)),
        &mut stay,
    );
    // With one at 137: the new table holds B's packets since (first at
    // 138), and nothing of A, which stopped before it.
    let mut next = Memory::default();
    // The new daemon's first read before its view settled: no history yet.
    assess(&[entry(B, 138, 138, 1)], &cx(138, None), &mut next);
    next.restore(r);
    let after = assess(&[entry(B, 138, 140, 5)], &cx(141, Some(lost)), &mut next);
    assert_eq!(after.clients, stayed.clients);
    let b = &after.clients[&IP].clients[0];
    assert_eq!((b.status, b.packets), (ClientState::Stale, 40), "{b:?}");
    assert_eq!(
        b.first_seen_ago_s, 41,
        "from the move, not from the restart"
    );
    let a = &after.clients[&IP].clients[1];
    assert_eq!((a.status, a.failover_s), (ClientState::Gone, Some(2.0)));
    assert_eq!(after.clients[&IP].cause, Some(Cause::AfterMove));
    assert_eq!(after.clients[&IP].packets_total, 7 + 5 + 2 + 35 + 5);
    assert_eq!(
        after.clients[&IP].packets_total,
        stayed.clients[&IP].packets_total
    );
    assert!(no_reports(&after), "{after:?}");
    // And again: the carried client stays as one.
    let again = assess(&[entry(B, 138, 145, 9)], &cx(146, Some(lost)), &mut next);
    assert_eq!(again.clients[&IP].clients[0].packets, 44);
    assert_eq!(again.clients[&IP].packets_total, 58);
    assert!(no_reports(&again));
}

fn no_reports(o: &Outcome) -> bool {
    o.newly_stale.is_empty() && o.newly_misdirected.is_empty() && o.failovers.is_empty()
}

/// Not owned here: the run goes on across the restart (same start, no
/// second report); a silence longer than the census window is a new run.
#[test]
fn a_run_goes_on_across_a_restart_unless_it_broke() {
    let mut m = Memory::default();
    let before = [entry(B, 100, 140, 40)];
    let o = assess(&before, &cx(141, None), &mut m);
    assert_eq!(o.newly_stale.len(), 1);
    let mut r = handed(&before, &m, 0);
    r.moves.clear();
    let mut next = Memory::default();
    next.restore(r.clone());
    let o = assess(&[entry(B, 143, 150, 8)], &cx(151, None), &mut next);
    let b = &o.clients[&IP].clients[0];
    assert_eq!(
        (b.status, b.packets, b.misdirected_s),
        (ClientState::Stale, 48, 50.0)
    );
    assert!(no_reports(&o), "{o:?}");
    // Back after five minutes of silence: a new run, reported anew.
    let mut next = Memory::default();
    next.restore(r);
    let o = assess(&[entry(B, 440, 441, 2)], &cx(441, None), &mut next);
    let b = &o.clients[&IP].clients[0];
    assert_eq!((b.status, b.first_seen_ago_s), (ClientState::Sending, 1));
    assert_eq!(o.newly_misdirected.len(), 1);
}

/// The new table's entry of a carried client evicted (gone, or made again
/// with fewer packets): it counts from scratch, as after any eviction; an
/// IP that left the LB set, or moved again, forgets its carried clients.
#[test]
fn carried_clients_go_with_their_entry_their_ip_or_a_new_move() {
    let lost = 100;
    let before = [entry(A, 101, 110, 10), entry(B, 101, 110, 10)];
    let mut m = Memory::default();
    assess(&before, &cx(111, Some(lost)), &mut m);
    let mut next = Memory::default();
    next.restore(handed(&before, &m, lost));
    assert_eq!(next.carried(), 2);
    let o = assess(
        &[entry(A, 112, 113, 3), entry(B, 112, 113, 3)],
        &cx(114, Some(lost)),
        &mut next,
    );
    assert_eq!(o.clients[&IP].packets_total, 26);
    // A's entry evicted and made again (1 packet), B's evicted.
    let o = assess(&[entry(A, 115, 115, 1)], &cx(116, Some(lost)), &mut next);
    assert_eq!(next.carried(), 0);
    assert_eq!(o.clients[&IP].clients.len(), 1);
    assert_eq!(o.clients[&IP].clients[0].packets, 1);
    assert_eq!(o.clients[&IP].packets_total, 27, "each packet once");

    // A new move, and the IP leaving the LB set, forget them.
    let mut next = Memory::default();
    next.restore(handed(&before, &m, lost));
    assess(&[], &cx(200, Some(150)), &mut next);
    assert_eq!(next.carried(), 0, "history of the earlier move");
    let mut next = Memory::default();
    next.restore(handed(&before, &m, lost));
    let mut gone = cx(200, Some(lost));
    gone.ips.clear();
    assert!(assess(&[], &gone, &mut next).clients.is_empty());
    assert_eq!(next.carried(), 0);
}
