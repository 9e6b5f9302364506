//! Presence: every guard publishes who it is (node, guarded interfaces and
//! their MACs, mode, health) as a Lease in its namespace, written when it
//! changes, and follows everyone's with a watch; a guard is live while its
//! Pod is Ready (the bed's kubelet probes `/readyz`). Two guarded nodes of
//! a ClusterBed, with the DaemonSet's privileges, against the fake API: the
//! Leases' content, `/cluster` and `status --cluster` (coverage: a node
//! without a guard), no write and no list while nothing changes, a restart
//! that writes nothing, deletion on SIGTERM and not live after SIGKILL,
//! hostile records, the API down.

use std::{net::Ipv4Addr, time::Duration};

use serde_json::Value;
use testbed::{
    cluster_bed::{check, ClusterBed, CILIUM_PRESENCE_ARGS, PRESENCE_NS as NS},
    deploy::daemonset_wrapper,
    fake_api::{objects, Resource},
    guard_binary, wait_for, ArpSpec, Daemon, RawSocket,
};

const LB: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 100);
/// A MAC no guard lists: a device outside the cluster.
const STRANGER: [u8; 6] = [0x02, 0, 0x5e, 0, 0x53, 0x66];

fn mac(m: [u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// A bed whose LB IP node-a owns (Cilium Lease), with Nodes node-a, node-b
/// and node-c (which runs no guard).
fn bed(tag: &str) -> ClusterBed {
    let bed = ClusterBed::new(tag, &[LB]).unwrap();
    bed.cilium_service("web", &["198.51.100.100"], "node-a", 3600);
    for n in ["node-a", "node-b", "node-c"] {
        bed.api.apply(Resource::Nodes, objects::node(n));
    }
    bed
}

fn start(bed: &ClusterBed, i: usize) -> Daemon {
    start_with(bed, i, &[])
}

fn start_with(bed: &ClusterBed, i: usize, more: &[&str]) -> Daemon {
    let args: Vec<&str> = CILIUM_PRESENCE_ARGS.iter().chain(more).copied().collect();
    bed.start_on_wrapped(i, &daemonset_wrapper(), &args, Duration::from_secs(20))
        .unwrap()
}

/// Node `i`'s census of `ip` once `ok` holds for it.
fn census_of(bed: &ClusterBed, i: usize, ip: Ipv4Addr, ok: impl Fn(&Value) -> bool) -> Value {
    let get = || {
        let (_, body) = bed.nodes[i]
            .ns
            .enter(|| guard::testing::get("127.0.0.1:9477".parse().unwrap(), "/responders"))
            .unwrap();
        serde_json::from_str::<Value>(&body).unwrap()
    };
    wait_for(Duration::from_secs(15), || {
        let e = get()["ips"][ip.to_string()].clone();
        ok(&e).then_some(e)
    })
    .unwrap_or_else(|| panic!("census of {ip} on node {i}: {:#}", get()))
}

/// Node `i`'s `/cluster`.
fn cluster(bed: &ClusterBed, i: usize) -> Value {
    let (code, body) = bed.nodes[i]
        .ns
        .enter(|| guard::testing::get("127.0.0.1:9477".parse().unwrap(), "/cluster"))
        .unwrap();
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// Wait until node `i`'s `/cluster` satisfies `ok`; the last document.
fn cluster_until(bed: &ClusterBed, i: usize, ok: impl Fn(&Value) -> bool) -> Value {
    let mut last = Value::Null;
    let r = wait_for(Duration::from_secs(15), || {
        last = cluster(bed, i);
        ok(&last).then_some(())
    });
    assert!(r.is_some(), "node {i}'s /cluster never got there: {last:#}");
    last
}

fn guard_row<'a>(doc: &'a Value, node: &str) -> Option<&'a Value> {
    doc["guards"].as_array()?.iter().find(|g| g["node"] == node)
}

fn live(doc: &Value, node: &str) -> bool {
    guard_row(doc, node).is_some_and(|g| g["live"] == true)
}

fn lease(bed: &ClusterBed, node: &str) -> Option<Value> {
    bed.api
        .object(Resource::Leases, NS, &format!("arp-guard-{node}"))
}

/// The record in a presence Lease.
fn record(l: &Value) -> Value {
    let text = l["metadata"]["annotations"]["arp-guard.io/presence"]
        .as_str()
        .unwrap_or_else(|| panic!("no record in {l:#}"));
    serde_json::from_str(text).unwrap()
}

#[test]
fn two_guards_publish_their_macs_and_see_each_other_and_the_node_without_one() {
    testbed::require_root();
    let bed = bed("prs");
    let _a = start(&bed, 0);
    let _b = start(&bed, 1);
    for (i, node) in ["node-a", "node-b"].iter().enumerate() {
        let l = wait_for(Duration::from_secs(10), || lease(&bed, node))
            .unwrap_or_else(|| panic!("no presence Lease for {node}"));
        assert_eq!(
            l["metadata"]["labels"]["app.kubernetes.io/component"],
            "arp-guard-presence"
        );
        assert_eq!(l["spec"]["holderIdentity"], *node);
        assert!(
            l["spec"]["leaseDurationSeconds"].is_null(),
            "not renewed: it lasts while its Pod is Ready"
        );
        let r = record(&l);
        assert_eq!(r["node"], *node);
        assert_eq!(r["mode"], "enforce");
        assert_eq!(r["interfaces"][0]["name"], "eth0");
        assert_eq!(r["interfaces"][0]["mac"], mac(bed.nodes[i].mac));
        assert_eq!(r["interfaces"].as_array().unwrap().len(), 1, "{r}");
    }
    // Each sees the other, and node-c uncovered.
    for i in 0..2 {
        let doc = cluster_until(&bed, i, |d| {
            live(d, "node-a")
                && live(d, "node-b")
                && d["guards"]
                    .as_array()
                    .is_some_and(|g| g.iter().all(|g| g["health"] == "enforcing"))
                && d["uncovered"].as_array().is_some()
        });
        assert_eq!(doc["uncovered"], serde_json::json!(["node-c"]), "{doc:#}");
        // Every read of presence came from the API server's cache: the
        // records' and Pods' lists and the Nodes asked for by /cluster.
        let quorum: Vec<String> = (bed.api.tally().into_iter())
            .filter(|(_, c)| c.quorum > 0)
            .filter(|((_, _, res), _)| {
                res.starts_with("nodes")
                    || res.starts_with("pods")
                    || res.contains("component=arp-guard-presence")
            })
            .map(|((ip, verb, res), c)| format!("{ip} {verb} {res}: {c:?}"))
            .collect();
        assert!(quorum.is_empty(), "quorum reads: {quorum:?}");
        assert_eq!(doc["namespace"], NS);
        assert_eq!(
            guard_row(&doc, "node-b").unwrap()["interfaces"][0]["mac"],
            mac(bed.nodes[1].mac)
        );
    }
    // The CLI says the same, and exits 1 for the uncovered node.
    let out = bed.nodes[0]
        .ns
        .exec_output(&[&guard_binary().to_string_lossy(), "status", "--cluster"])
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("nodes without a live guard (1): node-c"),
        "{text}"
    );
    assert!(text.contains(&mac(bed.nodes[1].mac)), "{text}");
    // Guarding is what it was: only the owner answers.
    check(bed.wait_answer(LB, Some("node-a"), Duration::from_secs(8)));
}

