//! `sudo cargo bench -p arp-guard-tests --bench probing`: the active
//! census's traffic (issue 23 §3). Two tables:
//!
//! - `probing_traffic`: by calculation from the rate rules, with the
//!   model's own functions and the flags' defaults (`--probe-interval 30s
//!   --probe-askers 2 --probe-max-per-second 10
//!   --probe-cluster-max-per-second 100`): for 300, 10,000 and 65,536 LB
//!   IPs on 3, 100 and 1,000 live guards, IP `i` owned by node `i % N`,
//!   each IP's askers computed by rendezvous hashing (`askers`, checked
//!   against the `asks` every guard runs), each node's interval stretched
//!   by `Pace::interval_for` from its own share: requests a second per node
//!   and cluster-wide, replies a second per owner, bytes a second on the
//!   wire (frame + FCS + preamble and gap) sent per node and received by
//!   every node (requests are broadcast: ARP to ff:ff:ff:ff:ff:ff, an NS to
//!   a solicited-node group a switch floods unless it snoops MLD).
//! - `probing_measured`: the small case on the wire: a ClusterBed whose
//!   300 LB IPs are all owned by node-c (no guard), node-a and node-b
//!   guarding with the default pace; the ARP probes (sender 0.0.0.0) the
//!   peer receives by asker MAC over a window, against the model's
//!   prediction for that bed; and the daemons' CPU time (/proc/PID/stat)
//!   over the same window. Three beds side by side, at the same time: the
//!   default pace, `--probe-max-per-second 2` (the fixed and the
//!   per-request parts of the CPU apart) and `--probe-interval 0`.
//!
//! `BENCH_SHORT=1`: a 12 s window, and the largest cases hashed on a
//! sample of their IPs (a dev build hashes ~20x slower). Output: `RESULT
//! <table> <row> key=value ...`.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    time::{Duration, Instant},
};

use guard::testing::{probe_askers, probe_asks, probe_pace, probe_request_frame, Pace};
use testbed::{
    cluster_bed::ClusterBed,
    fake_api::{objects, Resource},
    wait_for, Daemon, RawSocket,
};

/// Preamble, start delimiter and the inter-frame gap: what a frame costs
/// on the wire besides its bytes and FCS.
const WIRE_OVERHEAD: usize = 8 + 12;
const FCS: usize = 4;

/// Bytes on the wire of the request for `ip` (padded to Ethernet's
/// minimum of 60 bytes before the FCS).
fn on_wire(ip: IpAddr) -> usize {
    let (_, n) = probe_request_frame(
        [2, 0, 0, 0, 0, 1],
        Ipv4Addr::UNSPECIFIED,
        "fe80::1".parse().unwrap(),
        ip,
    );
    assert!(n > 0, "no request frame for {ip}");
    n.max(60) + FCS + WIRE_OVERHEAD
}

/// What the rules give for one cluster.
struct Traffic {
    /// Each node's share (IPs it asks) and its requests a second.
    asked: Vec<f64>,
    rate: Vec<f64>,
    /// Each node's interval, seconds.
    interval: Vec<f64>,
    /// Replies a second each node sends as the owner of its IPs.
    replies: Vec<f64>,
    /// One IP in `step` was hashed (the shares scaled up).
    step: usize,
}

fn lb_ip(i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(0x0a40_0000 + i as u32))
}

