//! `cargo bench -p arp-guard-tests --bench datapath` (root): the cost of the
//! egress and census programs per frame next to the floor, an empty TC
//! program run the same way (`BPF_PROG_TEST_RUN`, same frames, same repeat
//! count, interleaved rounds), at several LB set sizes; the size of each
//! program after the verifier and the JIT; and map updates from userspace.
//! `BENCH_SHORT=1` runs a small version (CI: nothing is asserted). Results:
//! `RESULT` lines, which `cargo xtask bench` turns into BENCHMARKS.md tables.

use std::{net::Ipv4Addr, os::fd::AsFd as _, time::Instant};

use guard::testing::{Floor, LbIp, Provenance, View};
use guard_common::{LeakAction, Mode, Ownership};
use testbed::{bench::Samples, ArpSpec};

const MAC: [u8; 6] = [2, 0, 0x5e, 0, 0x53, 9];
const PEER_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
const PEER: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);
/// LB IPs with a fixed state whatever the set size (the rest are foreign).
const OWNED: u32 = 1;
const FOREIGN: u32 = 2;
const UNKNOWN: u32 = 3;

fn lb(i: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 64, 0, 0)) + i)
}

/// The IPv6 LB IP of the NDP cases and of misdirected IPv6 (foreign).
const LB6_FOREIGN: std::net::Ipv6Addr = std::net::Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 0x102);
/// An IPv6 LB IP owned here (its traffic is the owner's).
const LB6_OWNED: std::net::Ipv6Addr = std::net::Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 0x101);
/// The IPv6 address of the clients.
const PEER6: std::net::Ipv6Addr = std::net::Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1);

fn view(n: u32, state: impl Fn(u32) -> Ownership) -> View {
    let mut v = View::default();
    for (ip, state) in [
        (LB6_FOREIGN, Ownership::Foreign),
        (LB6_OWNED, Ownership::Owned),
    ] {
        v.lb.insert(
            ip.into(),
            LbIp {
                state,
                source: Provenance::Interface("bench".into()),
            },
        );
    }
    for i in 0..n {
        v.lb.insert(
            lb(i).into(),
            LbIp {
                state: state(i),
                source: Provenance::Interface("bench".into()),
            },
        );
    }
    v.if_primary.insert(1, Ipv4Addr::new(198, 51, 100, 11));
    v
}

fn fixed_states(i: u32) -> Ownership {
    match i {
        OWNED => Ownership::Owned,
        UNKNOWN => Ownership::Unknown,
        _ => Ownership::Foreign,
    }
}

/// An Ethernet frame of `ethertype` carrying `payload` zero bytes, after
/// the optional 802.1Q tag.
fn frame(ethertype: u16, tag: Option<u16>, payload: usize) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&PEER_MAC);
    f.extend_from_slice(&MAC);
    if let Some(vid) = tag {
        f.extend_from_slice(&0x8100u16.to_be_bytes());
        f.extend_from_slice(&vid.to_be_bytes());
    }
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.resize(f.len() + payload, 0);
    f
}

/// An IPv6 packet with next header `nh` (the rest zero).
fn ipv6(nh: u8) -> Vec<u8> {
    let mut f = frame(0x86dd, None, 60);
    f[14] = 0x60;
    f[14 + 6] = nh;
    f[14 + 7] = 64;
    f
}

/// The frames every program is timed on, named as the tables name them.
fn cases() -> Vec<(&'static str, Vec<u8>)> {
    let reply = |i| ArpSpec::reply(MAC, lb(i), PEER_MAC, PEER);
    let mut echo = ipv6(58);
    echo[14 + 40] = 128;
    // A client's UDP datagram to an LB IP, addressed to this host (the
    // test run's device, lo, has the all-zero MAC): the census records one
    // to a foreign IP (the same client each run: an entry updated in place).
    let to = |dst: std::net::IpAddr| {
        let src = if dst.is_ipv4() {
            PEER.into()
        } else {
            PEER6.into()
        };
        testbed::ip_bytes(PEER_MAC, [0; 6], src, dst, Some(80))
    };
    vec![
        // To a destination that is no LB IP (0.0.0.0): the fast path.
        ("ipv4", frame(0x0800, None, 46)),
        // TCP to ::, the IPv6 fast path.
        ("ipv6", ipv6(6)),
        ("ipv4_to_owned_lb", to(lb(OWNED).into())),
        ("ipv4_to_foreign_lb", to(lb(FOREIGN).into())),
        ("ipv6_to_owned_lb", to(LB6_OWNED.into())),
        ("ipv6_to_foreign_lb", to(LB6_FOREIGN.into())),
        ("ipv6_icmp_echo", echo),
        (
            "ndp_na_foreign",
            testbed::nd_bytes(&guard_common::ndp_build::NdSpec::unsolicited(
                MAC,
                LB6_FOREIGN.octets(),
            )),
        ),
        ("ipv4_vlan_tagged", frame(0x0800, Some(7), 46)),
        (
            "arp_not_lb",
            ArpSpec::reply(MAC, PEER, PEER_MAC, Ipv4Addr::new(198, 51, 100, 2)).to_bytes(),
        ),
        ("arp_reply_owned", reply(OWNED).to_bytes()),
        ("arp_reply_foreign", reply(FOREIGN).to_bytes()),
        ("arp_reply_unknown", reply(UNKNOWN).to_bytes()),
        (
            "arp_reply_foreign_qinq",
            reply(FOREIGN)
                .tagged(&[(0x88a8, 1), (0x8100, 2)])
                .to_bytes(),
        ),
        (
            "garp_foreign",
            ArpSpec::gratuitous(1, MAC, lb(FOREIGN)).to_bytes(),
        ),
        // No announce-leak rewrite case: BPF_PROG_TEST_RUN repeats on the same
        // skb, so after the first run the SPA is no longer an LB IP.
    ]
}

