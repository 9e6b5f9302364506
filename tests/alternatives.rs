//! Side by side with what a user would pick instead (issue 12, part 4): the
//! coverage table of BENCHMARKS.md, measured on the real kernel so that it
//! cannot rot. One node, one neighbour; every frame kind is produced the way
//! it is in the field (the node's kernel ARP stack, a speaker's AF_PACKET
//! socket, a TC ingress responder's redirect) under each approach in turn,
//! and we record what the neighbour receives.
//!
//! The facts: an nftables `arp` output chain drops the kernel's frames for
//! the IPs in its set but never sees AF_PACKET or redirected frames;
//! strictARP stops replies only for addresses not on the asking interface
//! and cannot tell an owned IP from a foreign one; arp-guard stops all of
//! them for foreign IPs and passes the owned one.

#[path = "alternatives_bed.rs"]
mod alternatives_bed;

use alternatives_bed::{coverage, coverage_bed, Approach, Kind, Outcome};
use Outcome::{Dropped as D, Passed as P, Rewritten as R};

#[test]
fn each_approach_stops_the_frames_of_the_coverage_table() {
    testbed::require_root();
    let t = std::time::Instant::now();
    let mut bed = coverage_bed("altcov").unwrap();
    let measured = coverage(&mut bed).unwrap();
    eprintln!("coverage measured in {:?}", t.elapsed());
    #[rustfmt::skip]
    let expected: [(Approach, [Outcome; 8]); 4] = [
        // kernel_reply, kernel_reply_uplink, kernel_gratuitous, announce_leak,
        // speaker_gratuitous, speaker_reply, redirect_reply, owned_reply
        (Approach::Nothing,   [P, P, P, P, P, P, P, P]),
        (Approach::ArpGuard,  [D, D, D, R, D, D, D, P]),
        // The arp output hook sees the kernel's own frames only.
        (Approach::Nftables,  [D, D, D, D, P, P, P, P]),
        // arp_ignore=1: no reply for an address not on the asking interface
        // (the owned one included); arp_announce=2: the primary address as
        // sender of the kernel's requests. Nothing else.
        (Approach::StrictArp, [D, P, P, R, P, P, P, D]),
    ];
    let mut wrong = Vec::new();
    for ((a, row), (ea, erow)) in measured.iter().zip(expected) {
        assert_eq!(*a, ea);
        for ((k, o), e) in row.iter().zip(erow) {
            if *o != e {
                wrong.push(format!(
                    "{} {}: measured {}, expected {}",
                    a.name(),
                    k.name(),
                    o.name(),
                    e.name()
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "coverage table:\n{}", wrong.join("\n"));
    // The kinds the table names, in order (the expected rows above follow it).
    let kinds: Vec<Kind> = measured[0].1.iter().map(|(k, _)| *k).collect();
    assert_eq!(kinds, alternatives_bed::KINDS);
}
