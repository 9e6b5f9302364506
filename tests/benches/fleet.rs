//! `cargo xtask bench --only fleet`: what a fleet of guards costs the API
//! server, against the number of guards, for two announcers: kube-vip
//! (per-Service election: the cluster-wide Lease watch, Leases renewed) and
//! MetalLB (ServiceL2Status, which nothing writes at rest). N real daemons
//! (4, 8, 16, 32; in the short run 2 of each)
//! in network namespaces of one bed, each on its node's segment with the
//! DaemonSet's defaults (`--interface auto`: its Node read, the announcer's
//! interfaces followed; presence; the active census), against the
//! project's fake API server, which counts every request, the bytes it
//! sends and the watch events, by client, verb and resource. 300 LB
//! Services whose owners do not change; the readiness probe every 5 s, as
//! a kubelet does; bookmarks every 10 s, counted as one a minute (× 10/60),
//! as a real API server sends them.
//!
//! A watch asks to be ended after [8, 16) minutes by default, longer than a
//! window: the fleet runs with `--kube-watch-timeout 20s` ([20, 40) s), so
//! that every watch is renewed in the window, and a guard's watch requests
//! are scaled to the default (× 30/720, the means); everything else (lists,
//! GETs, the API check, writes) is counted as it is. The bookmarks keep
//! coming on every watch, so the API check, asked only when they are
//! overdue, stays as rare as measured.
//!
//! With nothing changing, a guard's requests, bytes and watch events per
//! second must not grow with N (presence's lists of every guard's record,
//! renewed every 10 s, doubled with every doubling of N). Then one more
//! guard joins and leaves: the events that costs the others in total (O(N)).
//!
//! Then a mass failover: every Lease moves at once, every guard's findings
//! change, and each writes its ArpGuardNode (at most once per 10-12 s):
//! those writes per guard and for the fleet, beside the announcer's own.
//!
//! Tables: `fleet` (per guard and for the fleet, per N, with the fitted
//! growth), `fleet_failover`, `fleet_requests` (the largest N by verb and resource, per
//! guard), `fleet_model` (the fitted figures at 100 / 1,000 / 5,000 nodes
//! next to the announcers' own load). `BENCH_FLEET_WINDOW=s` sets the
//! measured window (default 120 s, short run 8 s).

use std::{
    collections::BTreeMap,
    net::IpAddr,
    time::{Duration, Instant},
};

use testbed::{
    bench::short,
    cluster_bed::{ClusterBed, PRESENCE_NS},
    deploy::daemonset_wrapper,
    fake_api::{objects, Counts, Resource},
    Daemon,
};

/// LB Services, each with its kube-vip Lease or MetalLB ServiceL2Status.
const SERVICES: usize = 300;
/// The fleet's `--kube-watch-timeout`, and the default's, as the means of
/// their [W, 2W) (see the module's comment).
const BENCH_WATCH: &str = "20s";
const WATCH_SCALE: f64 = 30.0 / 720.0;
/// A real API server sends a bookmark about every minute on every watch;
/// the bench's watches last [20, 40) s, so its server sends one every
/// 10 s and the bookmarks counted are scaled to the minute (× 10/60).
const BENCH_BOOKMARK: Duration = Duration::from_secs(10);
const BOOKMARK_SCALE: f64 = 10.0 / 60.0;
/// MetalLB's namespace.
const METALLB_NS: &str = "metallb-system";

/// Which announcer the fleet follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Announcer {
    KubeVip,
    MetalLb,
}

impl Announcer {
    fn name(self) -> &'static str {
        match self {
            Announcer::KubeVip => "kube-vip",
            Announcer::MetalLb => "metallb",
        }
    }

    /// Service `i` owned by `node`: its Lease or its ServiceL2Status.
    fn owner(self, i: usize, node: &str) -> (Resource, serde_json::Value) {
        match self {
            Announcer::KubeVip => (Resource::Leases, lease(i, node)),
            Announcer::MetalLb => {
                let svc = format!("svc-{i}");
                let name = format!("l2-{i}");
                (
                    Resource::L2Statuses,
                    objects::l2status(METALLB_NS, &name, node, "default", &svc),
                )
            }
        }
    }
}

