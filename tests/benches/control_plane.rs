//! `sudo cargo bench -p arp-guard-tests --bench control_plane`: how fast changes reach
//! the kernel maps. Results go in BENCHMARKS.md.
//!
//! 1. One LB IP's state changed in a 65,536-entry LB map, in process: the
//!    full diff of the view against what was written (`Datapath::apply`, the
//!    periodic reconcile) against writing the changed key only
//!    (`Datapath::apply_changes`, what the daemon does per event).
//! 2. An address added to (or removed from) `--lb-ips-from kube-ipvs0`, until
//!    the LB_IPS map holds (or no longer holds) it: measured from the bench
//!    process, which writes `addr add`/`addr del` to a long-running
//!    `ip -batch -` and polls the daemon's pinned map. With 2, 300 and 5,000
//!    addresses already there.
//! 3. An ownership file of 65,536 entries: parse time, and the daemon's start
//!    to enforcing (spawn to "arp-guard is enforcing", maps filled).
//!
//! `BENCH_SHORT=1`: small sizes and few samples (well under a minute).
//! `ARP_GUARD_BIN=path`: the daemon of another build (a before/after).
//! Besides the text, machine-readable lines `RESULT <table> <row> key=value ...`.

use std::{
    io::Write as _,
    net::Ipv4Addr,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use aya::maps::{HashMap, MapData};
use guard_common::LbEntry;
use testbed::{
    bed::{Bed, Bpffs},
    wait_for, Daemon,
};

/// Addresses none of the bed's own: 10.200.0.1 on.
fn pool(n: usize) -> Vec<Ipv4Addr> {
    let base = u32::from(Ipv4Addr::new(10, 200, 0, 1));
    (0..n as u32).map(|i| Ipv4Addr::from(base + i)).collect()
}

fn short() -> bool {
    std::env::var_os("BENCH_SHORT").is_some_and(|v| v != "0")
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn address_latency(n: usize, samples: usize) {
    let bed = Bed::new(&format!("nl{n}")).unwrap();
    let fs = Bpffs::new(&format!("nl{n}")).unwrap();
    let pins = fs.path().join("arp-guard");
    let pool = pool(n + samples);
    let (present, probes) = pool.split_at(n);
    let mut ip = Command::new("ip")
        .args(["-n", &bed.node.name, "-batch", "-"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = ip.stdin.take().unwrap();
    for a in present {
        writeln!(stdin, "addr add {a}/32 dev kube-ipvs0").unwrap();
    }
    stdin.flush().unwrap();
    let guard = Daemon::start(
        &bed.node,
        &[
            "-i",
            "eth0",
            "--node-name",
            "node-a",
            "--lb-ips-from",
            "kube-ipvs0",
            "--pin-dir",
            pins.to_str().unwrap(),
        ],
    )
    .unwrap();
    let map = aya::maps::Map::HashMap(MapData::from_pin(pins.join("map_LB_IPS")).unwrap());
    let map: HashMap<&MapData, u32, LbEntry> = HashMap::try_from(&map).unwrap();
    let has = |a: Ipv4Addr| map.get(&u32::from(a), 0).is_ok();
    assert!(wait_for(Duration::from_secs(300), || has(present[n - 1])
        .then_some(()))
    .is_some());
    let (mut add, mut del) = (Vec::new(), Vec::new());
    for a in probes {
        for (cmd, want, out) in [("add", true, &mut add), ("del", false, &mut del)] {
            let t = Instant::now();
            writeln!(stdin, "addr {cmd} {a}/32 dev kube-ipvs0").unwrap();
            stdin.flush().unwrap();
            while has(*a) != want {
                assert!(
                    t.elapsed() < Duration::from_secs(5),
                    "{cmd} {a} never reached the map"
                );
                // Sleep, not spin: on 2 cores a spinning poller takes the
                // CPU that `ip` and the daemon need, and its own scheduling
                // became the p99 (3-4 ms whatever the address count). The
                // poll's resolution is about 0.1 ms.
                std::thread::sleep(Duration::from_micros(20));
            }
            out.push(t.elapsed());
        }
    }
    drop(stdin);
    let _ = ip.wait();
    let mut result = format!("RESULT address_to_map {n}");
    for (what, v) in [("add", &mut add), ("del", &mut del)] {
        v.sort();
        let (p50, p99) = (testbed::percentile(v, 0.5), testbed::percentile(v, 0.99));
        result += &format!(" {what}_p50_ms={:.3} {what}_p99_ms={:.3}", ms(p50), ms(p99));
        println!(
            "address {what} -> map, {n} addresses on kube-ipvs0: p50 {:?} p99 {:?} max {:?} ({} samples)",
            testbed::percentile(v, 0.5),
            testbed::percentile(v, 0.99),
            v[v.len() - 1],
            v.len()
        );
    }
    println!("{result} samples={samples}");
    drop(guard);
}

fn ownership_file(n: u32) {
    let mut text = String::from("ips:\n");
    for i in 0..n {
        let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 64, 0, 0)) + i);
        text.push_str(&format!("  - ip: {ip}\n    owner: worker-{}\n", i % 50));
    }
    let mut times = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let f = guard::testing::parse_ownership_file(std::path::Path::new("bench.yaml"), &text)
            .unwrap();
        times.push(t.elapsed());
        assert_eq!(f.ips.len(), n as usize);
    }
    times.sort();
    println!(
        "ownership file, {n} entries ({} bytes): parse median {:?} (min {:?}, max {:?}, 5 runs)",
        text.len(),
        times[2],
        times[0],
        times[4]
    );
    let bed = Bed::new("ofile").unwrap();
    std::fs::write(&bed.owners, &text).unwrap();
    let max = (text.len() + 1).to_string();
    let t = Instant::now();
    let guard = bed
        .start(&[
            "--max-lb-ips",
            "70000",
            "--ownership-file-max-bytes",
            &max,
            "--log-level",
            "warn,guard=info",
        ])
        .unwrap();
    let (start, rss) = (t.elapsed(), guard.rss_kib() / 1024);
    println!("ownership file, {n} entries: daemon start to enforcing {start:?}, RSS {rss} MiB");
    println!(
        "RESULT ownership_file {n} parse_ms={:.1} start_to_enforcing_ms={:.1} rss_mib={rss}",
        ms(times[2]),
        ms(start)
    );
}

