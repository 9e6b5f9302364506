//! The daemon near its memory limit: it warns, then takes in no new
//! Kubernetes object while every IP it already guards stays guarded and
//! keeps following its owner; under the limit again, it takes in what it
//! skipped. The limit is a fake cgroup tree (`--cgroup-root`): a file the
//! kernel does not enforce, so nothing is ever killed here.

use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
    time::Duration,
};

use testbed::{
    cluster_bed::{check, ClusterBed},
    fake_api::{objects, Resource},
    wait_for,
};

const WEB: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 100);
/// Not on kube-ipvs0: guarded only if the cluster's Service is taken in.
const NEW: &str = "198.51.100.150";
/// The memory watch samples every 5 s.
const SAMPLE: Duration = Duration::from_secs(15);

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

fn status(bed: &ClusterBed) -> serde_json::Value {
    let (_, body) = bed.nodes[0]
        .ns
        .enter(|| guard::testing::get("127.0.0.1:9477".parse().unwrap(), "/status"))
        .unwrap();
    serde_json::from_str(&body).unwrap()
}

fn state(st: &serde_json::Value, ip: &str) -> Option<String> {
    (st["ips"].as_array().into_iter().flatten())
        .find(|r| r["ip"] == ip)
        .map(|r| r["state"].as_str().unwrap_or_default().to_owned())
}

fn metric(bed: &ClusterBed, series: &str) -> Option<f64> {
    let (_, body) = bed.nodes[0]
        .ns
        .enter(|| guard::testing::get("127.0.0.1:9477".parse().unwrap(), "/metrics"))
        .unwrap();
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

/// What the cgroup counts of the daemon now, from its `/status`.
fn used(bed: &ClusterBed) -> u64 {
    let m = &status(bed)["memory"];
    m["rss_bytes"].as_u64().unwrap() + m["maps_bytes"].as_u64().unwrap()
}

#[test]
fn near_the_limit_it_warns_then_takes_in_nothing_new_and_keeps_what_it_guards() {
    testbed::require_root();
    let bed = ClusterBed::new("mem", &[WEB]).unwrap();
    let lease = |svc: &str, holder: &str, renew: &str| {
        let name = format!("cilium-l2announce-default-{svc}");
        objects::lease("kube-system", &name, holder, 600, renew)
    };
    bed.api.apply(
        Resource::Services,
        objects::service("default", "web", &["198.51.100.100"]),
    );
    bed.api.apply(
        Resource::Leases,
        lease("web", "node-a", "2026-11-30T10:00:00.000000Z"),
    );
    let root = bed.dir.path().join("cgroup");
    let max = memory_max(&root);
    std::fs::write(&max, "8589934592\n").unwrap();
    let root_arg = root.to_string_lossy().into_owned();
    let guard = bed
        .start_on(
            0,
            &["--announcer", "cilium", "--cgroup-root", &root_arg],
            Duration::from_secs(20),
        )
        .unwrap();
    // node-b's guard as usual (the neighbour then shows who answers).
    let _b = bed
        .start_on(1, &["--announcer", "cilium"], Duration::from_secs(20))
        .unwrap();
    guard.expect_log("memory limit found", SAMPLE);
    check(bed.wait_answer(WEB, Some("node-a"), Duration::from_secs(8)));
    assert_eq!(status(&bed)["memory"]["level"], "ok");

    // 84 % of a limit: a warning, nothing else.
    std::fs::write(&max, format!("{}\n", used(&bed) * 100 / 84)).unwrap();
    guard.expect_log("memory approaching the cgroup limit", SAMPLE);
    assert_eq!(status(&bed)["memory"]["level"], "warning");
    assert_eq!(metric(&bed, "arp_guard_memory_pressure"), Some(0.0));

    // 97 %: no new object is taken in.
    std::fs::write(&max, format!("{}\n", used(&bed) * 100 / 97)).unwrap();
    guard.expect_log("memory near the cgroup limit", SAMPLE);
    assert_eq!(metric(&bed, "arp_guard_memory_pressure"), Some(1.0));
    // What the OOM entry of the troubleshooting page tells the operator to run.
    let bin = testbed::guard_binary();
    let out = bed.nodes[0]
        .ns
        .exec(&[bin.to_str().unwrap(), "status"])
        .unwrap();
    let line = out
        .lines()
        .find(|l| l.trim_start().starts_with("memory "))
        .unwrap_or_default();
    assert!(
        line.contains(" %): PRESSURE: no new Kubernetes object"),
        "{out}"
    );
    bed.api.apply(
        Resource::Services,
        objects::service("default", "new", &[NEW]),
    );
    bed.api.apply(
        Resource::Leases,
        lease("new", "node-a", "2026-11-30T10:00:01.000000Z"),
    );
    guard.expect_log("a new object is not taken in", Duration::from_secs(5));
    let skipped = "arp_guard_feed_not_admitted_total{stream=\"services\"}";
    assert!(metric(&bed, skipped).is_some_and(|n| n >= 1.0));
    assert_eq!(
        state(&status(&bed), NEW),
        None,
        "the new Service is not guarded"
    );
    // What is guarded stays guarded and follows its owner.
    bed.api.apply(
        Resource::Leases,
        lease("web", "node-b", "2026-11-30T10:00:02.000000Z"),
    );
    check(bed.wait_answer(WEB, Some("node-b"), Duration::from_secs(8)));
    assert_eq!(
        state(&status(&bed), "198.51.100.100").as_deref(),
        Some("foreign")
    );

    // Room again: the streams that skipped are relisted, the Service taken in.
    std::fs::write(&max, "8589934592\n").unwrap();
    guard.expect_log("memory well under the cgroup limit again", SAMPLE);
    let owned = wait_for(Duration::from_secs(10), || {
        (state(&status(&bed), NEW).as_deref() == Some("owned")).then_some(())
    });
    assert!(
        owned.is_some(),
        "taken in after the pressure: {}",
        status(&bed)
    );
    assert_eq!(metric(&bed, "arp_guard_memory_pressure"), Some(0.0));
}
