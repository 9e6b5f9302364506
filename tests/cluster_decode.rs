//! One object the guard cannot decode never blinds its stream: it is
//! skipped, counted and logged once, and the rest of the stream is read as
//! usual. What the skipped object decided fails open for the owner: an
//! unreadable Lease keeps its holder (as far as it can be read) on an
//! uncertain claim, so that the holder's node keeps answering and no other
//! node treats the IP as another's. Only the Services it decides are
//! touched; nothing degrades cluster-wide.

use std::{net::Ipv4Addr, time::Duration};

use serde_json::json;
use testbed::{
    cluster_bed::{check, ClusterBed},
    fake_api::{objects, Resource},
};

const WEB: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 100);
const API: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 101);
const DB: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 102);
const OLD: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 103);
const CHANGE: Duration = Duration::from_secs(8);

fn lease(svc: &str, holder: &str, renew: &str) -> serde_json::Value {
    objects::lease(
        "kube-system",
        &format!("cilium-l2announce-default-{svc}"),
        holder,
        600,
        renew,
    )
}

/// The guard's `/status` on node `i`.
fn status(bed: &ClusterBed, i: usize) -> serde_json::Value {
    let (_, body) = bed.nodes[i]
        .ns
        .enter(|| guard::testing::get("127.0.0.1:9477".parse().unwrap(), "/status"))
        .unwrap();
    serde_json::from_str(&body).unwrap()
}

fn row(st: &serde_json::Value, ip: Ipv4Addr) -> serde_json::Value {
    let ip = ip.to_string();
    (st["ips"].as_array().into_iter().flatten())
        .find(|r| r["ip"] == ip.as_str())
        .cloned()
        .unwrap_or_else(|| panic!("no {ip} in {st}"))
}

/// The Lease stream's count of unreadable objects, and whether the feed is
/// blind or degraded.
fn lease_stream(st: &serde_json::Value) -> (u64, bool, bool) {
    let feed = &st["feed"];
    let leases = (feed["streams"].as_array().into_iter().flatten())
        .find(|s| s["name"] == "leases")
        .cloned()
        .unwrap_or_default();
    (
        leases["undecodable"].as_u64().unwrap_or(0),
        feed["blind"].as_bool().unwrap(),
        feed["degraded"].as_bool().unwrap(),
    )
}

