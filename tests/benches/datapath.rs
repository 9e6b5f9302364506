//! `sudo cargo bench -p arp-guard-tests --bench datapath`: the cost of the egress
//! program per frame (BPF_PROG_TEST_RUN's in-kernel timing, no wire), and of
//! map updates from userspace. Results go in BENCHMARKS.md.

use std::{net::Ipv4Addr, time::Instant};

use guard::testing::{LbIp, Provenance, View};
use guard_common::{LeakAction, Mode, Ownership};
use testbed::ArpSpec;

const MAC: [u8; 6] = [2, 0, 0x5e, 0, 0x53, 9];
const PEER: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);

fn lb(i: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 64, 0, 0)) + i)
}

fn view(n: u32, state: impl Fn(u32) -> Ownership) -> View {
    let mut v = View::default();
    for i in 0..n {
        v.lb.insert(
            lb(i),
            LbIp {
                state: state(i),
                source: Provenance::Interface("bench".into()),
            },
        );
    }
    v.if_primary.insert(1, Ipv4Addr::new(198, 51, 100, 11));
    v
}

fn main() {
    testbed::require_root();
    let mut dp = guard::testing::load(Mode::Enforce, LeakAction::Rewrite).unwrap();
    dp.heartbeat().unwrap();

    // Map updates: fill 65,536 LB IPs, then change one, then change every state.
    let n = guard_common::MAX_LB_IPS;
    let full = view(n, |_| Ownership::Foreign);
    let t = Instant::now();
    let r = dp.apply(&full, false);
    let fill = t.elapsed();
    assert!(r.failed.is_empty(), "{:?}", r.failed);
    let mut one = full.clone();
    one.lb.get_mut(&lb(7)).unwrap().state = Ownership::Owned;
    let t = Instant::now();
    let r = dp.apply(&one, false);
    let single = t.elapsed();
    assert_eq!(r.written, 1);
    let flipped = view(n, |_| Ownership::Unknown);
    let t = Instant::now();
    dp.apply(&flipped, false);
    let all = t.elapsed();
    println!("map updates: fill {n} LB IPs {fill:?} ({:.2} us/entry); one change {single:?}; change all {n} {all:?}", fill.as_secs_f64() * 1e6 / f64::from(n));

    // Per-frame cost with the full map.
    let repeat = 1_000_000;
    let mut tcp = ArpSpec::reply(MAC, lb(1), [2, 0, 0, 0, 0, 1], PEER).to_bytes();
    tcp[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("non-ARP (IPv4 ethertype)", tcp),
        (
            "ARP, SPA not an LB IP",
            ArpSpec::reply(
                MAC,
                PEER,
                [2, 0, 0, 0, 0, 1],
                Ipv4Addr::new(198, 51, 100, 2),
            )
            .to_bytes(),
        ),
        (
            "ARP reply from LB IP, dropped (unknown)",
            ArpSpec::reply(MAC, lb(1), [2, 0, 0, 0, 0, 1], PEER).to_bytes(),
        ),
        (
            "ARP reply, QinQ-tagged, dropped",
            ArpSpec::reply(MAC, lb(1), [2, 0, 0, 0, 0, 1], PEER)
                .tagged(&[(0x88a8, 1), (0x8100, 2)])
                .to_bytes(),
        ),
        // No rewrite case: BPF_PROG_TEST_RUN repeats on the same skb, so after the
        // first run the SPA is no longer an LB IP and the number would lie.
    ];
    for (name, frame) in &cases {
        let d = dp.test_run_timed(frame, repeat).unwrap();
        println!(
            "program: {name:<42} {:>4} ns/frame (mean of {repeat})",
            d.as_nanos()
        );
    }

    // The ingress census beside an empty program (the floor), the same
    // frames, in interleaved rounds so that both see the same machine.
    let census_cases: Vec<(&str, Vec<u8>)> = vec![
        ("non-ARP (IPv4 ethertype)", cases[0].1.clone()),
        ("ARP, SPA not an LB IP", cases[1].1.clone()),
        ("ARP reply from an LB IP, recorded", cases[2].1.clone()),
        ("same, QinQ-tagged, recorded", cases[3].1.clone()),
        (
            "gratuitous ARP of an LB IP, recorded",
            ArpSpec::gratuitous(1, MAC, lb(1)).to_bytes(),
        ),
    ];
    for (name, frame) in &census_cases {
        let (mut floor, mut census) = (Vec::new(), Vec::new());
        for _ in 0..5 {
            floor.push(
                guard::testing::floor_timed(frame, repeat)
                    .unwrap()
                    .as_nanos(),
            );
            census.push(dp.census_test_run_timed(frame, repeat).unwrap().as_nanos());
        }
        floor.sort();
        census.sort();
        let (f, c) = (floor[2], census[2]);
        println!(
            "census:  {name:<42} {c:>4} ns/frame, empty program {f:>4} ns: +{} ns (median of 5 x {repeat})",
            c as i128 - f as i128
        );
    }
}