/// With nothing changing, presence writes nothing and lists nothing: over
/// many periods (1 s here) the Leases keep their resourceVersion, and the
/// API server sees no request of presence but the watches' reopenings (none
/// in a few seconds: they last minutes). A restart with nothing changed
/// writes nothing either; a change (monitor mode) is written once.
#[test]
fn nothing_changing_costs_no_write_and_no_list() {
    testbed::require_root();
    let bed = bed("prq");
    let _a = start(&bed, 0);
    let mut b = start(&bed, 1);
    cluster_until(&bed, 0, |d| live(d, "node-a") && live(d, "node-b"));
    let rv = |node: &str| lease(&bed, node).unwrap()["metadata"]["resourceVersion"].clone();
    // Settled: both healthy, their records as they will stay.
    cluster_until(&bed, 1, |d| {
        d["guards"]
            .as_array()
            .is_some_and(|g| g.len() == 2 && g.iter().all(|g| g["health"] == "enforcing"))
    });
    std::thread::sleep(Duration::from_secs(2));
    let before = (rv("node-a"), rv("node-b"));
    bed.api.reset_tally();
    std::thread::sleep(Duration::from_secs(6));
    assert_eq!(
        (rv("node-a"), rv("node-b")),
        before,
        "no write in 6 periods"
    );
    let asked: Vec<String> = (bed.api.tally().into_iter())
        .filter(|((_, verb, res), _)| {
            matches!(res.as_str(), "leases" | "pods" | "nodes") && *verb != "watch"
        })
        .map(|((ip, verb, res), c)| format!("{ip} {verb} {res}: {c:?}"))
        .collect();
    assert!(asked.is_empty(), "presence asked the API: {asked:?}");
    // A restart of node-b's guard with nothing changed: no write.
    b.stop(libc::SIGKILL, Duration::from_secs(10)).unwrap();
    cluster_until(&bed, 0, |d| !live(d, "node-b"));
    let _b = start(&bed, 1);
    cluster_until(&bed, 0, |d| live(d, "node-b"));
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        rv("node-b"),
        before.1,
        "restarted with the same record: not written"
    );
    // Its record changes (monitor mode): written once, seen by node-a.
    drop(_b);
    let _b = start_with(&bed, 1, &["--mode", "monitor"]);
    cluster_until(&bed, 0, |d| {
        live(d, "node-b") && guard_row(d, "node-b").is_some_and(|g| g["mode"] == "monitor")
    });
    assert_ne!(rv("node-b"), before.1);
}

