//! Interfaces over time: the LB IPs read from an interface's addresses
//! (`--lb-ips-from`) follow them, and guarded interfaces are attached as
//! they come and go.

use std::time::Duration;

use testbed::{
    bed::{Bed, FOREIGN, NODE, OWNED},
    wait_for, wait_until, ArpSpec, Daemon, RawSocket,
};

#[test]
fn lb_ips_from_interface_track_its_addresses() {
    testbed::require_root();
    let bed = Bed::new("ifsrc").unwrap();
    // Zero configuration: no ownership file, every address on kube-ipvs0 is unknown.
    let guard = Daemon::start(
        &bed.node,
        &[
            "-i",
            "eth0",
            "--node-name",
            NODE,
            "--lb-ips-from",
            "kube-ipvs0",
        ],
    )
    .unwrap();
    let ip = "198.51.100.120";
    // Not yet on kube-ipvs0: the node does not answer for it at all.
    assert_eq!(bed.resolve(ip), None);
    bed.node
        .ip(&["addr", "add", &format!("{ip}/32"), "dev", "kube-ipvs0"])
        .unwrap();
    let added = guard.expect_log(&format!("\"lb_ip\":\"{ip}\""), Duration::from_secs(5));
    assert!(added.contains("LB IP added"), "{added}");
    // kube-proxy's address is now local, the kernel would answer, the guard drops it.
    assert_eq!(
        bed.resolve(ip),
        None,
        "strictARP semantics: no reply for an unknown LB IP"
    );
    assert!(
        bed.packets(
            ip.parse::<std::net::Ipv4Addr>().unwrap(),
            "reply",
            "kernel",
            "dropped"
        )
        .unwrap()
            >= 1
    );
    // The same IP on the uplink itself (as kube-vip's leader does) is answered: arp_ignore=1 rule.
    bed.node
        .ip(&["addr", "add", &format!("{ip}/32"), "dev", "eth0"])
        .unwrap();
    // The address table is read after a netlink notification; give it a moment.
    let learned = wait_for(Duration::from_secs(5), || bed.resolve(ip));
    assert_eq!(learned, Some(bed.node_mac));
    bed.node
        .ip(&["addr", "del", &format!("{ip}/32"), "dev", "eth0"])
        .unwrap();
    bed.node
        .ip(&["addr", "del", &format!("{ip}/32"), "dev", "kube-ipvs0"])
        .unwrap();
    guard.expect_log("LB IP removed", Duration::from_secs(5));
    // The pre-existing kube-ipvs0 addresses were picked up at start.
    assert_eq!(
        bed.resolve(&OWNED.to_string()),
        None,
        "no file: OWNED is just another unknown LB IP here"
    );
}

/// Interfaces come and go: a pattern that matches nothing at start is a
/// warning; an interface that appears, is deleted and re-created, or is
/// renamed into the pattern gets the guard.
#[test]
fn interfaces_are_attached_as_they_come_and_go() {
    use testbed::netns::veth;
    testbed::require_root();
    let bed = Bed::new("plug").unwrap();
    let status = bed.dir.path().join("status.json");
    let guard = bed
        .start(&["-i", "up*", "--status-file", status.to_str().unwrap()])
        .unwrap();
    guard.expect_log(
        "no interface matches --interface up*",
        Duration::from_secs(5),
    );
    let state = || -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(&status).unwrap()).unwrap()
    };
    assert!(state()["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .any(|i| i["name"] == "up*" && i["state"] == "missing"));

    // A second uplink: node side `dev`, neighbour side `peer_dev`, on 203.0.113.0/24.
    let plug = |dev: &str, peer_dev: &str| {
        veth(&bed.node, dev, &bed.peer, peer_dev).unwrap();
        bed.node
            .ip(&["addr", "add", "203.0.113.11/24", "dev", dev])
            .unwrap();
        bed.peer
            .ip(&["addr", "add", "203.0.113.1/24", "dev", peer_dev])
            .unwrap();
    };
    // Does the node's kernel answer a request for `ip` arriving on `peer_dev`'s link?
    let answers = |peer_dev: &str, ip: std::net::Ipv4Addr| {
        let sock = RawSocket::open(&bed.peer, peer_dev).unwrap();
        let mac = bed.peer.mac(peer_dev).unwrap();
        sock.drain();
        sock.send(&ArpSpec::request(mac, "203.0.113.1".parse().unwrap(), ip).to_bytes())
            .unwrap();
        sock.wait_arp(Duration::from_millis(800), |c| c.op == 2 && c.spa == ip)
            .unwrap()
            .is_some()
    };
    let attached = |name: &str, n: usize| {
        wait_for(Duration::from_secs(5), || {
            (guard
                .lines("guard attached to egress")
                .iter()
                .filter(|l| l.contains(&format!("\"interface\":\"{name}\"")))
                .count()
                >= n)
                .then_some(())
        })
        .is_some()
    };

    plug("up1", "up1p");
    assert!(attached("up1", 1), "{}", guard.log_text());
    assert!(!answers("up1p", FOREIGN), "guarded as soon as it appeared");
    assert!(answers("up1p", OWNED));

    // Deleted and re-created (a new ifindex): guarded again.
    bed.node.ip(&["link", "del", "up1"]).unwrap();
    guard.expect_log("guarded interface disappeared", Duration::from_secs(5));
    plug("up1", "up1p");
    assert!(attached("up1", 2), "{}", guard.log_text());
    assert!(!answers("up1p", FOREIGN));

    // Renamed into the pattern.
    bed.node.ip(&["link", "del", "up1"]).unwrap();
    plug("tmp9", "tmp9p");
    assert!(
        answers("tmp9p", FOREIGN),
        "tmp9 matches no pattern: not guarded"
    );
    bed.node.ip(&["link", "set", "tmp9", "down"]).unwrap();
    bed.node
        .ip(&["link", "set", "tmp9", "name", "up2"])
        .unwrap();
    bed.node.ip(&["link", "set", "up2", "up"]).unwrap();
    assert!(attached("up2", 1), "{}", guard.log_text());
    assert!(wait_until(Duration::from_secs(3), || !answers(
        "tmp9p", FOREIGN
    )));
    assert!(state()["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .any(|i| i["name"] == "up2" && i["state"] == "attached"));
}