fn main() {
    testbed::require_root();
    let fleets: Vec<(Announcer, Vec<usize>)> = if short() {
        vec![(Announcer::KubeVip, vec![2]), (Announcer::MetalLb, vec![2])]
    } else {
        vec![
            (Announcer::KubeVip, vec![4, 8, 16, 32]),
            (Announcer::MetalLb, vec![4, 8, 16, 32]),
        ]
    };
    let window = Duration::from_secs(
        std::env::var("BENCH_FLEET_WINDOW")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(if short() { 8 } else { 120 }),
    );
    for (announcer, sizes) in fleets {
        let runs: Vec<Run> = sizes.iter().map(|&n| run(announcer, n, window)).collect();
        let fit = Fit::of(&runs);
        for r in &runs {
            r.print(&fit);
            r.print_failover();
        }
        if let Some(last) = runs.last() {
            last.print_requests();
            model(&runs, &fit);
        }
    }
}

/// What one fleet of `n` cost over the window.
struct Run {
    announcer: Announcer,
    n: usize,
    window: Duration,
    /// Every guard's counts over the window, by (verb, resource).
    by: BTreeMap<(IpAddr, &'static str, String), Counts>,
    /// CPU of each guard over the window, % of a core.
    cpu_pct: Vec<f64>,
    rss_kib: Vec<u64>,
    /// Watch events sent to the fleet while one more guard joined, then left.
    join_events: u64,
    leave_events: u64,
    join_bytes: u64,
    /// A mass failover (every Lease moved at once): each guard's writes of
    /// its ArpGuardNode and their bytes, over [`FAILOVER_WINDOW`].
    failover_writes: Vec<u64>,
    failover_bytes: u64,
}

/// How long a mass failover's writes are counted: the findings' interval
/// (10 s) and its random part (2 s), and a second to spare.
const FAILOVER_WINDOW: Duration = Duration::from_secs(13);

/// The same verb/resource counts summed over guards.
fn total<'a>(it: impl Iterator<Item = &'a Counts>) -> Counts {
    let mut c = Counts::default();
    for x in it {
        c += *x;
    }
    c
}

impl Run {
    fn secs(&self) -> f64 {
        self.window.as_secs_f64()
    }

    /// The fleet's counts over the window.
    fn fleet(&self) -> Counts {
        total(self.by.values())
    }

    /// Requests per guard and second with the default watch timeout: the
    /// watches' scaled, the rest as counted.
    fn per_guard_at_default(&self) -> f64 {
        let watches = self.per_guard_verb("watch");
        self.per_guard()[0] - watches + watches * WATCH_SCALE
    }

    /// The row's label.
    fn label(&self) -> String {
        format!("{}_{}_guards", self.announcer.name(), self.n)
    }

    /// Per guard and second: requests, bytes, events, bookmarks (as a
    /// real server sends them, every minute).
    fn per_guard(&self) -> [f64; 4] {
        let c = self.fleet();
        let d = self.n as f64 * self.secs();
        [
            c.requests as f64 / d,
            c.bytes as f64 / d,
            c.events as f64 / d,
            c.bookmarks as f64 * BOOKMARK_SCALE / d,
        ]
    }

    /// Requests per guard and second of the verbs that are no watch.
    fn per_guard_verb(&self, verb: &str) -> f64 {
        let c = total(
            (self.by.iter())
                .filter(|((_, v, _), _)| *v == verb)
                .map(|(_, c)| c),
        );
        c.requests as f64 / (self.n as f64 * self.secs())
    }

    fn print(&self, fit: &Fit) {
        let [req, bytes, events, bookmarks] = self.per_guard();
        let quorum = self.fleet().quorum as f64 / (self.n as f64 * self.secs());
        let cpu = self.cpu_pct.iter().sum::<f64>() / self.cpu_pct.len().max(1) as f64;
        let cpu_max = self.cpu_pct.iter().copied().fold(0.0, f64::max);
        let rss = self.rss_kib.iter().max().copied().unwrap_or(0) as f64 / 1024.0;
        let n = self.n;
        let label = self.label();
        let at_default = self.per_guard_at_default();
        println!(
            "[fleet {label}] per guard: {req:.3} req/s ({at_default:.4} with the default watch timeout), {bytes:.0} B/s, {events:.3} watch events/s, {bookmarks:.3} bookmarks/s; \
             lists {:.4}/s, GETs {:.4}/s, writes {:.4}/s; CPU {cpu:.3} % of a core (max {cpu_max:.3}); \
             a guard joining: {} watch events to the fleet ({:.2} per guard), leaving: {}",
            self.per_guard_verb("list"),
            self.per_guard_verb("get"),
            self.per_guard_verb("create") + self.per_guard_verb("update") + self.per_guard_verb("patch"),
            self.join_events,
            self.join_events as f64 / n as f64,
            self.leave_events,
        );
        println!(
            "RESULT fleet {label} window_s={:.0} req/s_per_guard={req:.3} req/s_per_guard_at_default={at_default:.4} B/s_per_guard={bytes:.0} watch_events/s_per_guard={events:.3} bookmarks/s_per_guard={bookmarks:.3} lists/s_per_guard={:.4} GETs/s_per_guard={:.4} quorum_reads/s_per_guard={quorum:.4} writes/s_per_guard={:.4} fleet_req/s={:.2} fleet_B/s={:.0} CPU_%_per_guard={cpu:.3} CPU_%_max={cpu_max:.3} RSS_MiB_max={rss:.1} join_events={} join_events_per_guard={:.2} join_B={} leave_events={} growth_req={:.2} growth_B={:.2}",
            self.secs(),
            self.per_guard_verb("list"),
            self.per_guard_verb("get"),
            self.per_guard_verb("create") + self.per_guard_verb("update") + self.per_guard_verb("patch"),
            req * n as f64,
            bytes * n as f64,
            self.join_events,
            self.join_events as f64 / n as f64,
            self.join_bytes,
            self.leave_events,
            fit.req,
            fit.bytes,
        );
    }