struct Plan {
    sizes: Vec<u32>,
    repeat: u32,
    rounds: usize,
}

fn main() {
    testbed::require_root();
    let plan = if testbed::bench::short() {
        Plan {
            sizes: vec![300],
            repeat: 20_000,
            rounds: 3,
        }
    } else {
        Plan {
            sizes: vec![300, 10_000, guard_common::MAX_LB_IPS],
            repeat: 1_000_000,
            rounds: 7,
        }
    };
    let mut dp = guard::testing::load(Mode::Enforce, LeakAction::Rewrite).unwrap();
    let floor = Floor::load().unwrap();
    // `cargo xtask bench --baseline REV`: that revision's program, timed in
    // the same rounds (the "before" of an optimisation).
    let mut before = std::env::var_os("BENCH_BASELINE_OBJ").map(|p| {
        let obj = std::fs::read(&p).expect("BENCH_BASELINE_OBJ");
        guard::testing::load_object(&obj, Mode::Enforce, LeakAction::Rewrite).unwrap()
    });
    sizes(&dp, &floor);
    if let Some(b) = &before {
        let prog = b.programs().unwrap()[0].1;
        let s = guard::testing::program_size(prog).unwrap();
        println!(
            "RESULT programs egress_before xlated_insns={} jited_bytes={} jited_insns={}",
            s.xlated_insns,
            s.jited_bytes,
            testbed::bench::jited_image(prog.fd().unwrap().as_fd(), s.jited_bytes)
                .and_then(|i| testbed::bench::count_x86_insns(&i))
                .map_or("n/a".into(), |n| n.to_string())
        );
    }
    for &n in &plan.sizes {
        per_frame(&mut dp, before.as_mut(), &floor, n, &plan);
    }
    map_updates(&mut dp, *plan.sizes.last().unwrap());
    client_walk(&mut dp);
}

/// Instructions after the verifier and bytes of JIT code, per program.
fn sizes(dp: &guard::testing::Datapath, floor: &Floor) {
    let mut rows = vec![("empty_floor", floor.program().unwrap())];
    rows.extend(dp.programs().unwrap());
    for (name, prog) in rows {
        let s = guard::testing::program_size(prog).unwrap();
        let jited = testbed::bench::jited_image(prog.fd().unwrap().as_fd(), s.jited_bytes)
            .and_then(|i| testbed::bench::count_x86_insns(&i));
        println!(
            "program {name:<18} {:>5} insns after the verifier, {:>5} bytes JIT ({} x86 insns)",
            s.xlated_insns,
            s.jited_bytes,
            jited.map_or("?".into(), |n| n.to_string())
        );
        println!(
            "RESULT programs {name} xlated_insns={} jited_bytes={} jited_insns={}",
            s.xlated_insns,
            s.jited_bytes,
            jited.map_or("n/a".into(), |n| n.to_string())
        );
    }
}

