//! `--interface auto` on the devices bare-metal nodes have, in the VM lane
//! (`cargo xtask vm-test`: a real NIC, bonding, VLAN and dummy devices):
//!
//! - a virtio NIC renamed `eno1` (a physical device: no link kind) with the
//!   default route, beside a real dummy kube-ipvs0: eno1 is guarded, the
//!   neighbour on the same hub (a second virtio NIC in its namespace) gets
//!   the owned IP and never the foreign one;
//! - `bond0` over two slaves holding the node's address and default route:
//!   the bond is guarded, not a slave, across a failover; a VLAN device
//!   `bond0.100` that takes the default route is guarded too (the bond
//!   stays: it was chosen and still qualifies);
//! - a Linux bridge holding the node's InternalIP (read from the Node
//!   object), with the node's former uplink as its port: the bridge is
//!   guarded, not the port (runs outside the lane too: bridges are
//!   everywhere).
//!
//! Each daemon runs with the DaemonSet's capabilities. Outside the VM lane
//! the tests that need its devices say why they skip.

use std::{net::Ipv4Addr, time::Duration};

use serde_json::Value;
use testbed::{
    bed::{default_owners, TempDir, FOREIGN, NODE, NODE_IP, OWNED, PEER_IP, UNKNOWN},
    kernel,
    netns::kube_ipvs0,
    wait_until, ArpSpec, Daemon, Netns, RawSocket,
};

/// The interfaces attached now, by the guard's `/status`, with why.
fn attached(node: &Netns) -> Vec<(String, Vec<String>)> {
    let (_, text) = node
        .enter(|| Ok(testbed::http_get("127.0.0.1:9477", "/status")))
        .unwrap();
    let v: Value = serde_json::from_str(&text).unwrap_or_default();
    (v["interfaces"].as_array().into_iter().flatten())
        .filter(|i| i["state"] == "attached")
        .map(|i| {
            let kinds = (i["chosen_by"].as_array().into_iter().flatten())
                .filter_map(|c| c["kind"].as_str().map(str::to_owned))
                .collect();
            (i["name"].as_str().unwrap_or_default().to_owned(), kinds)
        })
        .collect()
}

fn expect_attached(node: &Netns, guard: &Daemon, names: &[&str]) {
    let ok = wait_until(Duration::from_secs(30), || {
        attached(node)
            .iter()
            .map(|a| a.0.as_str())
            .eq(names.iter().copied())
    });
    assert!(
        ok,
        "attached {:?}, expected {names:?}\n{}",
        attached(node),
        guard.log_text()
    );
}

/// The guard, choosing by itself, with the DaemonSet's capabilities.
fn guard(node: &Netns, owners: &str) -> Daemon {
    #[rustfmt::skip]
    let args = [
        "-i", "auto", "--node-name", NODE, "--ownership-file", owners,
        "--lb-ips-from", "kube-ipvs0", "--file-poll", "200ms",
    ];
    Daemon::start_wrapped(node, &testbed::deploy::daemonset_wrapper(), &args).unwrap()
}

/// One request from the neighbour's `dev` (address `from`) per IP: answered?
fn answers(peer: &Netns, dev: &str, from: Ipv4Addr, ips: &[Ipv4Addr]) -> Vec<bool> {
    let sock = RawSocket::open(peer, dev).unwrap();
    let mac = peer.mac(dev).unwrap();
    ips.iter()
        .map(|ip| {
            sock.drain();
            sock.send(&ArpSpec::request(mac, from, *ip).to_bytes())
                .unwrap();
            sock.wait_arp(Duration::from_secs(2), |c| c.op == 2 && c.spa == *ip)
                .unwrap()
                .is_some()
        })
        .collect()
}

/// What the neighbour caches for `ip` after asking afresh through `dev`.
fn caches(peer: &Netns, dev: &str, ip: Ipv4Addr) -> Option<[u8; 6]> {
    peer.flush_neigh(dev).unwrap();
    peer.poke(&ip.to_string()).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    peer.cached_mac(dev, &ip.to_string()).unwrap()
}