    /// The mass failover: each guard's writes of its findings, against the
    /// announcer's own (one Lease write per Service moved).
    fn print_failover(&self) {
        let w = &self.failover_writes;
        let (max, sum) = (w.iter().max().copied().unwrap_or(0), w.iter().sum::<u64>());
        println!(
            "RESULT fleet_failover {} window_s={} report_writes_per_guard_max={max} report_writes_fleet={sum} \
             report_B_per_write={:.0} announcer_writes={SERVICES}",
            self.label(),
            FAILOVER_WINDOW.as_secs(),
            self.failover_bytes as f64 / sum.max(1) as f64,
        );
    }

    /// Per guard, by verb and resource.
    fn print_requests(&self) {
        let mut by: BTreeMap<(&str, &str), Counts> = BTreeMap::new();
        for ((_, verb, res), c) in &self.by {
            *by.entry((verb, res.as_str())).or_default() += *c;
        }
        let d = self.n as f64 * self.secs();
        for ((verb, res), c) in by {
            println!(
                "RESULT fleet_requests {verb}_{}_({}) req/s_per_guard={:.4} req/s_per_guard_at_default={:.4} B/s_per_guard={:.1} watch_events/s_per_guard={:.4} bookmarks/s_per_guard={:.4}",
                res.replace(' ', "_"),
                self.label(),
                c.requests as f64 / d,
                c.requests as f64 / d * if verb == "watch" { WATCH_SCALE } else { 1.0 },
                c.bytes as f64 / d,
                c.events as f64 / d,
                c.bookmarks as f64 * BOOKMARK_SCALE / d,
            );
        }
    }
}

/// The growth of the per-guard figures with N: the slope of log(figure)
/// against log(N) by least squares (0: flat; 1: doubles with N).
struct Fit {
    req: f64,
    bytes: f64,
    events: f64,
}

impl Fit {
    fn of(runs: &[Run]) -> Fit {
        Fit {
            req: slope(runs, &|r| r.per_guard()[0]),
            bytes: slope(runs, &|r| r.per_guard()[1]),
            events: slope(runs, &|r| r.per_guard()[2] + r.per_guard()[3]),
        }
    }
}

/// The slope of log(f) against log(N); 0 where f is 0 at every N (nothing
/// to grow), NaN where it is 0 at some N only (no power law fits).
fn slope(runs: &[Run], f: &dyn Fn(&Run) -> f64) -> f64 {
    let ys: Vec<f64> = runs.iter().map(f).collect();
    if ys.iter().all(|y| *y == 0.0) {
        return 0.0;
    }
    if ys.iter().any(|y| *y <= 0.0) || runs.len() < 2 {
        return f64::NAN;
    }
    let pts: Vec<(f64, f64)> = (runs.iter().zip(&ys))
        .map(|(r, y)| ((r.n as f64).ln(), y.ln()))
        .collect();
    let k = pts.len() as f64;
    let mx = pts.iter().map(|p| p.0).sum::<f64>() / k;
    let my = pts.iter().map(|p| p.1).sum::<f64>() / k;
    let sxx: f64 = pts.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = pts.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    sxy / sxx
}