/// The shares and rates of `ips` LB IPs over `n` live guards, IP `i` owned
/// by node `i % n`; one IP in `step` hashed.
fn traffic(pace: &Pace, ips: usize, n: usize, step: usize) -> Traffic {
    let live: Vec<String> = (0..n).map(|i| format!("node-{i}")).collect();
    let index: BTreeMap<&str, usize> = live.iter().enumerate().map(|(i, s)| (&**s, i)).collect();
    let mut asked = vec![0usize; n];
    let mut who: Vec<(usize, Vec<usize>)> = Vec::new();
    for i in (0..ips).step_by(step) {
        let owner = &live[i % n];
        let a: Vec<usize> = probe_askers(lb_ip(i), &live, Some(owner), pace.askers)
            .iter()
            .map(|s| index[s.as_str()])
            .collect();
        for x in &a {
            asked[*x] += step;
        }
        who.push((i % n, a));
    }
    // What every guard runs decides the same: for the first IPs hashed,
    // each node's `asks` against the askers found.
    for (j, (owner, a)) in who.iter().enumerate().take(16) {
        let ip = lb_ip(j * step);
        for (x, node) in live.iter().enumerate() {
            assert_eq!(
                probe_asks(node, ip, &live, Some(&live[*owner]), pace.askers),
                a.contains(&x),
                "{node} and {ip}: asks disagrees with askers {a:?}"
            );
        }
    }
    let interval: Vec<f64> = (asked.iter())
        .map(|m| pace.interval_for(ips, *m).as_secs_f64())
        .collect();
    let rate: Vec<f64> = (0..n).map(|x| asked[x] as f64 / interval[x]).collect();
    let mut replies = vec![0.0; n];
    for (owner, a) in &who {
        replies[*owner] += a.iter().map(|x| step as f64 / interval[*x]).sum::<f64>();
    }
    Traffic {
        asked: asked.iter().map(|a| *a as f64).collect(),
        rate,
        interval,
        replies,
        step,
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

fn min(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::INFINITY, f64::min)
}

fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(0.0, f64::max)
}

/// `a` or `a–b`, with `d` decimals.
fn range(v: &[f64], d: usize) -> String {
    let (lo, hi) = (format!("{:.d$}", min(v)), format!("{:.d$}", max(v)));
    if lo == hi {
        lo
    } else {
        format!("{lo}–{hi}")
    }
}

fn calculation(pace: &Pace, short: bool) {
    let (arp, ns) = (
        on_wire(lb_ip(0)),
        on_wire(IpAddr::V6("fd00::1".parse::<Ipv6Addr>().unwrap())),
    );
    println!(
        "pace: {:?} each IP, {} askers, at most {}/s a node and {}/s the cluster; on the wire: ARP request {arp} B, NS {ns} B",
        pace.interval, pace.askers, pace.node_max, pace.cluster_max
    );
    for ips in [300usize, 10_000, 65_536] {
        for n in [3usize, 100, 1000] {
            // Hashes to compute: every (IP, node) pair, or a sample of IPs
            // in a dev build.
            let budget: usize = if short { 3_000_000 } else { usize::MAX };
            let mut step = (ips * n).div_ceil(budget).max(1);
            // Coprime with the node count: the IPs hashed are owned by
            // every node alike.
            while step > 1 && gcd(step, n) != 1 {
                step += 1;
            }
            let t0 = Instant::now();
            let t = traffic(pace, ips, n, step);
            let cluster: f64 = t.rate.iter().sum();
            let hashed = if t.step == 1 {
                "all".to_owned()
            } else {
                format!("1_in_{}", t.step)
            };
            println!(
                "{ips:>6} IPs, {n:>4} nodes: interval {} s, asked {:.0} ({:.0}–{:.0}) per node, {:.2} ({:.2}–{:.2}) req/s per node, {cluster:.1} req/s cluster-wide ({:.1} s)",
                range(&t.interval, 0),
                mean(&t.asked),
                min(&t.asked),
                max(&t.asked),
                mean(&t.rate),
                min(&t.rate),
                max(&t.rate),
                t0.elapsed().as_secs_f64()
            );
            println!(
                "RESULT probing_traffic {ips}_IPs,_{n}_nodes interval_s={} asked_per_node={:.0} asked_per_node_min={:.0} asked_per_node_max={:.0} req/s_per_node={:.2} req/s_per_node_min={:.2} req/s_per_node_max={:.2} req/s_cluster={cluster:.1} replies/s_per_owner_max={:.2} sent_ARP_B/s_(busiest_node)={:.0} sent_NS_B/s_(busiest_node)={:.0} received_ARP_B/s_(every_node)={:.0} received_NS_B/s_(every_node)={:.0} hashed={hashed}",
                range(&t.interval, 0),
                mean(&t.asked),
                min(&t.asked),
                max(&t.asked),
                mean(&t.rate),
                min(&t.rate),
                max(&t.rate),
                max(&t.replies),
                max(&t.rate) * arp as f64,
                max(&t.rate) * ns as f64,
                cluster * arp as f64,
                cluster * ns as f64,
            );
        }
    }
}

