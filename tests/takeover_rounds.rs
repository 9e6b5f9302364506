//! Takeovers as each announcer performs them, against the client whose
//! cache must follow: 20 takeovers back and forth between two nodes for
//! Cilium's order (Lease, then one gratuitous ARP within a millisecond),
//! kube-vip's (its Lease, then a request and a reply) and MetalLB's (a
//! request and a reply, then its ServiceL2Status 0–500 ms later), with
//! arp-guard in enforce mode on both nodes: in every round the client's
//! existing entry (a long reachable time, no re-ARP of its own) holds the new
//! owner's MAC within a second. The announcement a new owner sends before
//! its guard has heard of the takeover is dropped, held and re-sent; these
//! tests show that the re-send path was taken.
//!
//! The bed is `testbed::takeover` (shared with the bench that measures the
//! delay the guard adds). Not in the VM lane: its lease timings assume a
//! native CPU, like `cluster.rs`'s.

use std::time::Duration;

use testbed::takeover::{Style, TakeoverBed};

const ROUNDS: usize = 20;
/// The client's entry must hold the new owner's MAC within this long.
const MOVED_WITHIN: Duration = Duration::from_secs(1);

/// 20 takeovers back and forth; each must move the client within a second.
/// Returns the re-sent announcements counted on both nodes.
fn every_takeover_reaches_the_client(tag: &str, style: Style) -> f64 {
    let mut t = TakeoverBed::new(tag, style, true, &[]).unwrap();
    let mut late = Vec::new();
    for i in 0..ROUNDS {
        let r = t.round(Duration::from_secs(3)).unwrap();
        match r.moved_after {
            Some(d) if d <= MOVED_WITHIN => {}
            other => late.push((i, r.to, other)),
        }
    }
    let replayed: f64 = (0..2)
        .map(|i| {
            testbed::counter(
                &t.bed.nodes[i].ns,
                "arp_guard_announce_total{outcome=\"replayed\"}",
            )
        })
        .sum();
    assert!(
        late.is_empty(),
        "{style:?}: rounds whose client did not move within {MOVED_WITHIN:?} (round, to, after): {late:?}\n{}\n{}",
        t.guards[0].log_text(),
        t.guards[1].log_text()
    );
    // Every node's guard saw its own takeovers, and only those: node-a
    // owned the IP when its guard started, which is not a takeover (nor a
    // silent one), as after any restart.
    for i in 0..2 {
        let n = testbed::counter(&t.bed.nodes[i].ns, "arp_guard_takeovers_total");
        assert_eq!(n, (ROUNDS / 2) as f64, "node {i}: {n} takeovers");
        let silent = testbed::counter(&t.bed.nodes[i].ns, "arp_guard_silent_takeovers_total");
        assert_eq!(silent, 0.0, "node {i}: silent takeovers");
    }
    replayed
}

#[test]
fn cilium_takeovers_reach_the_client_every_time() {
    testbed::require_root();
    // Cilium announces once, right after its Lease write: its guard has not
    // heard of the takeover yet, so the announcement must be the re-sent one.
    let replayed = every_takeover_reaches_the_client("tkc", Style::Cilium);
    assert!(
        replayed >= 1.0,
        "the lease-then-announce order never made the guard hold an announcement: the test did not exercise the re-send"
    );
}

#[test]
fn kube_vip_takeovers_reach_the_client_every_time() {
    testbed::require_root();
    every_takeover_reaches_the_client("tkv", Style::KubeVip);
}

#[test]
fn metallb_takeovers_reach_the_client_every_time() {
    testbed::require_root();
    // MetalLB announces first and writes its status up to 500 ms later:
    // every first announcement is held.
    let replayed = every_takeover_reaches_the_client("tkm", Style::MetalLb);
    assert!(replayed >= (ROUNDS / 2) as f64, "replayed {replayed}");
}