/// The fleet at 100, 1,000 and 5,000 nodes, from the largest run's per-guard
/// figures grown by the fitted exponents, next to the announcers' own load.
fn model(runs: &[Run], fit: &Fit) {
    let Some(last) = runs.last() else { return };
    if runs.len() < 2 {
        // One size (the short run): no growth can be fitted, and its few
        // seconds hold the guards' start-up writes; a model grown from it
        // would read as the fleet's figures and be nothing of the kind.
        println!(
            "fleet_model: not modelled from one fleet size ({} guards, {:.0} s window); the full run's model is in BENCHMARKS.md",
            last.n,
            last.window.as_secs_f64()
        );
        return;
    }
    let [_, bytes, events, bookmarks] = last.per_guard();
    let req = last.per_guard_at_default();
    let join_per_guard = last.join_events as f64 / last.n as f64;
    let writes_per_guard = last.failover_writes.iter().max().copied().unwrap_or(0) as f64;
    for nodes in [100usize, 1_000, 5_000] {
        // Flat figures stay what the largest fleet measured; one that grows
        // (or fits no power law) is grown by the exponent measured, at
        // least linearly when unknown: the model errs high, never low.
        let grow = |e: f64| {
            let e = if e.is_nan() { 1.0 } else { e.max(0.0) };
            (nodes as f64 / last.n as f64).powf(e)
        };
        let g_req = req * grow(fit.req);
        let g_bytes = bytes * grow(fit.bytes);
        let g_events = (events + bookmarks) * grow(fit.events);
        // Cilium L2 announcements, 300 Services, retry period 2 s: one Lease
        // write per Service per 2 s, and every candidate node's GET of each
        // Lease it does not hold per retry (client-go's leader election).
        let cilium_writes = SERVICES as f64 / 2.0;
        let cilium_gets = nodes as f64 * SERVICES as f64 / 2.0;
        println!(
            "RESULT fleet_model {}_{nodes}_nodes guards_req/s={:.1} guards_B/s={:.0} guards_watch_events+bookmarks/s={:.1} \
             a_guard_joining_or_leaving_events={:.0} cilium_300_Services_Lease_writes/s={cilium_writes:.0} \
             cilium_candidate_GETs/s={cilium_gets:.0} guards_req/s_vs_cilium_writes={:.2} metallb_ServiceL2Status_writes_per_move=2 \
             mass_failover_findings_writes={:.0} mass_failover_findings_writes/s={:.0}",
            last.announcer.name(),
            g_req * nodes as f64,
            g_bytes * nodes as f64,
            g_events * nodes as f64,
            join_per_guard * nodes as f64,
            g_req * nodes as f64 / cilium_writes,
            writes_per_guard * nodes as f64,
            writes_per_guard * nodes as f64 / FAILOVER_WINDOW.as_secs_f64(),
        );
    }
}

fn lease(i: usize, holder: &str) -> serde_json::Value {
    let mut l = objects::lease(
        "default",
        &format!("kubevip-svc-{i}"),
        holder,
        3600,
        &objects::renew_now(),
    );
    l["metadata"]["managedFields"] = serde_json::json!([objects::managed_field(
        "kube-vip",
        "Update",
        serde_json::json!({"f:spec": {"f:acquireTime": {}, "f:holderIdentity": {},
            "f:leaseDurationSeconds": {}, "f:leaseTransitions": {}, "f:renewTime": {}}})
    )]);
    l
}

/// Service `i`'s LB IP: 198.51.100.100-255, then 203.0.113.100-243 (the
/// test ranges; the bed's nodes, peer and API use .1-.43 of each).
fn service_ip(i: usize) -> String {
    match i {
        0..156 => format!("198.51.100.{}", 100 + i),
        _ => format!("203.0.113.{}", 100 + i - 156),
    }
}

fn args(announcer: Announcer) -> Vec<&'static str> {
    vec![
        "--announcer",
        announcer.name(),
        "--presence-namespace",
        PRESENCE_NS,
        "--kube-watch-timeout",
        BENCH_WATCH,
    ]
}

