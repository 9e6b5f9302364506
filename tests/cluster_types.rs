//! A Service that changes type (LoadBalancer -> ClusterIP -> LoadBalancer)
//! or loses and regains its ingress IP is followed exactly, whether the API
//! server filters Services by `spec.type` for the guard (Kubernetes 1.31+:
//! the change comes as a DELETED, then an ADDED, event) or cannot (older:
//! the guard reads every Service and drops the others as it decodes them;
//! the change comes as MODIFIED events). A neighbour shows which node's
//! kernel answer gets through; `/status` shows where the guard's knowledge
//! comes from.

use std::{net::Ipv4Addr, time::Duration};

use serde_json::json;
use testbed::{
    cluster_bed::{check, ClusterBed},
    fake_api::{objects, Resource},
};

const LB: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 100);
const CHANGE: Duration = Duration::from_secs(8);

/// Node `i`'s `/status` row for `ip`.
fn status_row(bed: &ClusterBed, i: usize, ip: &str) -> serde_json::Value {
    let (_, body) = bed.nodes[i]
        .ns
        .enter(|| guard::testing::get("127.0.0.1:9477".parse().unwrap(), "/status"))
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let rows = v["ips"].as_array().cloned().unwrap_or_default();
    rows.into_iter()
        .find(|r| r["ip"] == ip)
        .unwrap_or_else(|| panic!("no {ip} in {v}"))
}

/// `web` as a ClusterIP Service, as a real server leaves it after the type
/// change (the load-balancer status cleared).
fn web_cluster_ip() -> serde_json::Value {
    json!({
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"type": "ClusterIP", "clusterIP": "10.96.0.10", "ports": [{"port": 443, "protocol": "TCP"}]},
        "status": {"loadBalancer": {}}
    })
}

/// `web` of type LoadBalancer still waiting for its IP (or having lost it).
fn web_pending() -> serde_json::Value {
    json!({
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 443, "protocol": "TCP"}]},
        "status": {"loadBalancer": {}}
    })
}

fn follows_type_and_ingress_changes(tag: &str, server_filters: bool) {
    testbed::require_root();
    let bed = ClusterBed::new(tag, &[LB]).unwrap();
    bed.api.set_service_field_selectors(server_filters);
    let web = || objects::service("default", "web", &["198.51.100.100"]);
    bed.api.apply(Resource::Services, web());
    bed.api.apply(
        Resource::Leases,
        objects::lease(
            "kube-system",
            "cilium-l2announce-default-web",
            "node-a",
            600,
            "2026-11-30T10:00:00.000000Z",
        ),
    );
    // A ClusterIP Service is never guarded, in either mode.
    bed.api.apply(
        Resource::Services,
        objects::cluster_ip_service("apps", "db", 1),
    );
    let guards = bed.start(&["--announcer", "cilium"]).unwrap();
    let fallback = "cannot select Services by spec.type";
    assert_eq!(
        guards[0].count_log(fallback),
        usize::from(!server_filters),
        "the fallback is said once, and only when the server needs it"
    );
    check(bed.wait_answer(LB, Some("node-a"), CHANGE));

    // LoadBalancer -> ClusterIP: the IP is no longer the cluster's. It is
    // still on kube-ipvs0, so it stays an LB IP with no owner known: no
    // kernel answer gets out on either node.
    bed.api.apply(Resource::Services, web_cluster_ip());
    check(bed.wait_answer(LB, None, CHANGE));
    for i in 0..2 {
        let row = status_row(&bed, i, "198.51.100.100");
        assert_eq!(row["state"], "unknown", "{row}");
        assert!(
            row["source"].as_str().unwrap().contains("kube-ipvs0"),
            "{row}"
        );
    }
    // ...and back: the Lease decides again.
    bed.api.apply(Resource::Services, web());
    check(bed.wait_answer(LB, Some("node-a"), CHANGE));
    assert_eq!(status_row(&bed, 1, "198.51.100.100")["state"], "foreign");

    // The Service loses its ingress IP (still of type LoadBalancer): the IP
    // is no longer claimed; it gets it back: claimed again.
    bed.api.apply(Resource::Services, web_pending());
    check(bed.wait_answer(LB, None, CHANGE));
    bed.api.apply(Resource::Services, web());
    check(bed.wait_answer(LB, Some("node-a"), CHANGE));

    // A type change while the watch is down, seen by the relist alone.
    bed.api.hold_watches();
    bed.api.apply(Resource::Services, web_cluster_ip());
    bed.api.compact();
    bed.api.drop_watches();
    check(bed.wait_answer(LB, None, Duration::from_secs(15)));
    bed.api.apply(Resource::Services, web());
    check(bed.wait_answer(LB, Some("node-a"), CHANGE));
    for g in &guards {
        assert_eq!(g.count_log(fallback), usize::from(!server_filters));
    }
}

#[test]
fn type_and_ingress_changes_are_followed_with_a_server_that_filters_by_type() {
    follows_type_and_ingress_changes("typf", true);
}

#[test]
fn type_and_ingress_changes_are_followed_with_a_server_that_cannot() {
    follows_type_and_ingress_changes("typn", false);
}