#[test]
fn a_record_is_deleted_on_sigterm_and_not_live_after_sigkill() {
    testbed::require_root();
    let bed = bed("prx");
    let _a = start(&bed, 0);
    let mut b = start(&bed, 1);
    cluster_until(&bed, 0, |d| live(d, "node-b"));
    b.stop(libc::SIGTERM, Duration::from_secs(10)).unwrap();
    assert!(lease(&bed, "node-b").is_none(), "deleted at a clean exit");
    let doc = cluster_until(&bed, 0, |d| guard_row(d, "node-b").is_none());
    assert!(live(&doc, "node-a"));
    // Killed: the Lease stays, but its Pod is not Ready (the kubelet's
    // probe fails): not live, node-b uncovered.
    let mut b = start(&bed, 1);
    cluster_until(&bed, 0, |d| live(d, "node-b"));
    b.stop(libc::SIGKILL, Duration::from_secs(10)).unwrap();
    assert!(lease(&bed, "node-b").is_some());
    let doc = cluster_until(&bed, 0, |d| {
        guard_row(d, "node-b").is_some_and(|g| g["live"] == false && g["ready"] == false)
            && d["uncovered"]
                .as_array()
                .is_some_and(|u| u.iter().any(|n| n == "node-b"))
    });
    assert!(live(&doc, "node-a"), "{doc:#}");
}