/// One fleet of `n` following `announcer`: started, settled, measured over
/// `window`; then one more guard joins and leaves; then every owner moves.
fn run(announcer: Announcer, n: usize, window: Duration) -> Run {
    let tag = match announcer {
        Announcer::KubeVip => format!("flt{n}"),
        Announcer::MetalLb => format!("flm{n}"),
    };
    let mut bed = ClusterBed::fleet(&tag, n + 1, &[]).unwrap();
    // The DaemonSet's default: the uplinks chosen by the guard (its Node
    // read once, the announcer's interfaces followed).
    bed.uplinks = "auto".into();
    bed.api.set_bookmark_every(BENCH_BOOKMARK);
    bed.kubelet.set_every(Duration::from_secs(5));
    bed.api.preload(
        Resource::Services,
        (0..SERVICES).map(|i| objects::service("default", &format!("svc-{i}"), &[&service_ip(i)])),
    );
    let owners: Vec<_> = (0..SERVICES)
        .map(|i| announcer.owner(i, &bed.nodes[i % n].name))
        .collect();
    let kind = owners[0].0;
    bed.api.preload(kind, owners.into_iter().map(|(_, o)| o));
    // Each owner holds its IPs on its uplink, as kube-vip puts them: its
    // kernel answers the active census, so nothing is found and no Event is
    // posted (a fleet at rest).
    for (i, node) in bed.nodes.iter().enumerate().take(n) {
        for k in (i..SERVICES).step_by(n) {
            node.ns
                .ip(&[
                    "addr",
                    "add",
                    &format!("{}/32", service_ip(k)),
                    "dev",
                    "eth0",
                ])
                .unwrap();
        }
    }
    let wrapper = daemonset_wrapper();
    let args = args(announcer);
    let guards: Vec<Daemon> = (0..n)
        .map(|i| {
            bed.start_on_wrapped(i, &wrapper, &args, Duration::from_secs(60))
                .unwrap()
        })
        .collect();
    // Settled: every guard live to the others, its record written once.
    std::thread::sleep(Duration::from_secs(if short() { 5 } else { 20 }));
    bed.api.reset_tally();
    let c0: Vec<Duration> = guards.iter().map(Daemon::cpu_time).collect();
    let t0 = Instant::now();
    std::thread::sleep(window);
    let by = bed.api.tally();
    let wall = t0.elapsed();
    let cpu_pct = (guards.iter().zip(&c0))
        .map(|(g, c)| (g.cpu_time() - *c).as_secs_f64() / wall.as_secs_f64() * 100.0)
        .collect();
    let rss_kib = guards.iter().map(Daemon::rss_kib).collect();
    // One more guard joins (its record, its Pod Ready) and, a while later,
    // leaves (SIGTERM: its Lease deleted, its Pod not Ready).
    bed.api.reset_tally();
    let mut extra = bed
        .start_on_wrapped(n, &wrapper, &args, Duration::from_secs(60))
        .unwrap();
    std::thread::sleep(Duration::from_secs(if short() { 6 } else { 12 }));
    let joined = bed.api.tally();
    bed.api.reset_tally();
    extra.stop(libc::SIGTERM, Duration::from_secs(10)).unwrap();
    std::thread::sleep(Duration::from_secs(if short() { 4 } else { 8 }));
    let left = bed.api.tally();
    // What the others received (the newcomer's own list and watches apart).
    let newcomer: IpAddr = format!("203.0.113.{}", 11 + n).parse().unwrap();
    let to_others = |t: &BTreeMap<(IpAddr, &'static str, String), Counts>| {
        total(
            (t.iter())
                .filter(|((ip, _, _), _)| *ip != newcomer)
                .map(|(_, c)| c),
        )
    };
    let (j, l) = (to_others(&joined), to_others(&left));
    // A mass failover: every Lease to the next node at once (a partition
    // healing, a rolling restart of the announcer): every guard's findings
    // change; each writes its ArpGuardNode at most once per interval.
    bed.api.reset_tally();
    for i in 0..SERVICES {
        let (kind, moved) = announcer.owner(i, &bed.nodes[(i + 1) % n].name);
        bed.api.apply(kind, moved);
    }
    std::thread::sleep(FAILOVER_WINDOW);
    let failover = bed.api.tally();
    let report = |ip: &IpAddr| {
        total(
            (failover.iter())
                .filter(|((by, v, r), _)| by == ip && *v != "get" && r == "arpguardnodes")
                .map(|(_, c)| c),
        )
    };
    let guard_ips: Vec<IpAddr> = (0..n)
        .map(|i| format!("203.0.113.{}", 11 + i).parse().unwrap())
        .collect();
    let failover_writes = guard_ips.iter().map(|ip| report(ip).requests).collect();
    let failover_bytes = guard_ips.iter().map(|ip| report(ip).bytes).sum();
    drop(guards);
    Run {
        announcer,
        n,
        window: wall,
        by: by
            .into_iter()
            .filter(|((ip, _, _), _)| *ip != newcomer)
            .collect(),
        cpu_pct,
        rss_kib,
        join_events: j.events,
        leave_events: l.events,
        join_bytes: j.bytes,
        failover_writes,
        failover_bytes,
    }
}
