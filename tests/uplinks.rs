//! `--interface auto` on real devices in namespaces: the guard finds the
//! node's uplinks by itself and follows them.
//!
//! - Nothing qualifies (no default route, no API): NotReady with the one
//!   message that names what was looked at and the fix, and the node's
//!   kernel still answers (nothing is guarded: the test can fail).
//! - A default route appears: that device is guarded; the neighbour can no
//!   longer cache the node's MAC for a foreign LB IP, the owned one it can.
//! - The exclusions: a CNI bridge carrying a default route of its own,
//!   Pods' veths and docker0 are pointed at or present and never guarded
//!   (they show as `skipped` with why).
//! - A late bridge with a default route: the bridge is guarded, not its port,
//!   and the kernel's replies through it are stopped.
//! - A rename: still guarded, and a device once chosen stays while it
//!   qualifies (the rename flushed its routes).
//! - An uplink enslaved to a new bridge: the bridge is attached before the
//!   slave is detached, and a neighbour asking all the while is never
//!   answered for the foreign IP.
//! - The metric `arp_guard_uplink_info` says what was chosen and why.
//!
//! The daemon runs with the DaemonSet's capabilities.

use std::{
    net::Ipv4Addr,
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use serde_json::Value;
use testbed::{
    bed::{Bed, FOREIGN, OWNED, PEER_IP},
    netns::veth,
    wait_until, ArpSpec, Daemon, RawSocket,
};

/// The node whose guard's `/status` is read.
type Status<'a> = &'a testbed::Netns;

/// The interfaces of the guard's `/status`: (name, state, detail, reasons).
fn interfaces(status: Status<'_>) -> Vec<(String, String, String, Vec<String>)> {
    let (_, text) = status
        .enter(|| Ok(testbed::http_get("127.0.0.1:9477", "/status")))
        .unwrap();
    let v: Value = serde_json::from_str(&text).unwrap_or_default();
    (v["interfaces"].as_array().into_iter().flatten())
        .map(|i| {
            let kinds = (i["chosen_by"].as_array().into_iter().flatten())
                .filter_map(|c| c["kind"].as_str().map(str::to_owned))
                .collect();
            let s = |k: &str| i[k].as_str().unwrap_or_default().to_owned();
            (s("name"), s("state"), s("detail"), kinds)
        })
        .collect()
}

/// The names attached now.
fn attached(status: Status<'_>) -> Vec<String> {
    (interfaces(status).into_iter())
        .filter(|i| i.1 == "attached")
        .map(|i| i.0)
        .collect()
}

/// Wait until exactly `names` are attached; fail with the status and log.
fn expect_attached(status: Status<'_>, guard: &Daemon, names: &[&str]) {
    let ok = wait_until(Duration::from_secs(10), || attached(status) == names);
    assert!(
        ok,
        "attached {:?}, expected {names:?}; interfaces {:#?}\nlog:\n{}",
        attached(status),
        interfaces(status),
        guard.log_text()
    );
}

/// Does the node answer a request for `ip` from the peer's `dev` within 800 ms?
fn answers(bed: &Bed, dev: &str, from: Ipv4Addr, ip: Ipv4Addr) -> bool {
    let sock = RawSocket::open(&bed.peer, dev).unwrap();
    let mac = bed.peer.mac(dev).unwrap();
    sock.drain();
    sock.send(&ArpSpec::request(mac, from, ip).to_bytes())
        .unwrap();
    sock.wait_arp(Duration::from_millis(800), |c| c.op == 2 && c.spa == ip)
        .unwrap()
        .is_some()
}

#[test]
fn auto_finds_the_uplinks_and_follows_them() {
    testbed::require_root();
    let bed = Bed::new("upl").unwrap();
    let status = &bed.node;
    let args = bed.args_guarding("auto", &[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    // With the DaemonSet's privileges: netlink's routes and links need none more.
    let wrapper = testbed::deploy::daemonset_wrapper();
    let guard = Daemon::start_wrapped(&bed.node, &wrapper, &args).unwrap();

    // Nothing to go by: NotReady, said once, and nothing guarded.
    let said = guard.expect_log("--interface auto found no uplink", Duration::from_secs(5));
    assert!(
        said.contains("default routes via none") && said.contains("INTERFACE="),
        "{said}"
    );
    let (code, body) = bed
        .node
        .enter(|| Ok(testbed::http_get("127.0.0.1:9477", "/readyz")))
        .unwrap();
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("--interface auto found no uplink"), "{body}");
    assert_eq!(
        bed.peer_learns(&[FOREIGN]).unwrap(),
        vec![Some(bed.node_mac)],
        "unguarded, the node's kernel answers for the foreign IP"
    );

    // The default route: eth0 is the uplink.
    let gw = PEER_IP.to_string();
    bed.node
        .ip(&["route", "add", "default", "via", &gw, "dev", "eth0"])
        .unwrap();
    expect_attached(status, &guard, &["eth0"]);
    assert_eq!(
        bed.peer_learns(&[FOREIGN, OWNED]).unwrap(),
        vec![None, Some(bed.node_mac)]
    );
    let info = "arp_guard_uplink_info{interface=\"eth0\",chosen_by=\"default-route\"}";
    assert_eq!(testbed::counter(&bed.node, info), 1.0);
    let (code, _) = bed
        .node
        .enter(|| Ok(testbed::http_get("127.0.0.1:9477", "/readyz")))
        .unwrap();
    assert_eq!(code, 200);

    exclusions(&bed, &guard, status);
    let eth1 = late_bridge(&bed, &guard, status);
    renamed_bridge_is_kept(&bed, &guard, status, eth1);
    enslaved_without_a_gap(&bed, &guard, status);
}

/// A CNI bridge with a default route of its own (a higher metric), a Pod's
/// veth on it, docker0: none guarded, each said.
fn exclusions(bed: &Bed, guard: &Daemon, status: Status<'_>) {
    let n = &bed.node;
    for br in ["cni0", "docker0"] {
        n.ip(&["link", "add", br, "type", "bridge"]).unwrap();
        n.ip(&["link", "set", br, "up"]).unwrap();
    }
    n.ip(&["addr", "add", "203.0.113.129/25", "dev", "cni0"])
        .unwrap();
    n.ip(&[
        "link",
        "add",
        "vethpod0",
        "type",
        "veth",
        "peer",
        "name",
        "vethpod0p",
    ])
    .unwrap();
    n.ip(&["link", "set", "vethpod0", "master", "cni0"])
        .unwrap();
    for v in ["vethpod0", "vethpod0p"] {
        n.ip(&["link", "set", v, "up"]).unwrap();
    }
    n.ip(&[
        "route",
        "add",
        "default",
        "via",
        "203.0.113.130",
        "dev",
        "cni0",
        "metric",
        "500",
    ])
    .unwrap();
    let skipped = wait_until(Duration::from_secs(10), || {
        interfaces(status)
            .iter()
            .any(|i| i.0 == "cni0" && i.1 == "skipped" && i.2.contains("name cni*"))
    });
    assert!(
        skipped,
        "cni0 not said as skipped: {:#?}",
        interfaces(status)
    );
    expect_attached(status, guard, &["eth0"]);
    n.ip(&[
        "route",
        "del",
        "default",
        "via",
        "203.0.113.130",
        "dev",
        "cni0",
    ])
    .unwrap();
}

/// A bridge over a new link to the peer, with a default route: the bridge
/// is guarded (not its port) and stops the kernel's replies through it.
/// Returns the peer's side of the link.
fn late_bridge(bed: &Bed, guard: &Daemon, status: Status<'_>) -> &'static str {
    let n = &bed.node;
    veth(n, "eno2", &bed.peer, "eth1").unwrap();
    n.ip(&["link", "add", "br0", "type", "bridge"]).unwrap();
    n.ip(&["link", "set", "eno2", "master", "br0"]).unwrap();
    n.ip(&["link", "set", "br0", "up"]).unwrap();
    n.ip(&["addr", "add", "203.0.113.11/25", "dev", "br0"])
        .unwrap();
    bed.peer
        .ip(&["addr", "add", "203.0.113.1/25", "dev", "eth1"])
        .unwrap();
    let peer = Ipv4Addr::new(203, 0, 113, 1);
    // Before it is guarded, the node answers through it: the check can fail.
    assert!(answers(bed, "eth1", peer, FOREIGN));
    n.ip(&[
        "route",
        "add",
        "default",
        "via",
        "203.0.113.1",
        "dev",
        "br0",
        "metric",
        "200",
    ])
    .unwrap();
    expect_attached(status, guard, &["br0", "eth0"]);
    assert!(
        !answers(bed, "eth1", peer, FOREIGN),
        "the bridge is guarded"
    );
    assert!(
        answers(bed, "eth1", peer, OWNED),
        "the owned IP is answered"
    );
    "eth1"
}

/// br0 renamed (down and up: its routes are flushed): still guarded under
/// its new name, kept while it qualifies.
fn renamed_bridge_is_kept(bed: &Bed, guard: &Daemon, status: Status<'_>, dev: &str) {
    let n = &bed.node;
    n.ip(&["link", "set", "br0", "down"]).unwrap();
    n.ip(&["link", "set", "br0", "name", "lan-br"]).unwrap();
    n.ip(&["link", "set", "lan-br", "up"]).unwrap();
    expect_attached(status, guard, &["eth0", "lan-br"]);
    let kept = interfaces(status)
        .into_iter()
        .any(|i| i.0 == "lan-br" && i.3 == ["kept"]);
    assert!(kept, "{:#?}", interfaces(status));
    let peer = Ipv4Addr::new(203, 0, 113, 1);
    // The bridge's port needs a moment to forward again after the flap.
    let guarded = wait_until(Duration::from_secs(5), || answers(bed, dev, peer, OWNED));
    assert!(guarded, "the renamed bridge forwards again");
    assert!(!answers(bed, dev, peer, FOREIGN), "and is still guarded");
}

/// eth0 becomes a port of a new bridge br1 (its default route with it):
/// br1 is attached before eth0 is detached, and a neighbour asking for the
/// foreign IP every 5 ms all the while is never answered.
fn enslaved_without_a_gap(bed: &Bed, guard: &Daemon, status: Status<'_>) {
    let n = &bed.node;
    let stop = Arc::new(AtomicBool::new(false));
    let (asked, answered) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let asker = {
        let (stop, asked, answered) = (stop.clone(), asked.clone(), answered.clone());
        let sock = RawSocket::open(&bed.peer, "eth0").unwrap();
        let req = ArpSpec::request(bed.peer_mac, PEER_IP, FOREIGN).to_bytes();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                sock.send(&req).unwrap();
                asked.fetch_add(1, Ordering::Relaxed);
                let got = sock
                    .wait_arp(Duration::from_millis(5), |c| c.op == 2 && c.spa == FOREIGN)
                    .unwrap();
                if got.is_some() {
                    answered.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    n.ip(&["link", "add", "br1", "type", "bridge"]).unwrap();
    n.ip(&["link", "set", "br1", "up"]).unwrap();
    n.ip(&["link", "set", "eth0", "master", "br1"]).unwrap();
    expect_attached(status, guard, &["br1", "lan-br"]);
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    asker.join().unwrap();
    assert!(asked.load(Ordering::Relaxed) > 50);
    assert_eq!(
        answered.load(Ordering::Relaxed),
        0,
        "a reply for the foreign IP left while the uplink moved"
    );
    let log = guard.log_text();
    let on = log
        .lines()
        .position(|l| l.contains("guard attached to egress") && l.contains("br1"));
    let off = log
        .lines()
        .position(|l| l.contains("guard detached") && l.contains("eth0"));
    assert!(
        matches!((on, off), (Some(a), Some(d)) if a < d),
        "br1 attached (line {on:?}) before eth0 detached (line {off:?}):\n{log}"
    );
}

/// Requests of `verb` on `resource` (its plural, any selector) the API saw.
fn requests(api: &testbed::fake_api::FakeApi, verb: &str, resource: &str) -> u64 {
    (api.tally().into_iter())
        .filter(|((_, v, r), _)| *v == verb && r.split('?').next() == Some(resource))
        .map(|(_, c)| c.requests)
        .sum()
}

/// With the API: the interfaces MetalLB's L2Advertisement names are guarded
/// at once, while the Node cannot be read (a 503: the routes and the
/// announcers choose meanwhile, nothing waits for it); once it can, the
/// device holding its InternalIP joins. An announcer's CRD the cluster
/// does not have (Cilium's policies: 404) is asked once, not again and
/// again. The guard runs with the DaemonSet's capabilities.
#[test]
fn auto_reads_the_node_s_address_and_the_announcers_interfaces() {
    use testbed::{
        cluster_bed::ClusterBed,
        fake_api::{objects, Fault, Resource},
    };
    testbed::require_root();
    let mut bed = ClusterBed::with_nodes("uplc", &[FOREIGN], 1).unwrap();
    bed.uplinks = "auto".into();
    bed.api.apply(
        Resource::Nodes,
        objects::node_with_ips("node-a", &["198.51.100.11"]),
    );
    bed.api.apply(
        Resource::L2Advertisements,
        objects::l2_advertisement("metallb-system", "mgmt", &["mgmt0"]),
    );
    bed.api.set_fault(Resource::Nodes, Some(Fault::Status(503)));
    bed.api
        .set_fault(Resource::L2Policies, Some(Fault::Status(404)));
    let wrapper = testbed::deploy::daemonset_wrapper();
    let args = ["--announcer", "metallb,cilium"];
    let guard = (bed.start_on_wrapped(0, &wrapper, &args, Duration::from_secs(20))).unwrap();
    let node = &bed.nodes[0].ns;
    expect_attached(node, &guard, &["mgmt0"]);
    let mgmt = interfaces(node)
        .into_iter()
        .find(|i| i.0 == "mgmt0")
        .unwrap();
    assert_eq!(mgmt.3, ["announcer"], "{mgmt:?}");
    // The Node answers again: its InternalIP's device joins.
    bed.api.set_fault(Resource::Nodes, None);
    let joined = wait_until(Duration::from_secs(40), || {
        attached(node) == ["eth0", "mgmt0"]
    });
    assert!(joined, "{:#?}\n{}", interfaces(node), guard.log_text());
    let info = "arp_guard_uplink_info{interface=\"eth0\",chosen_by=\"node-ip\"}";
    assert_eq!(testbed::counter(node, info), 1.0);
    // The L2Advertisement names another interface: mgmt0 (a veth nothing
    // else points at) leaves, after nothing.
    bed.api.apply(
        Resource::L2Advertisements,
        objects::l2_advertisement("metallb-system", "mgmt", &["eth0"]),
    );
    expect_attached(node, &guard, &["eth0"]);
    let eth0 = interfaces(node)
        .into_iter()
        .find(|i| i.0 == "eth0")
        .unwrap();
    assert_eq!(eth0.3, ["node-ip", "announcer"], "{eth0:?}");
    // Cilium's policies are not served here: listed once, not retried.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        requests(&bed.api, "list", "ciliuml2announcementpolicies"),
        1,
        "{:#?}",
        bed.api.tally()
    );
    assert!(
        requests(&bed.api, "get", "nodes") >= 2,
        "the Node read again after the 503"
    );
}