#[test]
fn hostile_records_are_skipped_and_a_dead_api_leaves_guarding_alone() {
    testbed::require_root();
    let bed = bed("prh");
    let hostile = |name: &str, text: Value| {
        serde_json::json!({
            "metadata": {"name": name, "namespace": NS,
                "labels": {"app.kubernetes.io/component": "arp-guard-presence"},
                "annotations": {"arp-guard.io/presence": text}},
            "spec": {"renewTime": "2026-11-30T10:00:00.000000Z", "leaseDurationSeconds": 30},
        })
    };
    bed.api.apply(
        Resource::Leases,
        hostile("arp-guard-junk", "{not json".into()),
    );
    bed.api.apply(
        Resource::Leases,
        hostile("arp-guard-huge", "x".repeat(200 * 1024).into()),
    );
    // A record naming node-a in another Lease: not node-a's.
    let forged = serde_json::json!({"node": "node-a", "mode": "enforce", "version": "0",
        "health": "enforcing", "interfaces": [{"name": "eth0", "mac": "02:00:5e:00:53:66"}]});
    bed.api.apply(
        Resource::Leases,
        hostile("arp-guard-node-x", forged.to_string().into()),
    );
    let a = start(&bed, 0);
    let _b = start(&bed, 1);
    let doc = cluster_until(&bed, 0, |d| live(d, "node-a") && d["skipped"] == 3);
    let macs = &guard_row(&doc, "node-a").unwrap()["interfaces"];
    assert_eq!(
        macs[0]["mac"],
        mac(bed.nodes[0].mac),
        "the forged MAC is not node-a's: {doc:#}"
    );
    // The API down: presence fails (said, counted), guarding goes on.
    bed.api.set_down(true);
    cluster_until(&bed, 0, |d| d["errors"]["records"].is_string());
    check(bed.wait_answer(LB, Some("node-a"), Duration::from_secs(8)));
    let (code, _) = bed.nodes[0]
        .ns
        .enter(|| guard::testing::get("127.0.0.1:9477".parse().unwrap(), "/healthz"))
        .unwrap();
    assert_eq!(code, 200);
    // Said once per kind of request (records, pods, nodes), not every retry.
    std::thread::sleep(Duration::from_secs(3));
    let said = a.count_log("presence: request failed");
    assert!((1..=3).contains(&said), "{said} lines:\n{}", a.log_text());
    bed.api.set_down(false);
    cluster_until(&bed, 0, |d| d["errors"].is_null() && live(d, "node-a"));
}

#[test]
fn a_rogue_node_and_a_stranger_are_named_on_the_owner() {
    testbed::require_root();
    let bed = bed("prr");
    // A claim of an owned IP is reported once it outlasts a late feed.
    let a = start_with(&bed, 0, &["--split-brain-after", "3s"]);
    // node-b in monitor mode: its guard lets its own speaker's claims out.
    let _b = start_with(&bed, 1, &["--mode", "monitor"]);
    let doc = cluster_until(&bed, 0, |d| live(d, "node-a") && live(d, "node-b"));
    assert_eq!(guard_row(&doc, "node-b").unwrap()["mode"], "monitor");
    assert_eq!(guard_row(&doc, "node-b").unwrap()["health"], "monitoring");
    // Claims in node-a's first seconds as owner are a predecessor's last words.
    std::thread::sleep(Duration::from_secs(3));
    let garp = ArpSpec::gratuitous(1, bed.nodes[1].mac, LB).to_bytes();
    let speaker = RawSocket::open(&bed.nodes[1].ns, "eth0").unwrap();
    assert!(speaker.send(&garp).unwrap());
    let e = census_of(&bed, 0, LB, |e| !e["conflict"].is_null());
    assert_eq!(e["conflict"], "claimed_elsewhere", "{e:#}");
    assert_eq!(e["owner"], "node-a", "{e:#}");
    let r = &e["responders"][0];
    assert_eq!(
        (&r["node"], &r["node_interface"]),
        (&"node-b".into(), &"eth0".into()),
        "{e:#}"
    );
    let said = format!(
        "node-b (eth0, {}) claims {LB} owned by node-a",
        mac(bed.nodes[1].mac)
    );
    let line = a.expect_log("responder conflict:", Duration::from_secs(5));
    assert!(line.contains(&said), "{line}");
    let out = bed.nodes[0]
        .ns
        .exec_output(&[&guard_binary().to_string_lossy(), "responders"])
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains(&said), "{table}");
    // A MAC no guard lists, from the peer: named as outside.
    let wire = RawSocket::open(&bed.peer, "eth0").unwrap();
    assert!(wire
        .send(&ArpSpec::gratuitous(1, STRANGER, LB).to_bytes())
        .unwrap());
    let e = census_of(&bed, 0, LB, |e| {
        e["responders"]
            .as_array()
            .is_some_and(|rs| rs.iter().any(|r| r["outside"] == true))
    });
    let stranger = e["responders"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["mac"] == mac(STRANGER))
        .unwrap();
    assert!(stranger["node"].is_null(), "{e:#}");
    // Its words, as the `/events` stream and the log give them.
    let out = bed.nodes[0]
        .ns
        .exec_output(&[
            &guard_binary().to_string_lossy(),
            "responders",
            "-o",
            "json",
        ])
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("\"outside\":true") || text.contains("\"outside\": true"),
        "{text}"
    );
}

