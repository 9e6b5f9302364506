//! `cargo xtask bench --only plugin`: `kubectl arp-guard status` at 1,000
//! and 5,000 nodes, end to end: Debian's kubectl running the plugin from
//! the management network against the fake API server holding one
//! ArpGuardNode per node (each owning an LB IP with its takeover, one in
//! fifty with a conflict, one in ten with clients still reaching it), the
//! guard Pods and the Nodes (read as server-side Tables), one LoadBalancer
//! Service per node and a few Events. Timed as a whole command (wall
//! clock), and what the plugin read, from the fake API's tally of the bytes
//! it sent to the laptop. Goals (issue 43): ≤ 2 s and ≤ 50 MB at 5,000.
//!
//! Table `plugin`: per size, the command's seconds (median/min/max of the
//! runs), MB read, requests.

use std::time::Duration;

use serde_json::{json, Value};
use testbed::{
    bench::{short, Samples},
    cluster_bed::{ClusterBed, PRESENCE_NS},
    fake_api::{objects, Resource},
    laptop::Laptop,
};

fn node(i: usize) -> String {
    format!("node-{i:05}")
}

/// Node `i`'s LB IP (unique per node: 10.x addresses are only data here,
/// nothing sends to them).
fn lb_ip(i: usize) -> String {
    format!("10.{}.{}.{}", 100 + i / 65536, (i / 256) % 256, i % 256)
}

fn report(i: usize, now: &str) -> Value {
    let n = node(i);
    let mut status = json!({
        "mode": "enforce", "health": "enforcing", "version": "0.1.0",
        "uplinks": [{"name": "bond0", "chosenBy": ["default route", "holds the node's address 10.0.0.1"]}],
        "uplinkNames": "bond0",
        "owned": [{"ip": lb_ip(i), "service": format!("default/svc-{i}"),
                   "takeover": {"at": now, "firstAnnouncementMs": 12, "silent": false}}],
        "ownedCount": 1, "conflictCount": 0, "staleClients": 0,
        "lastTakeover": now, "updated": now,
    });
    if i.is_multiple_of(50) {
        status["conflicts"] = json!([{"ip": lb_ip(i + 1), "reason": "contested",
            "claimants": [node(i + 1), "02:00:5e:00:53:99 (no guard lists it)"]}]);
        status["conflictCount"] = json!(1);
    }
    if i.is_multiple_of(10) {
        status["clients"] = json!([{"ip": lb_ip(i + 2), "sending": 3, "stale": 1, "since": now}]);
        status["staleClients"] = json!(1);
    }
    json!({
        "metadata": {"name": n, "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": n, "uid": format!("uid-{i}")}]},
        "status": status,
    })
}

struct Run {
    n: usize,
    secs: Samples,
    mb: f64,
    requests: u64,
}

fn run(n: usize, samples: usize) -> Run {
    let bed = ClusterBed::with_nodes(&format!("plg{n}"), &[], 1).unwrap();
    let now = objects::renew_now();
    bed.api
        .preload(Resource::GuardNodes, (0..n).map(|i| report(i, &now)));
    bed.api.preload(
        Resource::Pods,
        (0..n).map(|i| {
            let mut p = objects::guard_pod(PRESENCE_NS, &node(i), true);
            p["metadata"]["name"] = json!(format!("arp-guard-{i:05}"));
            p
        }),
    );
    bed.api.preload(
        Resource::Nodes,
        (0..n).map(|i| objects::node_with_ips(&node(i), &["10.0.0.1"])),
    );
    bed.api.preload(
        Resource::Services,
        (0..n).map(|i| objects::service("default", &format!("svc-{i}"), &[&lb_ip(i)])),
    );
    let laptop = Laptop::new(&bed);
    let laptop_ip: std::net::IpAddr = "203.0.113.1".parse().unwrap();
    let mut secs = Samples::new();
    let (mut bytes, mut requests) = (0, 0);
    for _ in 0..samples {
        bed.api.reset_tally();
        let r = laptop.run_quiet(&["status", "-o", "json"]);
        assert!(matches!(r.code, 0 | 1), "{}", r.err);
        let doc: Value = serde_json::from_str(&r.out).expect("JSON");
        assert!(doc["ips"].as_array().map_or(0, Vec::len) >= n, "every IP");
        secs.push(r.took.as_secs_f64());
        let tally = bed.api.tally();
        let mine = tally.iter().filter(|((ip, _, _), _)| *ip == laptop_ip);
        (bytes, requests) = mine.fold((0, 0), |(b, q), (_, c)| (b + c.bytes, q + c.requests));
    }
    Run {
        n,
        secs,
        mb: bytes as f64 / 1e6,
        requests,
    }
}

fn main() {
    testbed::require_root();
    let samples = if short() { 1 } else { 5 };
    for n in [1_000, 5_000] {
        let r = run(n, samples);
        println!(
            "[plugin {}] kubectl arp-guard status -o json: {:.2} s (min {:.2}, max {:.2}), read {:.1} MB in {} requests",
            r.n,
            r.secs.median(),
            r.secs.min(),
            r.secs.max(),
            r.mb,
            r.requests
        );
        println!(
            "RESULT plugin {}_nodes status_s={} MB_read={:.1} requests={}",
            r.n,
            r.secs.spread_with(2),
            r.mb,
            r.requests
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
