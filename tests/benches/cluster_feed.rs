//! `sudo cargo bench -p arp-guard-tests --bench cluster_feed`: the Kubernetes feed at
//! scale, against the fake API server (real list/watch over HTTP) in network
//! namespaces, the real daemon with `--announcer cilium`. Three tables:
//!
//! - `cluster_feed`: N LoadBalancer Services each with a Cilium Lease (1,000,
//!   10,000, 100,000): initial list, start to enforcing, resident memory (now
//!   and peak), and the latency from a watch event reaching the guard to the
//!   BPF map change (p50/p99 over Lease holder moves, one at a time).
//! - `cluster_feed_mixed`: 300 LB Services with Leases, alone and beside
//!   20,000 and 100,000 ClusterIP Services shaped like a Helm chart's:
//!   memory, against a server that filters Services by `spec.type`
//!   (Kubernetes 1.31+) and one that cannot (older: the guard reads them all).
//! - `cluster_feed_cpu`: the daemon's own CPU time (/proc/PID/stat) with 300
//!   LB IPs at rest, and per Lease renewal that changes nothing (renewTime
//!   only, paced like Cilium's renewals: 150 a second), net of the rest.
//!
//! `BENCH_BASELINE_BIN=path` (and `BENCH_BASELINE_NAME=rev`): every case runs
//! for that older build of the daemon too, in the same run (the "before"
//! rows). `BENCH_SHORT=1`: small sizes (well under two minutes). `-- 10000`:
//! that scale size alone; `BENCH_MOVES=n`: n Lease moves per size;
//! `BENCH_ONLY=scale,mixed,cpu,in-process`: some parts only; `BENCH_RENEWALS=n` and
//! `BENCH_REST_S=s`: the CPU part's renewals and rest. Besides the text, one
//! machine-readable line per row: `RESULT <table> <row> key=value ...`.