/// The NICs of the virtio_net driver in the root namespace.
fn virtio_nics() -> Vec<String> {
    let mut out: Vec<String> = (std::fs::read_dir("/sys/class/net").into_iter().flatten())
        .flatten()
        .filter(|e| {
            std::fs::read_link(e.path().join("device/driver"))
                .is_ok_and(|d| d.ends_with("virtio_net"))
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    out.sort();
    out
}

/// The owners file and the dummy kube-ipvs0 with the usual LB IPs.
fn lb_side(node: &Netns, tag: &str) -> (TempDir, String) {
    kube_ipvs0(node, &[OWNED, FOREIGN, UNKNOWN]).unwrap();
    let dir = TempDir::new(tag).unwrap();
    let owners = dir.path().join("owners.yaml");
    std::fs::write(&owners, default_owners()).unwrap();
    let owners = owners.to_string_lossy().into_owned();
    (dir, owners)
}

#[test]
fn a_nic_named_eno1_with_the_default_route() {
    testbed::require_root();
    let nics = virtio_nics();
    if !kernel::require(
        "two virtio NICs on one hub (the VM lane's)",
        nics.len() >= 2,
    ) {
        return;
    }
    let node = Netns::new("kup-eno-n").unwrap();
    let peer = Netns::new("kup-eno-p").unwrap();
    for (nic, ns, name) in [(&nics[0], &node, "eno1"), (&nics[1], &peer, "eno2")] {
        std::process::Command::new("ip")
            .args(["link", "set", nic, "netns", &ns.name])
            .status()
            .unwrap();
        ns.ip(&["link", "set", nic, "name", name]).unwrap();
        ns.ip(&["link", "set", name, "up"]).unwrap();
        ns.sysctl("net.ipv6.conf.all.disable_ipv6", "1").unwrap();
    }
    node.ip(&["addr", "add", &format!("{NODE_IP}/24"), "dev", "eno1"])
        .unwrap();
    peer.ip(&["addr", "add", &format!("{PEER_IP}/24"), "dev", "eno2"])
        .unwrap();
    node.ip(&["route", "add", "default", "via", &PEER_IP.to_string()])
        .unwrap();
    let (_dir, owners) = lb_side(&node, "kup-eno");
    let g = guard(&node, &owners);
    expect_attached(&node, &g, &["eno1"]);
    assert_eq!(attached(&node)[0].1, ["default-route"]);
    assert_eq!(
        answers(&peer, "eno2", PEER_IP, &[OWNED, FOREIGN]),
        [true, false]
    );
    let node_mac = node.mac("eno1").unwrap();
    assert_eq!(caches(&peer, "eno2", OWNED), Some(node_mac));
    assert_eq!(caches(&peer, "eno2", FOREIGN), None);
}

#[test]
fn a_bond_over_two_slaves_and_its_vlan() {
    testbed::require_root();
    if !kernel::require("bonding", kernel::has_link_kind("bond"))
        || !kernel::require("VLAN devices", kernel::has_link_kind("vlan"))
    {
        return;
    }
    let node = Netns::new("kup-bond-n").unwrap();
    let peer = Netns::new("kup-bond-p").unwrap();
    #[rustfmt::skip]
    node.ip(&["link", "add", "bond0", "type", "bond", "mode", "active-backup", "miimon", "100"]).unwrap();
    peer.ip(&["link", "add", "br0", "type", "bridge"]).unwrap();
    for (n, p) in [("eno1", "p0"), ("eno2", "p1")] {
        #[rustfmt::skip]
        node.ip(&["link", "add", n, "type", "veth", "peer", "name", p, "netns", &peer.name]).unwrap();
        node.ip(&["link", "set", n, "master", "bond0"]).unwrap();
        peer.ip(&["link", "set", p, "master", "br0"]).unwrap();
        node.ip(&["link", "set", n, "up"]).unwrap();
        peer.ip(&["link", "set", p, "up"]).unwrap();
    }
    node.ip(&["link", "set", "bond0", "up"]).unwrap();
    peer.ip(&["link", "set", "br0", "up"]).unwrap();
    for ns in [&node, &peer] {
        ns.sysctl("net.ipv6.conf.all.disable_ipv6", "1").unwrap();
    }
    node.ip(&["addr", "add", &format!("{NODE_IP}/24"), "dev", "bond0"])
        .unwrap();
    peer.ip(&["addr", "add", &format!("{PEER_IP}/24"), "dev", "br0"])
        .unwrap();
    node.ip(&["route", "add", "default", "via", &PEER_IP.to_string()])
        .unwrap();
    let (_dir, owners) = lb_side(&node, "kup-bond");
    let g = guard(&node, &owners);
    expect_attached(&node, &g, &["bond0"]);
    assert_eq!(
        answers(&peer, "br0", PEER_IP, &[OWNED, FOREIGN]),
        [true, false]
    );
    // A failover: the other slave carries the replies, still through the bond.
    let active = node
        .exec(&["cat", "/sys/class/net/bond0/bonding/active_slave"])
        .unwrap();
    node.ip(&["link", "set", active.trim(), "down"]).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        answers(&peer, "br0", PEER_IP, &[OWNED, FOREIGN]),
        [true, false]
    );
    // The default route moves to a VLAN on the bond: bond0.100 joins.
    #[rustfmt::skip]
    node.ip(&["link", "add", "link", "bond0", "name", "bond0.100", "type", "vlan", "id", "100"]).unwrap();
    #[rustfmt::skip]
    peer.ip(&["link", "add", "link", "br0", "name", "br0.100", "type", "vlan", "id", "100"]).unwrap();
    node.ip(&["link", "set", "bond0.100", "up"]).unwrap();
    peer.ip(&["link", "set", "br0.100", "up"]).unwrap();
    node.ip(&["addr", "add", "203.0.113.11/24", "dev", "bond0.100"])
        .unwrap();
    peer.ip(&["addr", "add", "203.0.113.1/24", "dev", "br0.100"])
        .unwrap();
    #[rustfmt::skip]
    node.ip(&["route", "replace", "default", "via", "203.0.113.1", "dev", "bond0.100"]).unwrap();
    expect_attached(&node, &g, &["bond0", "bond0.100"]);
    let why = attached(&node);
    assert_eq!(why[0].1, ["kept"], "{why:?}");
    assert_eq!(why[1].1, ["default-route"], "{why:?}");
    let from = Ipv4Addr::new(203, 0, 113, 1);
    assert_eq!(
        answers(&peer, "br0.100", from, &[OWNED, FOREIGN]),
        [true, false]
    );
}

/// A bridge holding the Node's InternalIP (from the fake API), the node's
/// former uplink eth0 its port.
#[test]
fn a_bridge_holding_the_node_ip() {
    use testbed::{
        cluster_bed::ClusterBed,
        fake_api::{objects, Resource},
    };
    testbed::require_root();
    let mut bed = ClusterBed::with_nodes("kup-br", &[FOREIGN], 1).unwrap();
    bed.uplinks = "auto".into();
    let ip = "198.51.100.11";
    bed.api
        .apply(Resource::Nodes, objects::node_with_ips("node-a", &[ip]));
    let n = &bed.nodes[0].ns;
    n.ip(&["link", "add", "br0", "type", "bridge"]).unwrap();
    n.ip(&["addr", "del", &format!("{ip}/24"), "dev", "eth0"])
        .unwrap();
    n.ip(&["link", "set", "eth0", "master", "br0"]).unwrap();
    n.ip(&["link", "set", "br0", "up"]).unwrap();
    n.ip(&["addr", "add", &format!("{ip}/24"), "dev", "br0"])
        .unwrap();
    let wrapper = testbed::deploy::daemonset_wrapper();
    let args = ["--announcer", "metallb"];
    let g = (bed.start_on_wrapped(0, &wrapper, &args, Duration::from_secs(60))).unwrap();
    expect_attached(n, &g, &["br0"]);
    assert_eq!(attached(n)[0].1, ["node-ip"]);
    // The foreign LB IP (on kube-ipvs0, no owner the guard trusts: unknown
    // here) is not answered through the bridge; the node itself is.
    let node_ip: Ipv4Addr = ip.parse().unwrap();
    let peer = testbed::cluster_bed::PEER_IP;
    assert_eq!(
        answers(&bed.peer, "eth0", peer, &[node_ip, FOREIGN]),
        [true, false]
    );
}