/// LB IPs for the measured bed: 300 addresses of the documentation ranges
/// the beds may use, clear of the bed's own (.1, .11, .12).
fn bed_ips(n: usize) -> Vec<Ipv4Addr> {
    (100..=254)
        .map(|h| Ipv4Addr::new(198, 51, 100, h))
        .chain((100..=254).map(|h| Ipv4Addr::new(203, 0, 113, h)))
        .take(n)
        .collect()
}

/// A bed whose LB IPs are all owned by node-c (a Cilium Lease each, no
/// guard on node-c), with Nodes node-a, node-b and node-c.
fn bed(tag: &str, ips: &[Ipv4Addr]) -> ClusterBed {
    let bed = ClusterBed::new(tag, ips).unwrap();
    bed.api.preload(
        Resource::Services,
        (ips.iter().enumerate())
            .map(|(i, ip)| objects::service("default", &format!("web{i}"), &[&ip.to_string()])),
    );
    bed.api.preload(
        Resource::Leases,
        (0..ips.len()).map(|i| {
            objects::lease(
                "kube-system",
                &format!("cilium-l2announce-default-web{i}"),
                "node-c",
                3600,
                "2026-11-30T10:00:00.000000Z",
            )
        }),
    );
    for n in ["node-a", "node-b", "node-c"] {
        bed.api.apply(Resource::Nodes, objects::node(n));
    }
    bed
}

fn start(bed: &ClusterBed, more: &[&str]) -> Vec<Daemon> {
    let args: Vec<&str> = ["--announcer", "cilium", "--presence-namespace", "arp-guard"]
        .iter()
        .chain(more)
        .copied()
        .collect();
    (0..2)
        .map(|i| {
            bed.start_on(i, &args, Duration::from_secs(60))
                .unwrap_or_else(|e| panic!("starting the guard on node {i}: {e:#}"))
        })
        .collect()
}

/// Node `i`'s `/probes`, if it answers.
fn probes(bed: &ClusterBed, i: usize) -> Option<serde_json::Value> {
    let (code, body) = bed.nodes[i]
        .ns
        .enter(|| guard::testing::get("127.0.0.1:9477".parse().unwrap(), "/probes"))
        .ok()?;
    (code == 200).then(|| serde_json::from_str(&body).ok())?
}

fn cpu(ds: &[Daemon]) -> Vec<Duration> {
    ds.iter().map(Daemon::cpu_time).collect()
}

/// One bed of the measured case, its guards started with `flags`.
struct Run {
    row: &'static str,
    pace: Option<Pace>,
    // Dropped in this order: the guards stopped before their bed goes.
    guards: Vec<Daemon>,
    wire: RawSocket,
    bed: ClusterBed,
    /// CPU at the window's start; requests by node and CPU ms over it.
    cpu0: Vec<Duration>,
    sent: [usize; 2],
    cpu_ms: Vec<f64>,
}

impl Run {
    fn start(tag: &str, row: &'static str, flags: &[&str], ips: &[Ipv4Addr]) -> Run {
        let bed = bed(tag, ips);
        let guards = start(&bed, flags);
        let wire = RawSocket::open(&bed.peer, "eth0").unwrap();
        Run {
            row,
            pace: probe_pace(flags).expect("the bench's flags"),
            guards,
            wire,
            bed,
            cpu0: Vec::new(),
            sent: [0; 2],
            cpu_ms: Vec::new(),
        }
    }

    /// The model's requests a second for each guard of this bed: two live
    /// guards, every IP owned by node-c.
    fn predicted(&self, ips: &[Ipv4Addr]) -> Vec<f64> {
        let Some(pace) = self.pace else {
            return vec![0.0; 2];
        };
        let live = vec!["node-a".to_string(), "node-b".to_string()];
        (live.iter())
            .map(|node| {
                let m = (ips.iter())
                    .filter(|ip| {
                        probe_asks(node, IpAddr::V4(**ip), &live, Some("node-c"), pace.askers)
                    })
                    .count();
                m as f64 / pace.interval_for(ips.len(), m).as_secs_f64()
            })
            .collect()
    }

