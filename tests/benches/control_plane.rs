//! `sudo cargo bench -p arp-guard-tests --bench control_plane`: how fast changes reach
//! the kernel maps. Results go in BENCHMARKS.md.
//!
//! 1. An address added to (or removed from) `--lb-ips-from kube-ipvs0`, until
//!    the LB_IPS map holds (or no longer holds) it: measured from the bench
//!    process, which writes `addr add`/`addr del` to a long-running
//!    `ip -batch -` and polls the daemon's pinned map. With 2 and 300
//!    addresses already there.
//! 2. An ownership file of 65,536 entries: parse time, and the daemon's start
//!    to enforcing (spawn to "arp-guard is enforcing", maps filled).

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

/// Addresses from the documentation ranges, none of the bed's own.
fn pool() -> Vec<Ipv4Addr> {
    (2..255u8)
        .map(|i| Ipv4Addr::new(203, 0, 113, i))
        .chain((20..100u8).map(|i| Ipv4Addr::new(198, 51, 100, i)))
        .chain((110..255u8).map(|i| Ipv4Addr::new(198, 51, 100, i)))
        .collect()
}

fn address_latency(n: usize) {
    let bed = Bed::new(&format!("nl{n}")).unwrap();
    let fs = Bpffs::new(&format!("nl{n}")).unwrap();
    let pins = fs.path().join("arp-guard");
    let pool = pool();
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
    assert!(wait_for(Duration::from_secs(10), || has(present[n - 1])
        .then_some(()))
    .is_some());
    let (mut add, mut del) = (Vec::new(), Vec::new());
    for a in probes.iter().take(100) {
        for (cmd, want, out) in [("add", true, &mut add), ("del", false, &mut del)] {
            let t = Instant::now();
            writeln!(stdin, "addr {cmd} {a}/32 dev kube-ipvs0").unwrap();
            stdin.flush().unwrap();
            while has(*a) != want {
                assert!(
                    t.elapsed() < Duration::from_secs(5),
                    "{cmd} {a} never reached the map"
                );
                std::hint::spin_loop();
            }
            out.push(t.elapsed());
        }
    }
    drop(stdin);
    let _ = ip.wait();
    for (what, v) in [("add", &mut add), ("del", &mut del)] {
        v.sort();
        println!(
            "address {what} -> map, {n} addresses on kube-ipvs0: p50 {:?} p99 {:?} max {:?} ({} samples)",
            testbed::percentile(v, 0.5),
            testbed::percentile(v, 0.99),
            v[v.len() - 1],
            v.len()
        );
    }
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
    println!(
        "ownership file, {n} entries: daemon start to enforcing {:?}, RSS {} MiB",
        t.elapsed(),
        guard.rss_kib() / 1024
    );
}

fn main() {
    testbed::require_root();
    if std::env::args().any(|a| a == "file") {
        return ownership_file(65_536);
    }
    for n in [2, 300] {
        address_latency(n);
    }
    ownership_file(65_536);
}
