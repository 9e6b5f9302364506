//! Every shipped alert fires where it should (issue 42), for the guard's own
//! health: what it reads from the API, what it posts there and its memory.
//! A ClusterBed with real guards, scraped every second, the shipped
//! PrometheusRule evaluated by promtool on those series
//! ([`testbed::alerting`]); see `alerts_fire.rs` for the datapath's alerts.
//!
//! One scenario: a Lease the guards cannot decode (ArpGuardUndecodableObjects),
//! an API server that refuses Events while a split-brain speaker gives node-b
//! something to report (ArpGuardKubeEventsFailing), node-a's memory near
//! its cgroup's limit (a fake cgroup tree, `--cgroup-root`: nothing is
//! killed; ArpGuardMemoryNearLimit, ArpGuardMemoryPressure), and at last
//! the API server gone (ArpGuardFeedStale).

use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use serde_json::json;
use testbed::{
    alerting::{end_of, firing, for_of, Firing, Proof, STEP},
    cluster_bed::{ClusterBed, LEASE_RENEWED},
    fake_api::{objects, Resource},
    promtool::{self, counter_like, Expect},
    scrape::Scraper,
    ArpSpec, Daemon, Netns, RawSocket,
};

const WEB: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 150);

/// Where this process's (and so the daemon's) cgroup v2 `memory.max` is
/// under `root`.
fn memory_max(root: &Path) -> PathBuf {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let path = (cgroups.lines())
        .find_map(|l| l.strip_prefix("0::"))
        .unwrap_or("/");
    let dir = root.join(path.trim_start_matches('/'));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("memory.max")
}

/// What the cgroup counts of node `ns`'s daemon now, from its `/status`.
fn used(ns: &Netns) -> u64 {
    let (_, body) = ns
        .enter(|| Ok(testbed::http_get("127.0.0.1:9477", "/status")))
        .unwrap();
    let st: serde_json::Value = serde_json::from_str(&body).unwrap();
    let m = &st["memory"];
    m["rss_bytes"].as_u64().unwrap_or(0) + m["maps_bytes"].as_u64().unwrap_or(0)
}

/// Clears a flag however the scope ends (a panic too).
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// A Lease whose duration is a string: a real API server would refuse it,
/// a guard skips it (and says so).
fn undecodable_lease(bed: &ClusterBed) {
    bed.api.apply(
        Resource::Services,
        objects::service("default", "old", &["198.51.100.151"]),
    );
    let mut lease = objects::cilium_lease("old", "node-b", 3600, LEASE_RENEWED);
    lease["spec"]["leaseDurationSeconds"] = json!("15");
    bed.api.apply(Resource::Leases, lease);
}

/// What the scenario fires once its scrapes end at `end`.
fn feed_alerts(spec: &serde_json::Value, end: Duration) -> Vec<Expect> {
    let fires = |alert: &str, each: &[Firing]| {
        let at = end + for_of(spec, alert) + Duration::from_secs(60);
        firing(spec, alert, at, each).unwrap()
    };
    // A comparison keeps the series' labels (job too).
    let job = |node| Firing::new(&[("instance", node), ("job", "arp-guard")], None);
    let stream = |node| Firing::new(&[("instance", node), ("stream", "leases")], None);
    vec![
        fires("ArpGuardFeedStale", &[job("node-a"), job("node-b")]),
        fires(
            "ArpGuardUndecodableObjects",
            &[stream("node-a"), stream("node-b")],
        ),
        fires("ArpGuardMemoryNearLimit", &[Firing::on("node-a")]),
        fires("ArpGuardMemoryPressure", &[job("node-a")]),
        // node-b has the split brain to tell, and cannot.
        fires("ArpGuardKubeEventsFailing", &[Firing::on("node-b")]),
    ]
}

/// The guards: node-a with a memory limit (`root`'s fake cgroup tree).
fn start_guards(bed: &ClusterBed, root: &str) -> [Daemon; 2] {
    let common = [
        "--announcer",
        "cilium",
        "--stale-after",
        "3s",
        "--split-brain-after",
        "2s",
        "--kube-events-interval",
        "1s",
    ];
    let sync = Duration::from_secs(20);
    let with_limit = [&common[..], &["--cgroup-root", root]].concat();
    [
        bed.start_on(0, &with_limit, sync).unwrap(),
        bed.start_on(1, &common, sync).unwrap(),
    ]
}

#[test]
fn a_blind_feed_and_memory_near_the_limit_page() {
    testbed::require_root();
    let bed = ClusterBed::new("aff", &[WEB]).unwrap();
    bed.cilium_service("web", &[&WEB.to_string()], "node-a", 3600);
    undecodable_lease(&bed);
    bed.api.set_events_refused(Some(403));
    let root = bed.dir.path().join("cgroup");
    let max = memory_max(&root);
    std::fs::write(&max, "8589934592\n").unwrap();
    let guards = start_guards(&bed, &root.to_string_lossy());
    let logs = || {
        format!(
            "node-a:\n{}\nnode-b:\n{}",
            guards[0].log_text(),
            guards[1].log_text()
        )
    };
    guards[0].expect_log("memory limit found", Duration::from_secs(15));
    let (a, b) = (&bed.nodes[0], &bed.nodes[1]);
    let scraper = Scraper::start(&[("node-a", &a.ns), ("node-b", &b.ns)], STEP).unwrap();
    // 97 % of a limit: past the warning, under pressure.
    std::fs::write(&max, format!("{}\n", used(&a.ns) * 100 / 97)).unwrap();
    let speaker = RawSocket::open(&b.ns, "eth0").unwrap();
    let stop = AtomicBool::new(false);
    let failed = |ns: &Netns| {
        let text = (ns.enter(|| Ok(testbed::http_get("127.0.0.1:9477", "/metrics"))))
            .unwrap()
            .1;
        (text.lines())
            .filter(|l| l.starts_with("arp_guard_kube_events_total{") && l.contains("\"failed\""))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum::<f64>()
    };
    std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        // node-b's speaker keeps announcing what node-a owns.
        s.spawn(|| {
            while !stop.load(Ordering::SeqCst) {
                let garp = ArpSpec::gratuitous(2, b.mac, WEB).to_bytes();
                speaker.send(&garp).unwrap();
                std::thread::sleep(Duration::from_millis(500));
            }
        });
        let seen = testbed::wait_until(Duration::from_secs(40), || {
            testbed::counter(&a.ns, "arp_guard_memory_pressure") == 1.0 && failed(&b.ns) >= 3.0
        });
        assert!(seen, "{}", logs());
        // The API server goes: blind, then degraded past --stale-after.
        bed.api.set_down(true);
        let degraded = testbed::wait_until(Duration::from_secs(20), || {
            [a, b]
                .iter()
                .all(|n| testbed::counter(&n.ns, "arp_guard_feed_degraded") == 1.0)
        });
        assert!(degraded, "{}", logs());
        std::thread::sleep(STEP * 4);
    });
    let samples = scraper.stop();
    let spec = promtool::shipped_rules().unwrap();
    let expect = feed_alerts(&spec, end_of(&samples));
    let proof = Proof {
        file: file!(),
        fired_by: guard::reference::FIRED_BY,
        grows: &counter_like,
        ages: &["arp_guard_feed_unhealthy_seconds"],
        expect,
    };
    if let Err(e) = proof.check(&spec, &samples) {
        panic!("{e:#}\n{}", logs());
    }
}