use std::{
    io::{Read as _, Write as _},
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, AtomicI32, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use testbed::{
    cluster_bed::ClusterBed,
    fake_api::{objects, FakeApi, Resource},
    wait_for, Daemon,
};

/// A build of the daemon under test.
struct Build {
    /// `now`, or the baseline's revision.
    name: String,
    path: PathBuf,
}

impl Build {
    /// A row label: `base` for today's build, `base (rev)` for the baseline's.
    fn row(&self, base: &str) -> String {
        if self.name == "now" {
            base.to_owned()
        } else {
            format!("{base}_({})", self.name)
        }
    }
}

fn builds() -> Vec<Build> {
    let mut v = vec![Build {
        name: "now".into(),
        path: testbed::guard_binary(),
    }];
    if let Some(p) = std::env::var_os("BENCH_BASELINE_BIN") {
        let path = PathBuf::from(p);
        let name = std::env::var("BENCH_BASELINE_NAME").unwrap_or_else(|_| {
            path.file_name()
                .map_or("baseline".into(), |n| n.to_string_lossy().into_owned())
        });
        v.push(Build { name, path });
    }
    v
}

fn ip(i: usize) -> String {
    format!("10.{}.{}.{}", 64 + i / 65536, (i / 256) % 256, i % 256)
}

fn lease_name(i: usize) -> String {
    format!("cilium-l2announce-default-svc-{i}")
}

/// A Cilium Lease as the server serves it (with its managed fields).
fn lease(i: usize, holder: &str, renew: &str) -> serde_json::Value {
    let mut l = objects::lease("kube-system", &lease_name(i), holder, 3600, renew);
    l["metadata"]["managedFields"] = serde_json::json!([objects::managed_field(
        "cilium-agent",
        "Update",
        serde_json::json!({"f:spec": {"f:acquireTime": {}, "f:holderIdentity": {},
            "f:leaseDurationSeconds": {}, "f:leaseTransitions": {}, "f:renewTime": {}}})
    )]);
    l
}

/// `n` LB Services with a Lease each (half held by node-a) and `others`
/// ClusterIP Services, loaded before the guard starts; bookmarks every
/// minute, as a real API server sends them.
fn load(api: &FakeApi, n: usize, others: usize) {
    api.set_bookmark_every(Duration::from_secs(60));
    api.preload(
        Resource::Services,
        (0..n).map(|i| objects::service("default", &format!("svc-{i}"), &[&ip(i)])),
    );
    api.preload(
        Resource::Leases,
        (0..n).map(|i| {
            let holder = if i.is_multiple_of(2) {
                "node-a"
            } else {
                "node-b"
            };
            lease(i, holder, "2026-11-30T10:00:00.000000Z")
        }),
    );
    api.preload(
        Resource::Services,
        (0..others).map(|i| objects::cluster_ip_service("apps", &format!("app-{i}"), i)),
    );
}

/// Start `build` on node-a as the DaemonSet runs it (an ownership file,
/// a status file, /metrics on a port of its own) and wait until its maps
/// hold every IP.
fn start(bed: &ClusterBed, build: &Build, n: usize) -> (Daemon, Duration) {
    let max = (n + 1024).max(65_536).to_string();
    let owners = bed.dir.path().join("owners.yaml");
    std::fs::write(&owners, "ips: []\n").unwrap();
    let status = bed.dir.path().join("status.json");
    let (owners, status) = (owners.to_string_lossy(), status.to_string_lossy());
    let t = Instant::now();
    let guard = bed
        .start_build_on(
            0,
            &build.path,
            &[
                "--announcer",
                "cilium",
                "--max-lb-ips",
                &max,
                "--ownership-file",
                &owners,
                "--status-file",
                &status,
                "--metrics-listen",
                "127.0.0.1:9478",
            ],
            Duration::from_secs(900),
        )
        .unwrap();
    let to_sync = t.elapsed();
    // The first apply after the sync writes every IP.
    wait_for(Duration::from_secs(300), || {
        (guard.count_log("cluster change applied") >= 1).then_some(())
    })
    .unwrap();
    (guard, to_sync)
}

/// Seconds from the feed's start to its first complete list, by the
/// daemon's own log timestamps.
fn initial_list(guard: &Daemon) -> f64 {
    let ts = |needle: &str| -> f64 {
        let line = guard.lines(needle).into_iter().next().unwrap();
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        let t = v["timestamp"].as_str().unwrap(); // 2026-11-30T12:15:11.460711Z
        let hms = &t[11..t.len() - 1];
        let p: Vec<f64> = hms.split(':').map(|x| x.parse().unwrap()).collect();
        p[0] * 3600.0 + p[1] * 60.0 + p[2]
    };
    ts("initial sync from the Kubernetes API done")
        - ts("reading ownership from the Kubernetes API")
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// Move Lease `i` to `holder` (a new renewTime from `k`) and wait until the
/// change reached the maps: every event sent before it was handled too.
fn move_lease(bed: &ClusterBed, guard: &Daemon, i: usize, holder: &str, k: usize) {
    let before = guard.count_log("cluster change applied");
    let renew = format!("2026-11-30T11:{:02}:{:02}.{:06}Z", (k / 60) % 60, k % 60, k);
    bed.api.apply(Resource::Leases, lease(i, holder, &renew));
    wait_for(Duration::from_secs(30), || {
        (guard.count_log("cluster change applied") > before).then_some(())
    })
    .unwrap();
}

/// N LB Services + N Leases: sync, memory, event -> map latency.
fn scale(n: usize, moves: usize, build: &Build) {
    let bed = ClusterBed::new(&format!("bsc{n}"), &[]).unwrap();
    load(&bed.api, n, 0);
    let (guard, to_sync) = start(&bed, build, n);
    let sync = initial_list(&guard);
    let (rss, peak) = (mib(guard.rss_kib()), mib(guard.peak_rss_kib()));
    let before = guard.count_log("cluster change applied");
    let mut holders: Vec<bool> = (0..n).map(|i| i % 2 == 0).collect(); // true: node-a
    for k in 0..moves {
        let i = (k * 7919) % n;
        holders[i] = !holders[i];
        move_lease(
            &bed,
            &guard,
            i,
            if holders[i] { "node-a" } else { "node-b" },
            k,
        );
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
    println!(
        "[{}] {n} Services + {n} Leases: initial list {sync:.3} s, start to enforcing {:.2} s, \
         RSS {rss:.1} MiB (peak {peak:.1}); watch event -> BPF map over {} moves: p50 {:.2} ms, p99 {:.2} ms",
        build.name,
        to_sync.as_secs_f64(),
        us.len(),
        ms(0.5),
        ms(0.99)
    );
    println!(
        "RESULT cluster_feed {} initial_list_s={sync:.3} start_to_enforcing_s={:.2} rss_MiB={rss:.1} peak_MiB={peak:.1} p50_ms={:.2} p99_ms={:.2} samples={}",
        build.row(&n.to_string()),
        to_sync.as_secs_f64(),
        ms(0.5),
        ms(0.99),
        us.len()
    );
}

/// `lb` LB Services with Leases beside `others` ClusterIP Services, the
/// server filtering Services by spec.type or not: memory. Returns the RSS.
fn mixed(lb: usize, others: usize, filtering: bool, build: &Build, alone: Option<f64>) -> f64 {
    let bed = ClusterBed::new(&format!("bmx{}", others / 1000), &[]).unwrap();
    bed.api.set_service_field_selectors(filtering);
    load(&bed.api, lb, others);
    let (guard, _) = start(&bed, build, lb);
    let sync = initial_list(&guard);
    // Let the allocator settle after the list's pages were freed.
    std::thread::sleep(Duration::from_secs(2));
    let (rss, peak) = (mib(guard.rss_kib()), mib(guard.peak_rss_kib()));
    let server = if filtering { "" } else { ",_server_<1.31" };
    let row = if others == 0 {
        format!("{lb}_LB")
    } else {
        format!("{lb}_LB_+_{others}_ClusterIP{server}")
    };
    let vs = alone.map_or(String::new(), |a| {
        format!(" vs_LB_alone={:+.1}%", (rss / a - 1.0) * 100.0)
    });
    println!(
        "[{}] {row}: initial list {sync:.3} s, RSS {rss:.1} MiB (peak {peak:.1}){vs}",
        build.name
    );
    println!(
        "RESULT cluster_feed_mixed {} initial_list_s={sync:.3} rss_MiB={rss:.1} peak_MiB={peak:.1}{vs}",
        build.row(&row)
    );
    rss
}

/// The floor: a bare reader of the same Lease watch (one blocking read per
/// event, nothing decoded) on a thread of this process, in node-a's
/// namespace. What receiving an event costs any watcher in this bed (the
/// kernel's TCP receive and ACK, across a bridge with br_netfilter).
struct Floor {
    tid: Arc<AtomicI32>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<u64>>,
}

impl Floor {
    fn start(bed: &ClusterBed) -> Floor {
        let addr = bed.api.addr;
        let rv = bed.api.resource_version();
        let sock = bed.nodes[0]
            .ns
            .enter(move || Ok(std::net::TcpStream::connect(addr)?))
            .unwrap();
        let (tid, stop) = (
            Arc::new(AtomicI32::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let (t, s) = (tid.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            t.store(unsafe { libc::gettid() }, Ordering::SeqCst);
            let mut sock = sock;
            let path = format!(
                "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases?watch=true&resourceVersion={rv}&timeoutSeconds=290"
            );
            write!(sock, "GET {path} HTTP/1.1\r\nHost: api\r\n\r\n").unwrap();
            sock.set_read_timeout(Some(Duration::from_millis(200)))
                .unwrap();
            let (mut buf, mut n) = (vec![0u8; 65536], 0u64);
            while !s.load(Ordering::SeqCst) {
                match sock.read(&mut buf) {
                    Ok(0) => break,
                    Ok(k) => n += k as u64,
                    Err(_) => {}
                }
            }
            n
        });
        while tid.load(Ordering::SeqCst) == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
        Floor {
            tid,
            stop,
            thread: Some(thread),
        }
    }

    /// The reader thread's CPU time so far.
    fn cpu(&self) -> Duration {
        let tid = self.tid.load(Ordering::SeqCst);
        let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap();
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        let f: Vec<u64> = rest
            .split_whitespace()
            .skip(11)
            .take(2)
            .map(|v| v.parse().unwrap())
            .collect();
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
        Duration::from_nanos((f[0] + f[1]) * 1_000_000_000 / hz)
    }
}

impl Drop for Floor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The daemon's CPU with `lb` LB IPs: at rest over `rest`, and per no-op
/// Lease renewal over `renewals` paced at `rate` a second.
fn cpu(lb: usize, rest: Duration, renewals: usize, rate: f64, build: &Build) {
    let bed = ClusterBed::new("bcpu", &[]).unwrap();
    // The readiness probe as the DaemonSet sets it (every 5 s).
    bed.kubelet.set_every(Duration::from_secs(5));
    load(&bed.api, lb, 0);
    let (guard, _) = start(&bed, build, lb);
    std::thread::sleep(Duration::from_secs(3));
    let c0 = guard.cpu_time();
    let t0 = Instant::now();
    std::thread::sleep(rest);
    let (idle_cpu, idle_wall) = (guard.cpu_time() - c0, t0.elapsed());
    let idle_rate = idle_cpu.as_secs_f64() / idle_wall.as_secs_f64();
    let floor = Floor::start(&bed);
    let f1 = floor.cpu();
    let c1 = guard.cpu_time();
    let (u1, s1) = guard.cpu_times();
    let t1 = Instant::now();
    for k in 0..renewals {
        let i = k % lb;
        let holder = if i.is_multiple_of(2) {
            "node-a"
        } else {
            "node-b"
        };
        let renew = format!("2026-11-30T10:{:02}:{:02}.{:06}Z", (k / 60) % 60, k % 60, k);
        bed.api.apply(Resource::Leases, lease(i, holder, &renew));
        let due = t1 + Duration::from_secs_f64((k + 1) as f64 / rate);
        if let Some(d) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(d);
        }
    }
    // One move after them: once it is applied, every renewal was handled.
    move_lease(&bed, &guard, 0, "node-b", renewals);
    let (busy_cpu, busy_wall) = (guard.cpu_time() - c1, t1.elapsed());
    let net = busy_cpu.as_secs_f64() - idle_rate * busy_wall.as_secs_f64();
    let per_us = net / renewals as f64 * 1e6;
    // The kernel's share (system time): receiving each event and sending
    // its TCP ACK, which in this bed crosses a bridge with br_netfilter.
    let (u2, s2) = guard.cpu_times();
    let per = |d: Duration| d.as_secs_f64() / renewals as f64 * 1e6;
    let (user_us, kernel_us) = (per(u2 - u1), per(s2 - s1));
    let floor_us = per(floor.cpu() - f1);
    drop(floor);
    let idle_pct = idle_rate * 100.0;
    let busy_pct = busy_cpu.as_secs_f64() / busy_wall.as_secs_f64() * 100.0;
    println!(
        "[{}] {lb} LB IPs at rest: {idle_pct:.3} % of a core over {:.0} s; {renewals} no-op renewals at {rate}/s: \
         {busy_pct:.2} % of a core, {per_us:.1} µs of CPU each (net of the rest; gross {user_us:.1} µs user + {kernel_us:.1} µs kernel); \
         a bare reader of the same watch: {floor_us:.1} µs each, so {:.1} µs above that floor",
        build.name,
        idle_wall.as_secs_f64(),
        per_us - floor_us
    );
    println!(
        "RESULT cluster_feed_cpu {} rest_cpu_pct={idle_pct:.3} rest_s={:.0} renewal_us={per_us:.1} floor_us={floor_us:.1} above_floor_us={:.1} renewals={renewals} renewing_cpu_pct={busy_pct:.2}",
        build.row(&format!("{lb}_LB_IPs")),
        idle_wall.as_secs_f64(),
        per_us - floor_us
    );
}

/// The feed's own work per event, in this process (no I/O): a watch line
/// decoded, applied, the view compared. Today's build only.
fn in_process(n: usize, events: usize) {
    let bytes = guard::testing::feed_bytes(n);
    println!(
        "[now] in-process, {n} LB Services: the feed holds {:.1} MiB ({} B per Service with its Lease)",
        bytes as f64 / (1 << 20) as f64,
        bytes / n.max(1)
    );
    // Warm up (allocator, caches), then measure.
    let _ = guard::testing::feed_costs(n, events.min(1000));
    let c = guard::testing::feed_costs(n, events);
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!(
        "[now] in-process, {n} LB Services: a no-op renewal {:.2} µs, a holder move {:.2} µs (decode, model, view)",
        us(c.renewal),
        us(c.holder_move)
    );
    println!(
        "RESULT cluster_feed_cpu {n}_LB_IPs,_in-process renewal_us={:.2} move_us={:.2} renewals={events}",
        us(c.renewal),
        us(c.holder_move)
    );
}

fn main() {
    testbed::require_root();
    let short = testbed::bench::short();
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    let runs = |t: &str| only.is_empty() || only.split(',').any(|o| o == t);
    let builds = builds();
    // Scale sizes on the command line (`-- 100000`) run alone.
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let (sizes, moves) = match (short, sizes.is_empty()) {
        (true, _) => (vec![200], 20),
        (false, true) => (vec![1_000, 10_000, 100_000], 200),
        (false, false) => (sizes, 200),
    };
    let moves = std::env::var("BENCH_MOVES")
        .ok()
        .and_then(|m| m.parse().ok())
        .unwrap_or(moves);
    // First: the allocator's statistics are the process's, quiet now.
    if runs("cpu") || runs("in-process") {
        in_process(
            if short { 50 } else { 300 },
            if short { 1_000 } else { 20_000 },
        );
        if !short {
            in_process(10_000, 20_000);
        }
    }
    if runs("scale") {
        for n in &sizes {
            for b in &builds {
                scale(*n, moves, b);
            }
        }
    }
    if runs("mixed") {
        let (lb, others) = if short {
            (50, vec![2_000])
        } else {
            (300, vec![20_000, 100_000])
        };
        for b in &builds {
            let alone = mixed(lb, 0, true, b, None);
            for n in &others {
                // The baseline never asks the server to filter.
                mixed(lb, *n, true, b, Some(alone));
                if b.name == "now" {
                    mixed(lb, *n, false, b, Some(alone));
                }
            }
        }
    }
    if runs("cpu") {
        let (lb, rest, renewals) = if short {
            (50, Duration::from_secs(3), 150)
        } else {
            (300, Duration::from_secs(60), 3_000)
        };
        // More renewals than the default make the per-renewal figure finer
        // than the kernel's 10 ms CPU accounting allows over 3,000.
        let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
        let renewals = env("BENCH_RENEWALS").map_or(renewals, |n| n as usize);
        let rest = env("BENCH_REST_S").map_or(rest, Duration::from_secs);
        for b in &builds {
            cpu(lb, rest, renewals, 150.0, b);
        }
    }
}
