//! deploy/base/rbac.yaml is exactly what the daemon and `arp-guard doctor`
//! ask of the API server: every request they make (recorded by the fake API
//! per client, verb, resource and namespace) is granted by a rule there (a
//! ClusterRole's anywhere, a Role's in its namespace only), and every verb
//! of every rule is one they make where the rule applies. The scenario makes each kind of
//! request at least once: the feed's lists and watches (Services, Leases,
//! ServiceL2Statuses), its confirming GET of a Lease past its deadline and
//! its API check (a GET of the `kubernetes` Service) on a quiet API,
//! presence (its record created, replaced when a MAC changes, read again
//! after a 409 when it was changed behind the guard's back, deleted at
//! SIGTERM; the records and the guard Pods listed and watched; the Nodes
//! listed for `/cluster`), Events (a split-brain speaker: one Event, then
//! its series patched), `--interface auto` (its Node read, MetalLB's
//! L2Advertisements and Cilium's L2 announcement policies followed), its
//! ArpGuardNode (read, created, patched) and `arp-guard doctor`'s read of
//! kube-proxy's ConfigMap.

use std::{collections::BTreeSet, net::IpAddr, time::Duration};

use testbed::{
    cluster_bed::PRESENCE_NS,
    deploy::{covers, grants, Request},
    fake_api::Resource,
    takeover::{Style, TakeoverBed, LB},
    ArpSpec,
};

#[test]
fn every_request_is_granted_and_every_rule_is_used() {
    testbed::require_root();
    let flags = [
        // An Event a second may be patched into a series.
        "--kube-events-interval",
        "1s",
        "--split-brain-after",
        "2s",
        // Presence, every second; all three announcers read.
        "--presence-period",
        "1s",
        "--presence-namespace",
        PRESENCE_NS,
        "--announcer",
        "cilium",
        "--announcer",
        "metallb",
        // A quiet API is checked after 5 s without a sign of life.
        "--stale-after",
        "5s",
        // The uplinks chosen too: its Node read, the announcers' interfaces followed.
        "--interface",
        "auto",
        // Its findings written (created, then patched as they change).
        "--node-report-interval",
        "1s",
    ];
    let mut t = TakeoverBed::new("rbac", Style::KubeVip, true, &flags).unwrap();
    // A Cilium Lease nobody renews: past its 2 s the feed confirms it.
    t.bed
        .cilium_service("short", &["198.51.100.101"], "node-a", 2);
    // A split-brain speaker on node-b: an Event, then its series.
    let garp = ArpSpec::gratuitous(2, t.bed.nodes[1].mac, LB).to_bytes();
    let patched = testbed::wait_until(Duration::from_secs(30), || {
        let _ = t.speakers[1].send(&garp);
        std::thread::sleep(Duration::from_millis(200));
        t.bed.api.event_requests().1 > 0
    });
    assert!(patched, "no Event series: {:#?}", t.bed.api.events());
    // node-b's record changes (its uplink's MAC): replaced. Changed behind
    // its back first, while no watch delivers: the replace meets a 409 and
    // the record is read again (the Role's get).
    let reads = |api: &testbed::fake_api::FakeApi| {
        (api.scopes().iter())
            .any(|(_, v, r, ns)| *v == "get" && r == "leases" && ns.as_deref() == Some(PRESENCE_NS))
    };
    assert!(!reads(&t.bed.api), "nothing read a record before");
    t.bed.api.hold_watches();
    let mut record = (t.bed.api)
        .object(Resource::Leases, PRESENCE_NS, "arp-guard-node-b")
        .expect("node-b's presence record");
    record["metadata"]["labels"]["touched-by"] = "rbac-test".into();
    t.bed.api.apply(Resource::Leases, record);
    t.bed.nodes[1]
        .ns
        .ip(&["link", "set", "eth0", "address", "02:00:5e:00:53:b2"])
        .unwrap();
    let reread = testbed::wait_until(Duration::from_secs(10), || reads(&t.bed.api));
    t.bed.api.drop_watches();
    assert!(reread, "node-b's record was not read again after a 409");
    // /cluster asks presence for the Nodes.
    let _ = t.bed.nodes[0]
        .ns
        .enter(|| Ok(testbed::http_get("127.0.0.1:9477", "/cluster")));
    // Quiet: nothing renews, the API check runs.
    std::thread::sleep(Duration::from_secs(7));
    // doctor reads kube-proxy's ConfigMap.
    let _ = t.bed.doctor(0, &t.bed.kubeconfig);
    // SIGTERM: node-b deletes its record.
    t.guards[1]
        .stop(libc::SIGTERM, Duration::from_secs(10))
        .unwrap();

    let nodes: BTreeSet<IpAddr> = (11..=12).map(|i| IpAddr::from([203, 0, 113, i])).collect();
    let asked: BTreeSet<Request> = (t.bed.api.scopes().into_iter())
        .filter(|(peer, ..)| nodes.contains(peer))
        .map(|(_, verb, res, ns)| (verb, res, ns))
        .collect();
    let granted = grants("base/rbac.yaml");
    let not_granted: Vec<_> = (asked.iter())
        .filter(|a| !granted.iter().any(|g| covers(g, a)))
        .collect();
    assert!(
        not_granted.is_empty(),
        "asked but not granted (verb, resource, namespace): {not_granted:?}\n(asked: {asked:?})"
    );
    let unused: Vec<_> = (granted.iter())
        .filter(|g| !asked.iter().any(|a| covers(g, a)))
        .collect();
    assert!(
        unused.is_empty(),
        "granted but never asked where the rule applies: {unused:?}\n(asked: {asked:?})"
    );
}

/// The rule of the check above: a Role grants in its namespace only, a
/// ClusterRole everywhere (a Lease created outside the guards' namespace is
/// not granted by presence's Role).
#[test]
fn a_role_grants_in_its_namespace_only() {
    let g = grants("base/rbac.yaml");
    let ok = |v: &'static str, r: &str, n: Option<&str>| {
        let request = (v, r.to_owned(), n.map(str::to_owned));
        g.iter().any(|x| covers(x, &request))
    };
    assert!(ok("create", "leases", Some("arp-guard")));
    assert!(!ok("create", "leases", Some("kube-system")));
    assert!(!ok("create", "leases", None));
    assert!(
        ok("watch", "leases", Some("kube-system")),
        "the ClusterRole's"
    );
    assert!(ok("get", "configmaps", Some("kube-system")));
    assert!(!ok("get", "configmaps", Some("arp-guard")));
}
