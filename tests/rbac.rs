//! deploy/base/rbac.yaml is exactly what the daemon and `arp-guard doctor`
//! ask of the API server: every request they make (counted by the fake API
//! per client, verb and resource) is granted by a rule there, and every
//! verb of every rule is one they make. The scenario makes each kind of
//! request at least once: the feed's lists and watches (Services, Leases,
//! ServiceL2Statuses), its confirming GET of a Lease past its deadline and
//! its API check (a GET of the `kubernetes` Service) on a quiet API,
//! presence (its record created, replaced when a MAC changes, deleted at
//! SIGTERM; the records and the guard Pods listed and watched; the Nodes
//! listed for `/cluster`), Events (a split-brain speaker: one Event, then
//! its series patched) and `arp-guard doctor`'s read of kube-proxy's
//! ConfigMap.

use std::{collections::BTreeSet, net::IpAddr, time::Duration};

use testbed::{
    cluster_bed::PRESENCE_NS,
    takeover::{Style, TakeoverBed, LB},
    ArpSpec,
};

/// (verb, resource) every rule of the shipped RBAC grants.
fn granted() -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for d in testbed::deploy::documents("base/rbac.yaml") {
        if !matches!(d["kind"].as_str(), Some("Role" | "ClusterRole")) {
            continue;
        }
        for r in d["rules"].as_array().unwrap() {
            for res in r["resources"].as_array().unwrap() {
                for v in r["verbs"].as_array().unwrap() {
                    out.insert((
                        v.as_str().unwrap().to_owned(),
                        res.as_str().unwrap().to_owned(),
                    ));
                }
            }
        }
    }
    out
}

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
    // node-b's record changes (its uplink's MAC): replaced.
    t.bed.nodes[1]
        .ns
        .ip(&["link", "set", "eth0", "address", "02:00:5e:00:53:b2"])
        .unwrap();
    // /cluster asks presence for the Nodes.
    let _ = t.bed.nodes[0]
        .ns
        .enter(|| Ok(testbed::http_get("127.0.0.1:9477", "/cluster")));
    // Quiet: nothing renews, the API check runs.
    std::thread::sleep(Duration::from_secs(7));
    // doctor reads kube-proxy's ConfigMap.
    let bin = testbed::guard_binary();
    let kc = t.bed.kubeconfig.to_string_lossy().into_owned();
    let _ = t.bed.nodes[0].ns.exec_output(&[
        bin.to_str().unwrap(),
        "doctor",
        "-o",
        "json",
        "--kubeconfig",
        &kc,
    ]);
    // SIGTERM: node-b deletes its record.
    t.guards[1]
        .stop(libc::SIGTERM, Duration::from_secs(10))
        .unwrap();

    let nodes: BTreeSet<IpAddr> = (11..=12).map(|i| IpAddr::from([203, 0, 113, i])).collect();
    let asked: BTreeSet<(String, String)> = (t.bed.api.tally().into_keys())
        .filter(|(peer, _, _)| nodes.contains(peer))
        .map(|(_, verb, res)| (verb.to_owned(), res.split('{').next().unwrap().to_owned()))
        .collect();
    let granted = granted();
    let not_granted: Vec<_> = asked.difference(&granted).collect();
    assert!(
        not_granted.is_empty(),
        "asked but not granted: {not_granted:?}\n(asked: {asked:?})"
    );
    let unused: Vec<_> = granted.difference(&asked).collect();
    assert!(
        unused.is_empty(),
        "granted but never asked: {unused:?}\n(asked: {asked:?})"
    );
}