fn metric(bed: &ClusterBed, i: usize, series: &str) -> Option<f64> {
    let (_, body) = bed.nodes[i]
        .ns
        .enter(|| guard::testing::get("127.0.0.1:9477".parse().unwrap(), "/metrics"))
        .unwrap();
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

#[test]
fn one_undecodable_lease_is_skipped_and_its_holder_keeps_its_ip() {
    testbed::require_root();
    let bed = ClusterBed::new("bad", &[WEB, API, DB, OLD]).unwrap();
    for (svc, ip) in [("web", WEB), ("api", API), ("db", DB), ("old", OLD)] {
        bed.api.apply(
            Resource::Services,
            objects::service("default", svc, &[&ip.to_string()]),
        );
    }
    bed.api.apply(
        Resource::Leases,
        lease("web", "node-a", "2026-11-30T10:00:00.000000Z"),
    );
    bed.api.apply(
        Resource::Leases,
        lease("api", "node-b", "2026-11-30T10:00:00.000000Z"),
    );
    // What a real server would refuse but a guard must survive, present
    // from the first list: a duration past i32 and a renewTime that is no
    // time are read (clamped, compared as written); a string where a number
    // belongs cannot be.
    let mut huge = lease("db", "node-a", "2026-11-30T10:00:00.000000Z");
    huge["spec"]["leaseDurationSeconds"] = json!(4_294_967_296u64);
    bed.api.apply(Resource::Leases, huge);
    let mut text = lease("old", "node-b", "2026-11-30T10:00:00.000000Z");
    text["spec"]["leaseDurationSeconds"] = json!("15");
    bed.api.apply(Resource::Leases, text);
    let guards = bed.start(&["--announcer", "cilium"]).unwrap();

    // The list went through: every readable Lease decides.
    check(bed.wait_answer(WEB, Some("node-a"), CHANGE));
    check(bed.wait_answer(API, Some("node-b"), CHANGE));
    check(bed.wait_answer(DB, Some("node-a"), CHANGE));
    guards[0].expect_log("absurd leaseDurationSeconds", Duration::from_secs(2));
    // The unreadable one keeps its holder as read, uncertain: node-b keeps
    // answering (owned), node-a judges it unknown rather than node-b's.
    check(bed.wait_answer(OLD, Some("node-b"), CHANGE));
    let (a, b) = (status(&bed, 0), status(&bed, 1));
    assert_eq!(row(&a, OLD)["state"], "unknown", "{}", row(&a, OLD));
    assert_eq!(row(&b, OLD)["state"], "owned");
    assert!(row(&a, OLD)["source"]
        .as_str()
        .unwrap()
        .contains("cannot be decoded"));
    // Nothing else is touched: the guard sees, and does not degrade.
    assert_eq!(row(&a, API)["state"], "foreign");
    assert_eq!(lease_stream(&a), (1, false, false));
    let counted = "arp_guard_feed_undecodable_objects_total{stream=\"leases\"}";
    assert_eq!(metric(&bed, 0, counted), Some(1.0));
    assert_eq!(
        metric(
            &bed,
            0,
            "arp_guard_feed_unreadable_objects{stream=\"leases\"}"
        ),
        Some(1.0)
    );

    // A bad update of a Lease read so far: the same, for that Lease alone,
    // while the stream goes on delivering the others' changes.
    let mut bad = lease("api", "node-b", "2026-11-30T10:00:05.000000Z");
    bad["spec"]["renewTime"] = json!(12);
    bed.api.apply(Resource::Leases, bad.clone());
    bed.api.apply(Resource::Leases, bad);
    bed.api.apply(
        Resource::Leases,
        lease("web", "node-b", "2026-11-30T10:00:06.000000Z"),
    );
    check(bed.wait_answer(WEB, Some("node-b"), CHANGE));
    check(bed.wait_answer(API, Some("node-b"), CHANGE));
    let a = status(&bed, 0);
    assert_eq!(row(&a, API)["state"], "unknown");
    assert_eq!(lease_stream(&a), (2, false, false));
    // Logged once per object, however often it comes.
    assert_eq!(guards[0].count_log("cannot be decoded: skipped"), 2);
    assert_eq!(metric(&bed, 0, counted), Some(3.0));

    // Readable again: certain again.
    bed.api.apply(
        Resource::Leases,
        lease("api", "node-a", "2026-11-30T10:00:07.000000Z"),
    );
    bed.api.apply(
        Resource::Leases,
        lease("old", "node-a", "2026-11-30T10:00:07.000000Z"),
    );
    check(bed.wait_answer(API, Some("node-a"), CHANGE));
    check(bed.wait_answer(OLD, Some("node-a"), CHANGE));
    let b = status(&bed, 1);
    assert_eq!(row(&b, OLD)["state"], "foreign");
    assert_eq!(lease_stream(&b), (0, false, false));
    guards[1].expect_log("can be read again", Duration::from_secs(2));
}

#[test]
fn one_undecodable_service_is_skipped_and_the_others_are_guarded() {
    testbed::require_root();
    let bed = ClusterBed::new("bads", &[WEB, API]).unwrap();
    // A server that filters by type would hide a Service whose type is no
    // string (as a DELETED): this one lets every Service through.
    bed.api.set_service_field_selectors(false);
    bed.api.apply(
        Resource::Services,
        objects::service("default", "web", &["198.51.100.100"]),
    );
    bed.api.apply(
        Resource::Leases,
        lease("web", "node-a", "2026-11-30T10:00:00.000000Z"),
    );
    bed.api.apply(
        Resource::Leases,
        lease("api", "node-b", "2026-11-30T10:00:00.000000Z"),
    );
    let guards = bed.start(&["--announcer", "cilium"]).unwrap();
    check(bed.wait_answer(WEB, Some("node-a"), CHANGE));
    // A Service whose ingress is not a list: skipped, counted; the IP it
    // would carry is not the cluster's (its address on kube-ipvs0 has no
    // owner known).
    let mut api = objects::service("default", "api", &["198.51.100.101"]);
    api["status"]["loadBalancer"]["ingress"] = json!("198.51.100.101");
    bed.api.apply(Resource::Services, api);
    guards[0].expect_log("cannot be decoded: skipped", CHANGE);
    check(bed.wait_answer(API, None, CHANGE));
    // web's last good version, once unreadable, stays, not trusted: owned
    // stays owned on node-a, node-b no longer calls it node-a's.
    let mut web = objects::service("default", "web", &["198.51.100.100"]);
    web["spec"]["type"] = json!(5);
    bed.api.apply(Resource::Services, web);
    check(bed.wait_answer(WEB, Some("node-a"), CHANGE));
    let st = status(&bed, 1);
    assert_eq!(row(&st, WEB)["state"], "unknown", "{}", row(&st, WEB));
    assert!(!st["feed"]["degraded"].as_bool().unwrap());
    // Both read again.
    bed.api.apply(
        Resource::Services,
        objects::service("default", "api", &["198.51.100.101"]),
    );
    bed.api.apply(
        Resource::Services,
        objects::service("default", "web", &["198.51.100.100"]),
    );
    check(bed.wait_answer(API, Some("node-b"), CHANGE));
    check(bed.wait_answer(WEB, Some("node-a"), CHANGE));
    assert_eq!(row(&status(&bed, 1), WEB)["state"], "foreign");
}