    fn live(&self) -> bool {
        let n = |i| probes(&self.bed, i).map_or(0, |p| p["live_guards"].as_u64().unwrap_or(0));
        self.pace.is_none() || (n(0) == 2 && n(1) == 2)
    }

    /// The ARP probes (sender 0.0.0.0) the peer received, by asker.
    fn count(&mut self) {
        let frames = self.wire.collect_arp(Duration::from_millis(100)).unwrap();
        for f in frames
            .iter()
            .filter(|f| f.op == 1 && f.spa == Ipv4Addr::UNSPECIFIED)
        {
            if let Some(i) = self.bed.nodes.iter().position(|x| x.mac == f.sha) {
                self.sent[i] += 1;
            }
        }
    }
}

fn measured(short: bool) {
    let ips = bed_ips(300);
    let window = Duration::from_secs(if short { 12 } else { 120 });
    // Side by side, at the same time: the default pace, a node cap of 2 a
    // second (the fixed and the per-request parts of the CPU apart), off.
    let mut runs = [
        Run::start("pbm", "default_pace", &[], &ips),
        Run::start(
            "pbl",
            "max_2/s_a_node",
            &["--probe-max-per-second", "2"],
            &ips,
        ),
        Run::start("pbo", "off", &["--probe-interval", "0"], &ips),
    ];
    wait_for(Duration::from_secs(60), || {
        runs.iter().all(Run::live).then_some(())
    })
    .expect("the guards live and asking");
    // One re-plan after both records are live.
    std::thread::sleep(Duration::from_secs(6));
    for r in &mut runs {
        r.wire.drain();
        r.cpu0 = cpu(&r.guards);
    }
    let end = Instant::now() + window;
    while Instant::now() < end {
        for r in &mut runs {
            r.count();
        }
    }
    for r in &mut runs {
        r.count();
        r.cpu_ms = (cpu(&r.guards).iter().zip(&r.cpu0))
            .map(|(b, a)| (*b - *a).as_secs_f64() * 1000.0)
            .collect();
    }
    let secs = window.as_secs_f64();
    let off_ms: f64 = runs[2].cpu_ms.iter().sum();
    for r in &runs {
        let predicted = r.predicted(&ips);
        let rate: Vec<f64> = r.sent.iter().map(|n| *n as f64 / secs).collect();
        let on_ms: f64 = r.cpu_ms.iter().sum();
        let requests: usize = r.sent.iter().sum();
        for i in 0..2 {
            println!(
                "{} {}: {} requests in {secs:.0} s = {:.2}/s, predicted {:.2}/s; CPU {:.0} ms",
                r.row, r.bed.nodes[i].name, r.sent[i], rate[i], predicted[i], r.cpu_ms[i]
            );
        }
        let per_request = if requests == 0 {
            "-".to_owned()
        } else {
            format!("{:.0}", (on_ms - off_ms) * 1000.0 / requests as f64)
        };
        let ratio = if mean(&predicted) > 0.0 {
            format!("{:.3}", mean(&rate) / mean(&predicted))
        } else {
            "-".to_owned()
        };
        println!(
            "RESULT probing_measured {} predicted_req/s_per_node={:.2} measured_req/s_per_node={:.2} measured_req/s_per_node_min={:.2} measured_req/s_per_node_max={:.2} measured/predicted={ratio} window_s={secs:.0} CPU_ms_(both_guards)={on_ms:.0} CPU_%_of_a_core_per_guard={:.3} CPU_vs_off={:.2} CPU_µs_per_request_above_off={per_request}",
            r.row,
            mean(&predicted),
            mean(&rate),
            min(&rate),
            max(&rate),
            on_ms / 2.0 / secs / 10.0,
            on_ms / off_ms.max(f64::MIN_POSITIVE),
        );
    }
}

fn main() {
    testbed::require_root();
    let short = testbed::bench::short();
    let pace = probe_pace(&[])
        .expect("the default flags")
        .expect("probing is on by default");
    calculation(&pace, short);
    measured(short);
}