/// Every case on the floor, the egress program and the census, with `n` LB
/// IPs in the map; the three programs take turns on each frame, and the order
/// rotates from round to round, so that all see the same machine.
fn per_frame(
    dp: &mut guard::testing::Datapath,
    mut before: Option<&mut guard::testing::Datapath>,
    floor: &Floor,
    n: u32,
    plan: &Plan,
) {
    for d in std::iter::once(&mut *dp).chain(before.as_deref_mut()) {
        let r = d.apply(&view(n, fixed_states), false);
        // An earlier revision's object (--baseline) may have no IPv6 map.
        let ipv6_map = format!("map {}", guard_common::MAP_LB_IPS6);
        let failed: Vec<_> = r.failed.iter().filter(|f| f.entry != ipv6_map).collect();
        assert!(failed.is_empty(), "{failed:?}");
    }
    let table = format!("datapath_{n}");
    println!(
        "\n{n} LB IPs, {} runs per sample, {} rounds",
        plan.repeat, plan.rounds
    );
    for (case, bytes) in cases() {
        let (mut f, mut g, mut c, mut b, mut bc) = (
            Samples::new(),
            Samples::new(),
            Samples::new(),
            Samples::new(),
            Samples::new(),
        );
        // With a baseline: its egress program and its census too.
        let turns = if before.is_some() { 5 } else { 3 };
        for round in 0..plan.rounds {
            // A stale heartbeat would change the verdict half-way (15 s).
            dp.heartbeat().unwrap();
            for turn in 0..turns {
                match (round + turn) % turns {
                    0 => f.push(ns(floor.timed(&bytes, plan.repeat).unwrap())),
                    1 => g.push(ns(dp.test_run_timed(&bytes, plan.repeat).unwrap())),
                    2 => c.push(ns(dp.census_test_run_timed(&bytes, plan.repeat).unwrap())),
                    t => {
                        let old = before.as_deref_mut().expect("5 turns only with a baseline");
                        old.heartbeat().unwrap();
                        if t == 3 {
                            b.push(ns(old.test_run_timed(&bytes, plan.repeat).unwrap()));
                        } else {
                            let t = old.census_test_run_timed(&bytes, plan.repeat).unwrap();
                            bc.push(ns(t));
                        }
                    }
                }
            }
        }
        println!(
            "{case:<24} floor {:>4} ns  egress {:>4} ns (+{:.0})  census {:>4} ns (+{:.0})",
            f.median(),
            g.median(),
            g.median() - f.median(),
            c.median(),
            c.median() - f.median(),
        );
        let before_cols = if b.is_empty() {
            String::new()
        } else {
            format!(
                " before_ns={} before_over_floor={:.0} census_before_ns={} census_before_over_floor={:.0}",
                b.spread(),
                b.median() - f.median(),
                bc.spread(),
                bc.median() - f.median()
            )
        };
        println!(
            "RESULT {table} {case} floor_ns={}{before_cols} egress_ns={} egress_over_floor={:.0} egress_ratio={:.2} census_ns={} census_over_floor={:.0}",
            f.spread(),
            g.spread(),
            g.median() - f.median(),
            g.median() / f.median(),
            c.spread(),
            c.median() - f.median(),
        );
    }
}

fn ns(d: std::time::Duration) -> f64 {
    d.as_nanos() as f64
}

/// Map updates through the daemon's writer: fill `n` LB IPs, change one,
/// change every one.
fn map_updates(dp: &mut guard::testing::Datapath, n: u32) {
    dp.apply(&View::default(), false);
    let full = view(n, |_| Ownership::Foreign);
    let t = Instant::now();
    let r = dp.apply(&full, false);
    let fill = t.elapsed();
    assert!(r.failed.is_empty(), "{:?}", r.failed);
    let mut one = full.clone();
    one.lb.get_mut(&lb(7).into()).unwrap().state = Ownership::Owned;
    let t = Instant::now();
    let r = dp.apply(&one, false);
    let single = t.elapsed();
    assert_eq!(r.written, 1);
    let flipped = view(n, |_| Ownership::Unknown);
    let t = Instant::now();
    dp.apply(&flipped, false);
    let all = t.elapsed();
    println!(
        "\nmap updates: fill {n} LB IPs {fill:?} ({:.2} us/entry); one change {single:?}; change all {n} {all:?}",
        fill.as_secs_f64() * 1e6 / f64::from(n)
    );
    println!(
        "RESULT map_updates fill_{n} ms={:.2}\nRESULT map_updates one_change_{n} ms={:.3}\nRESULT map_updates change_all_{n} ms={:.2}",
        fill.as_secs_f64() * 1e3,
        single.as_secs_f64() * 1e3,
        all.as_secs_f64() * 1e3
    );
}

/// The daemon's read of the census's client table: the totals alone (what
/// a read with nothing new costs), and a walk of a full table (a flood of
/// forged MACs), filled by the program itself.
fn client_walk(dp: &mut guard::testing::Datapath) {
    dp.apply(&view(300, fixed_states), false);
    let reader = dp.clients_reader().unwrap();
    let n = guard_common::MAX_CLIENTS;
    for i in 0..n {
        let b = i.to_be_bytes();
        let mac = [2, 0x66, b[0], b[1], b[2], b[3]];
        let f = testbed::ip_bytes(mac, [0; 6], PEER.into(), lb(FOREIGN).into(), Some(80));
        dp.census_test_run(&f).unwrap();
    }
    let (mut totals, mut walk, mut held) = (Samples::new(), Samples::new(), 0);
    for _ in 0..5 {
        let t = Instant::now();
        reader.stats().unwrap();
        totals.push(t.elapsed().as_secs_f64() * 1e6);
        let t = Instant::now();
        let entries = reader.entries().unwrap();
        walk.push(t.elapsed().as_secs_f64() * 1e3);
        held = entries.len();
    }
    // The LRU makes room in batches: a table filled with as many keys as
    // its capacity holds somewhat fewer.
    assert!(held > n as usize / 2, "{held} entries");
    println!(
        "\nclient table ({held} of {n} entries): totals read {:.0} us, walk {:.1} ms",
        totals.median(),
        walk.median()
    );
    println!(
        "RESULT clients_reader totals us={}\nRESULT clients_reader walk_full ms={} entries={held}",
        totals.spread(),
        walk.spread_with(1)
    );
}