/// One LB IP's state changed in an `n`-entry LB map: the full diff against
/// the changed key only, `samples` times each.
fn one_change(n: u32, samples: usize) {
    use guard::testing::{LbIp, Provenance, View};
    use guard_common::{LeakAction, Mode, Ownership};
    let lb = |i: u32| Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 64, 0, 0)) + i);
    let mut view = View::default();
    for i in 0..n {
        let l = LbIp {
            state: Ownership::Foreign,
            source: Provenance::Interface("bench".into()),
        };
        view.lb.insert(lb(i).into(), l);
    }
    let mut dp = guard::testing::load(Mode::Enforce, LeakAction::Rewrite).unwrap();
    let r = dp.apply(&view, false);
    assert!(r.failed.is_empty(), "{:?}", r.failed);
    let (mut full, mut keys) = (Vec::new(), Vec::new());
    for k in 0..samples {
        for (path, out) in [("full", &mut full), ("keys", &mut keys)] {
            let ip = lb((k as u32 * 7919) % n);
            let l = view.lb.get_mut(&ip.into()).unwrap();
            l.state = match l.state {
                Ownership::Owned => Ownership::Foreign,
                _ => Ownership::Owned,
            };
            let t = Instant::now();
            let r = match path {
                "full" => dp.apply(&view, false),
                _ => dp.apply_changes(&view, &std::collections::BTreeSet::from([ip.into()]), false),
            };
            out.push(t.elapsed());
            assert_eq!((r.written, r.removed, r.failed.len()), (1, 0, 0));
        }
    }
    full.sort();
    keys.sort();
    let p = |v: &[Duration], q| ms(testbed::percentile(v, q));
    println!(
        "one LB IP's state changed in a {n}-entry map: full diff of the view p50 {:.3} ms p99 {:.3} ms; \
         the changed key only p50 {:.3} ms p99 {:.3} ms ({samples} samples each)",
        p(&full, 0.5),
        p(&full, 0.99),
        p(&keys, 0.5),
        p(&keys, 0.99)
    );
    println!(
        "RESULT map_one_change {n} full_diff_p50_ms={:.3} full_diff_p99_ms={:.3} changed_key_p50_ms={:.3} changed_key_p99_ms={:.3} samples={samples}",
        p(&full, 0.5),
        p(&full, 0.99),
        p(&keys, 0.5),
        p(&keys, 0.99)
    );
}

fn main() {
    testbed::require_root();
    let short = short();
    let file = if short { 4_096 } else { 65_536 };
    if std::env::args().any(|a| a == "file") {
        return ownership_file(file);
    }
    if short {
        one_change(4_096, 20);
    } else {
        one_change(guard_common::MAX_LB_IPS, 200);
    }
    let (sizes, samples): (&[usize], usize) = if short {
        (&[2, 50], 20)
    } else {
        (&[2, 300, 5_000], 100)
    };
    for n in sizes {
        address_latency(*n, samples);
    }
    ownership_file(file);
}