/// A `--presence-pods` that selects no guard Pod (a customised DaemonSet's
/// labels) must not make every guard dead: the records alone say who is
/// live, and `/cluster` says why.
#[test]
fn a_selector_matching_no_guard_pod_falls_back_to_the_records() {
    testbed::require_root();
    let bed = bed("prp");
    let wrong = ["--presence-pods", "app=not-the-guard"];
    let a = start_with(&bed, 0, &wrong);
    let _b = start_with(&bed, 1, &wrong);
    let doc = cluster_until(&bed, 0, |d| live(d, "node-a") && live(d, "node-b"));
    // Said once, not at every bookmark of the Pods' watch (one a second here).
    std::thread::sleep(Duration::from_secs(3));
    let said = a.count_log("the guard Pods cannot tell who is live");
    assert_eq!(said, 1, "{}", a.log_text());
    let why = doc["errors"]["pods"].as_str().unwrap_or_default();
    assert!(
        why.contains("no Pod matching --presence-pods") && why.contains("node-a"),
        "{doc:#}"
    );
    assert!(
        guard_row(&doc, "node-b").unwrap()["ready"].is_null(),
        "{doc:#}"
    );
}

/// kube-vip's per-Service election: the feed watches Leases cluster-wide,
/// and the presence records are Leases. A record written (a guard whose
/// record changes) reaches every guard's presence watch and no guard's
/// feed.
#[test]
fn the_feeds_cluster_wide_lease_watch_never_receives_presence_records() {
    testbed::require_root();
    let bed = bed("prk");
    let vip = [
        "--announcer",
        "kube-vip",
        "--presence-period",
        "1s",
        "--presence-namespace",
        NS,
    ];
    let run = |i: usize, more: &[&str]| {
        let args: Vec<&str> = vip.iter().chain(more).copied().collect();
        bed.start_on_wrapped(i, &daemonset_wrapper(), &args, Duration::from_secs(20))
            .unwrap()
    };
    let _a = run(0, &[]);
    let b = run(1, &[]);
    cluster_until(&bed, 0, |d| live(d, "node-a") && live(d, "node-b"));
    std::thread::sleep(Duration::from_secs(2));
    bed.api.reset_tally();
    drop(b);
    let _b = run(1, &["--mode", "monitor"]);
    cluster_until(&bed, 0, |d| {
        guard_row(d, "node-b").is_some_and(|g| g["mode"] == "monitor" && g["live"] == true)
    });
    // Watch events on Leases, to the presence watches and to every other
    // (the feeds', whatever their selector).
    let (mut presence, mut feeds) = (0, 0);
    for ((_, verb, res), c) in bed.api.tally() {
        if verb == "watch" && res.starts_with("leases") {
            if res.contains("component=arp-guard-presence") {
                presence += c.events;
            } else {
                feeds += c.events;
            }
        }
    }
    let tally = bed.api.tally();
    assert!(
        presence >= 1,
        "the change reached the presence watches: {tally:#?}"
    );
    assert_eq!(feeds, 0, "the feeds' Lease watches: {tally:#?}");
}
