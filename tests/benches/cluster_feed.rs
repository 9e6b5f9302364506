//! `sudo cargo bench -p arp-guard-tests --bench cluster_feed`: the Kubernetes feed at
//! scale, against the fake API server (real list/watch over HTTP) in network
//! namespaces. For 1,000, 10,000 and 100,000 Services each with a Cilium
//! Lease: initial sync time, the daemon's resident memory, and the latency
//! from a watch event reaching the guard to the BPF map change (p50/p99 over
//! Lease holder moves, one at a time).
//!
//! `BENCH_SHORT=1`: 200 Services and 20 moves (well under a minute).
//! `-- 10000`: that size alone; `BENCH_MOVES=n`: n Lease moves per size.
//! `ARP_GUARD_BIN=path`: measure another build of the daemon (e.g. an older
//! one, for a before/after). Besides the text, one machine-readable line per
//! size: `RESULT cluster_feed <services> key=value ...`.

use std::time::{Duration, Instant};

use testbed::{
    cluster_bed::ClusterBed,
    fake_api::{objects, Resource},
    wait_for,
};

fn ip(i: usize) -> String {
    format!("10.{}.{}.{}", 64 + i / 65536, (i / 256) % 256, i % 256)
}

fn run(n: usize, moves: usize) {
    let bed = ClusterBed::new(&format!("bench{n}"), &[]).unwrap();
    for i in 0..n {
        let name = format!("svc-{i}");
        bed.api.apply(
            Resource::Services,
            objects::service("default", &name, &[&ip(i)]),
        );
        let holder = if i % 2 == 0 { "node-a" } else { "node-b" };
        bed.api.apply(
            Resource::Leases,
            objects::lease(
                "kube-system",
                &format!("cilium-l2announce-default-{name}"),
                holder,
                3600,
                "2026-11-30T10:00:00.000000Z",
            ),
        );
    }
    let max = (n + 1024).max(65_536).to_string();
    let t = Instant::now();
    let guard = bed
        .start_on(
            0,
            &["--announcer", "cilium", "--max-lb-ips", &max],
            Duration::from_secs(600),
        )
        .unwrap();
    let to_sync = t.elapsed();
    // From the feed's start to its first complete list, by the daemon's own clock.
    let ts = |needle: &str| -> f64 {
        let line = guard.lines(needle).into_iter().next().unwrap();
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        let t = v["timestamp"].as_str().unwrap(); // 2026-11-30T12:15:11.460711Z
        let hms = &t[11..t.len() - 1];
        let p: Vec<f64> = hms.split(':').map(|x| x.parse().unwrap()).collect();
        p[0] * 3600.0 + p[1] * 60.0 + p[2]
    };
    let sync = ts("initial sync from the Kubernetes API done")
        - ts("reading ownership from the Kubernetes API");
    // Wait until the maps hold every IP (the first apply after the sync).
    wait_for(Duration::from_secs(300), || {
        (guard.count_log("cluster change applied") >= 1).then_some(())
    })
    .unwrap();
    let rss = guard.rss_kib();
    // Lease moves: each is one watch event for the guard.
    let before = guard.count_log("cluster change applied");
    let mut holders: Vec<bool> = (0..n).map(|i| i % 2 == 0).collect(); // true: node-a
    for k in 0..moves {
        let i = (k * 7919) % n;
        holders[i] = !holders[i];
        let holder = if holders[i] { "node-a" } else { "node-b" };
        bed.api.apply(
            Resource::Leases,
            objects::lease(
                "kube-system",
                &format!("cilium-l2announce-default-svc-{i}"),
                holder,
                3600,
                &format!("2026-11-30T11:{:02}:{:02}.000000Z", k / 60, k % 60),
            ),
        );
        let want = before + k + 1;
        wait_for(Duration::from_secs(30), || {
            (guard.count_log("cluster change applied") >= want).then_some(())
        })
        .unwrap();
    }
    let mut us: Vec<u64> = guard
        .lines("cluster change applied")
        .iter()
        .skip(before)
        .filter_map(|l| {
            serde_json::from_str::<serde_json::Value>(l).ok()?["feed_to_map_us"].as_u64()
        })
        .collect();
    us.sort();
    let ms = |p| testbed::percentile(&us, p) as f64 / 1000.0;
    let rss_mib = rss as f64 / 1024.0;
    println!(
        "{n} Services + {n} Leases: initial list {sync:.3} s, daemon start to synced and enforcing {:.2} s, RSS {rss_mib:.1} MiB; \
         watch event -> BPF map over {} lease moves: p50 {:.2} ms, p99 {:.2} ms",
        to_sync.as_secs_f64(),
        us.len(),
        ms(0.5),
        ms(0.99)
    );
    println!(
        "RESULT cluster_feed {n} initial_list_s={sync:.3} start_to_enforcing_s={:.2} rss_mib={rss_mib:.1} p50_ms={:.2} p99_ms={:.2} samples={}",
        to_sync.as_secs_f64(),
        ms(0.5),
        ms(0.99),
        us.len()
    );
}

fn main() {
    testbed::require_root();
    let short = std::env::var_os("BENCH_SHORT").is_some_and(|v| v != "0");
    if short {
        return run(200, 20);
    }
    // Sizes on the command line (`-- 100000`) run alone.
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let sizes = if sizes.is_empty() {
        vec![1_000, 10_000, 100_000]
    } else {
        sizes
    };
    // `BENCH_MOVES=n`: fewer Lease moves (an old, slow build at 100,000).
    let moves = std::env::var("BENCH_MOVES")
        .ok()
        .and_then(|m| m.parse().ok());
    for n in sizes {
        run(n, moves.unwrap_or(200));
    }
}
