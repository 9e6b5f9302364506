//! The active census: a guard asks (RFC 5227 ARP probes) about the LB IPs it
//! does not own, and judges the unicast answers its census records. Real
//! frames on a ClusterBed with the DaemonSet's privileges, against the fake
//! API: a silent owner, two answers to one request (a node and a device
//! outside the cluster, named), an owner answering from an interface its
//! guard does not guard, the share of each guard and the rate on the wire,
//! off meaning no frame, and no neighbour entry made anywhere.

use std::{collections::BTreeMap, net::Ipv4Addr, time::Duration};

use serde_json::Value;
use testbed::{
    cluster_bed::{ClusterBed, CILIUM_PRESENCE_ARGS, PRESENCE_NS as NS},
    deploy::daemonset_wrapper,
    fake_api::{objects, Resource},
    frames::Captured,
    wait_for, Daemon, RawSocket,
};

const LB: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 100);
/// Fast enough for a test: every LB IP asked every second, silent after 2.
const FAST: &[&str] = &["--probe-interval", "1s", "--probe-silent-after", "2"];

fn mac(m: [u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// A bed whose LB IPs are owned by `owner` (a Cilium Lease each), with a
/// Service per IP and Nodes node-a, node-b, node-c.
fn bed(tag: &str, ips: &[Ipv4Addr], owner: &str) -> ClusterBed {
    let bed = ClusterBed::new(tag, ips).unwrap();
    for (i, ip) in ips.iter().enumerate() {
        bed.cilium_service(&format!("web{i}"), &[&ip.to_string()], owner, 3600);
    }
    for n in ["node-a", "node-b", "node-c"] {
        bed.api.apply(Resource::Nodes, objects::node(n));
    }
    bed
}

fn start(bed: &ClusterBed, i: usize, more: &[&str]) -> Daemon {
    let pace = if more.contains(&"--probe-interval") {
        &[][..]
    } else {
        FAST
    };
    let args: Vec<&str> = CILIUM_PRESENCE_ARGS
        .iter()
        .chain(pace)
        .chain(more)
        .copied()
        .collect();
    bed.start_on_wrapped(i, &daemonset_wrapper(), &args, Duration::from_secs(20))
        .unwrap()
}

/// Node `i`'s `/probes` (None: 404).
fn probes(bed: &ClusterBed, i: usize) -> Option<Value> {
    let (code, body) = bed.nodes[i]
        .ns
        .enter(|| guard::testing::get("127.0.0.1:9477".parse().unwrap(), "/probes"))
        .unwrap();
    (code == 200).then(|| serde_json::from_str(&body).unwrap())
}

/// Wait until node `i`'s verdict of `ip` satisfies `ok`; the IP's entry.
fn verdict_until(bed: &ClusterBed, i: usize, ip: Ipv4Addr, ok: impl Fn(&Value) -> bool) -> Value {
    let mut last = Value::Null;
    let got = wait_for(Duration::from_secs(25), || {
        last = probes(bed, i).unwrap_or_default();
        let e = last["ips"][ip.to_string()].clone();
        ok(&e).then_some(e)
    });
    got.unwrap_or_else(|| panic!("node {i}'s /probes never got there: {last:#}"))
}

/// The first Event with `reason` (waited for).
fn event(bed: &ClusterBed, reason: &str) -> Value {
    wait_for(Duration::from_secs(10), || {
        bed.api.events().into_iter().find(|e| e["reason"] == reason)
    })
    .unwrap_or_else(|| panic!("no {reason} Event: {:#?}", bed.api.events()))
}

/// A presence record for `node` in the fake API, and its guard Pod Ready
/// for good: what a guard on it would publish.
fn presence_record(
    bed: &ClusterBed,
    node: &str,
    guarded: &[(&str, String)],
    other: &[(&str, String)],
) {
    let list = |l: &[(&str, String)]| -> Vec<Value> {
        l.iter()
            .map(|(n, m)| serde_json::json!({"name": n, "mac": m}))
            .collect()
    };
    let record = serde_json::json!({"node": node, "mode": "enforce", "version": "0",
        "health": "enforcing", "interfaces": list(guarded), "other": list(other)});
    bed.api.apply(
        Resource::Leases,
        serde_json::json!({
            "metadata": {"name": format!("arp-guard-{node}"), "namespace": NS,
                "labels": {"app.kubernetes.io/component": "arp-guard-presence"},
                "annotations": {"arp-guard.io/presence": record.to_string()}},
            "spec": {"holderIdentity": node, "renewTime": "2026-11-30T10:00:00.000000Z"},
        }),
    );
    bed.kubelet.pin(node, true);
}

/// The active census's requests among `frames`: ARP requests whose sender
/// IP is 0.0.0.0, by (asker MAC, target).
fn requests(frames: &[Captured]) -> BTreeMap<([u8; 6], Ipv4Addr), usize> {
    let mut out = BTreeMap::new();
    for f in frames
        .iter()
        .filter(|f| f.op == 1 && f.spa == Ipv4Addr::UNSPECIFIED)
    {
        *out.entry((f.sha, f.tpa)).or_default() += 1;
    }
    out
}

#[test]
fn an_owner_that_does_not_answer_is_a_silent_owner_until_it_answers_again() {
    testbed::require_root();
    let bed = bed("pbs", &[LB], "node-a");
    // node-a owns the IP but does not have it: nobody answers.
    bed.nodes[0]
        .ns
        .ip(&["addr", "del", &format!("{LB}/32"), "dev", "kube-ipvs0"])
        .unwrap();
    let b = start(&bed, 1, &[]);
    let e = verdict_until(&bed, 1, LB, |e| e["verdict"] == "silent_owner");
    assert_eq!(e["owner"], "node-a", "{e:#}");
    assert!(e["unanswered_in_a_row"].as_u64().unwrap() >= 2, "{e:#}");
    let line = b.expect_log(
        "the owner of this LB IP did not answer",
        Duration::from_secs(5),
    );
    assert!(line.contains(&LB.to_string()), "{line}");
    assert_eq!(
        testbed::counter(
            &bed.nodes[1].ns,
            "arp_guard_probe_ips{verdict=\"silent_owner\"}"
        ),
        1.0
    );
    // In Kubernetes' words: a Warning on the Service, the owner named.
    let e = event(&bed, "SilentOwner");
    assert_eq!(e["type"], "Warning", "{e:#}");
    assert_eq!(e["regarding"]["name"], "web0", "{e:#}");
    assert_eq!(e["reportingInstance"], "node-b", "{e:#}");
    assert_eq!(e["related"]["name"], "node-a", "{e:#}");
    let note = e["note"].as_str().unwrap();
    assert!(
        note.contains("node-a owns 198.51.100.100 but nobody answered"),
        "{note}"
    );
    // The owner answers again: answered, and the silence said to be over.
    bed.nodes[0]
        .ns
        .ip(&["addr", "add", &format!("{LB}/32"), "dev", "kube-ipvs0"])
        .unwrap();
    let e = verdict_until(&bed, 1, LB, |e| e["verdict"] == "answered");
    assert_eq!(
        e["answered_by"][0].as_str().unwrap().split(' ').next(),
        Some(mac(bed.nodes[0].mac).as_str()),
        "{e:#}"
    );
    b.expect_log("probe verdict ended", Duration::from_secs(5));
    // The requests taught nobody anything: ARP probes (sender 0.0.0.0)
    // make no neighbour entry on the nodes that answered or heard them.
    for ns in [&bed.nodes[0].ns, &bed.peer] {
        let table = ns.ip(&["neigh", "show"]).unwrap();
        assert!(
            !table.contains(&mac(bed.nodes[1].mac)),
            "an entry for the asker: {table}"
        );
    }
}

#[test]
fn two_answers_to_one_request_are_a_conflict_naming_the_node_and_the_stranger() {
    testbed::require_root();
    let bed = bed("pbc", &[LB], "node-a");
    // The owner's guard runs (its record names its MAC); the peer, a device
    // outside the cluster, answers for the IP too.
    let _a = start(&bed, 0, &[]);
    bed.peer
        .ip(&["addr", "add", &format!("{LB}/32"), "dev", "eth0"])
        .unwrap();
    let b = start(&bed, 1, &[]);
    let e = verdict_until(&bed, 1, LB, |e| e["verdict"] == "conflict");
    let by: Vec<&str> = (e["answered_by"].as_array().unwrap().iter())
        .map(|v| v.as_str().unwrap())
        .collect();
    let node_a = format!("node-a (eth0, {})", mac(bed.nodes[0].mac));
    let peer = bed.peer.mac("eth0").unwrap();
    assert!(by.contains(&node_a.as_str()), "{e:#}");
    assert!(
        by.iter()
            .any(|w| w.starts_with(&mac(peer)) && w.contains("not a guarded node")),
        "{e:#}"
    );
    b.expect_log(
        "more than one MAC answered one request",
        Duration::from_secs(5),
    );
    // The CLI: the row, and exit 1.
    let out = bed.nodes[1]
        .ns
        .exec_output(&[
            &testbed::guard_binary().to_string_lossy(),
            "status",
            "--probes",
        ])
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{table}");
    let row = table
        .lines()
        .find(|l| l.starts_with(&LB.to_string()))
        .unwrap_or_default();
    assert!(row.contains("conflict") && row.contains(&node_a), "{table}");
    let e = event(&bed, "ResponderConflict");
    assert_eq!(e["reportingInstance"], "node-b", "{e:#}");
    let note = e["note"].as_str().unwrap();
    assert!(
        note.contains(&node_a) && note.contains("not a guarded node"),
        "{note}"
    );
    // The stranger stops: one answer again, the conflict over.
    bed.peer
        .ip(&["addr", "del", &format!("{LB}/32"), "dev", "eth0"])
        .unwrap();
    verdict_until(&bed, 1, LB, |e| e["verdict"] == "answered");
}

#[test]
fn an_owner_answering_from_an_unguarded_interface_is_named_with_it() {
    testbed::require_root();
    let bed = bed("pbw", &[LB], "node-a");
    // node-a's record: eth0 guarded with another MAC, and its real MAC on
    // an interface it does not guard (a second NIC).
    presence_record(
        &bed,
        "node-a",
        &[("eth0", "02:00:5e:00:53:0a".into())],
        &[("eth1", mac(bed.nodes[0].mac))],
    );
    let _b = start(&bed, 1, &[]);
    let e = verdict_until(&bed, 1, LB, |e| e["verdict"] == "wrong_interface");
    assert_eq!(e["interface"], "eth1", "{e:#}");
    assert_eq!(e["owner"], "node-a", "{e:#}");
}

#[test]
fn each_ip_is_asked_by_its_share_at_the_capped_rate_and_off_sends_nothing() {
    testbed::require_root();
    let ips: Vec<Ipv4Addr> = (0..40)
        .map(|i| Ipv4Addr::new(198, 51, 100, 100 + i))
        .collect();
    // Owned by node-c, which runs no guard: node-a and node-b share them.
    let bed = bed("pbr", &ips, "node-c");
    let one = ["--probe-askers", "1", "--probe-max-per-second", "4"];
    let _a = start(&bed, 0, &one);
    let _b = start(&bed, 1, &one);
    let wire = RawSocket::open(&bed.peer, "eth0").unwrap();
    // Both records live and the share computed (the first requests out).
    wait_for(Duration::from_secs(20), || {
        let n = |i| probes(&bed, i).map_or(0, |p| p["live_guards"].as_u64().unwrap_or(0));
        (n(0) == 2 && n(1) == 2).then_some(())
    })
    .expect("both guards live");
    std::thread::sleep(Duration::from_secs(6));
    wire.drain();
    let window = Duration::from_secs(8);
    let seen = requests(&wire.collect_arp(window).unwrap());
    let live = vec!["node-a".to_string(), "node-b".to_string()];
    let mut per_node = [0usize; 2];
    for ((asker, ip), n) in &seen {
        let i = bed
            .nodes
            .iter()
            .position(|x| x.mac == *asker)
            .expect("a node's MAC");
        let want = guard::testing::probe_askers((*ip).into(), &live, Some("node-c"), 1);
        assert_eq!(
            want,
            [bed.nodes[i].name.clone()],
            "{ip} asked by {}",
            bed.nodes[i].name
        );
        per_node[i] += n;
    }
    // 4 a second each (20 IPs each at 1 s would be 20): the cap binds, and
    // both ask.
    for (i, n) in per_node.iter().enumerate() {
        assert!(
            (16..=4 * 8 + 4).contains(n),
            "node {i} sent {n} in {window:?}: {seen:?}"
        );
    }
    // Off: no request at all.
    drop((_a, _b));
    let off = start(&bed, 0, &["--probe-interval", "0"]);
    assert!(probes(&bed, 0).is_none(), "/probes answers while off");
    wire.drain();
    let seen = requests(&wire.collect_arp(Duration::from_secs(4)).unwrap());
    assert!(seen.is_empty(), "{seen:?}");
    // Monitor mode, every other flag at its default: nothing either (the
    // trial that changes nothing on the wire)...
    drop(off);
    let monitor = start(&bed, 0, &["--mode", "monitor"]);
    assert!(probes(&bed, 0).is_none(), "/probes answers in monitor mode");
    wire.drain();
    let seen = requests(&wire.collect_arp(Duration::from_secs(4)).unwrap());
    assert!(seen.is_empty(), "monitor mode asked: {seen:?}");
    // ...unless asked for.
    drop(monitor);
    let _asked = start(&bed, 0, &["--mode", "monitor", "--probe-in-monitor-mode"]);
    let asked = wait_for(Duration::from_secs(20), || {
        let seen = requests(&wire.collect_arp(Duration::from_secs(2)).unwrap());
        (!seen.is_empty()).then_some(seen)
    });
    assert!(asked.is_some(), "--probe-in-monitor-mode asked nothing");
}

#[test]
fn ipv6_owners_are_asked_with_neighbor_solicitations() {
    testbed::require_root();
    let bed = ClusterBed::new("pb6", &[LB]).unwrap();
    bed.cilium_service("web", &["198.51.100.100", "fd00::100"], "node-a", 3600);
    // IPv6 on the segment (the bed turns it off): node-b asks from its
    // link-local address; node-a holds the address on eth0, as an
    // announcer puts it there (the kernel answers NS only for an address
    // on the interface asked on).
    for ns in [&bed.nodes[0].ns, &bed.nodes[1].ns, &bed.peer] {
        for key in ["all", "default", "eth0"] {
            ns.sysctl(&format!("net.ipv6.conf.{key}.accept_dad"), "0")
                .unwrap();
        }
        for key in ["all", "default", "eth0"] {
            ns.sysctl(&format!("net.ipv6.conf.{key}.disable_ipv6"), "0")
                .unwrap();
        }
    }
    let owner = &bed.nodes[0].ns;
    owner
        .ip(&["addr", "add", "fd00::100/128", "dev", "eth0", "nodad"])
        .unwrap();
    let six = "fd00::100".parse::<std::net::IpAddr>().unwrap();
    let b = start(&bed, 1, &[]);
    let verdict = |ok: &dyn Fn(&Value) -> bool| {
        let mut last = Value::Null;
        wait_for(Duration::from_secs(25), || {
            last = probes(&bed, 1).unwrap_or_default();
            let e = last["ips"][six.to_string()].clone();
            ok(&e).then_some(e)
        })
        .unwrap_or_else(|| panic!("/probes never got there: {last:#}"))
    };
    let e = verdict(&|e| e["verdict"] == "answered");
    assert!(
        e["answered_by"][0]
            .as_str()
            .unwrap()
            .starts_with(&mac(bed.nodes[0].mac)),
        "{e:#}"
    );
    assert!(
        testbed::counter(
            &bed.nodes[1].ns,
            "arp_guard_probes_sent_total{family=\"ipv6\"}"
        ) > 0.0
    );
    // The owner lets the address go: silent.
    owner
        .ip(&["addr", "del", "fd00::100/128", "dev", "eth0"])
        .unwrap();
    let e = verdict(&|e| e["verdict"] == "silent_owner");
    assert_eq!(e["owner"], "node-a", "{e:#}");
    drop(b);
}

#[test]
fn a_guard_that_cannot_see_the_api_asks_nothing_and_accuses_nobody() {
    testbed::require_root();
    let bed = bed("pbb", &[LB], "node-a");
    let _b = start(&bed, 1, &[]);
    verdict_until(&bed, 1, LB, |e| e["verdict"] == "answered");
    // The API goes away: the feed cannot tell who owns what now.
    bed.api.set_down(true);
    let mut last = Value::Null;
    wait_for(Duration::from_secs(20), || {
        last = probes(&bed, 1).unwrap_or_default();
        last["paused"].is_string().then_some(())
    })
    .unwrap_or_else(|| panic!("never paused: {last:#}"));
    // The owner stops answering meanwhile: no request goes out, and no
    // verdict is drawn from the silence.
    bed.nodes[0]
        .ns
        .ip(&["addr", "del", &format!("{LB}/32"), "dev", "kube-ipvs0"])
        .unwrap();
    let wire = RawSocket::open(&bed.peer, "eth0").unwrap();
    wire.drain();
    let seen = requests(&wire.collect_arp(Duration::from_secs(4)).unwrap());
    assert!(seen.is_empty(), "requests while blind: {seen:?}");
    let e = probes(&bed, 1).unwrap()["ips"][LB.to_string()].clone();
    assert_eq!(e["verdict"], "answered", "{e:#}");
    assert_eq!(
        testbed::counter(&bed.nodes[1].ns, "arp_guard_probe_interval_seconds"),
        0.0
    );
    // Seeing again, it asks and finds the owner silent.
    bed.api.set_down(false);
    verdict_until(&bed, 1, LB, |e| e["verdict"] == "silent_owner");
}
