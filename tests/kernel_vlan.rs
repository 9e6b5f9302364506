//! The uplink as a real 802.1Q VLAN device (eth0.100 on eth0): the guard on
//! the VLAN device, and on its parent, where the kernel's replies leave with
//! the tag in skb metadata (the VLAN device's default) or in the frame data
//! (a VLAN device created over a device without tx VLAN offload, with
//! `reorder_hdr off`, builds tagged headers; with the offload merely turned
//! off later, the tag stays in metadata past the TC hook). Either way a frame is judged against the
//! addresses of the VLAN device it came from: an unknown LB IP configured on
//! eth0.100 passes (the arp_ignore=1 rule, as the kernel answered on that
//! device), and an announce leak is rewritten to eth0.100's primary address,
//! not to eth0's, which is in another subnet. Needs 8021q: runs in
//! `cargo xtask vm-test`.

use std::{net::Ipv4Addr, time::Duration};

use testbed::{
    bed::{Bed, FOREIGN, OWNED, UNKNOWN},
    kernel, RawSocket,
};

const NODE_VLAN_IP: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 11);
const PEER_VLAN_IP: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 1);
/// An LB IP with no known owner, configured on the VLAN device itself.
const UNKNOWN_ON_VLAN: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 104);
const VID: &str = "100";

/// The bed with VLAN 100 on both ends; the peer reaches the node's LB IPs
/// through the VLAN.
fn vlan_bed(tag: &str, tag_in_data: bool) -> Bed {
    let bed = Bed::new(tag).unwrap();
    let reorder_hdr = if tag_in_data {
        // The VLAN device picks its header code when it is created: over a
        // device without tx VLAN offload, and with reorder_hdr off, it
        // writes the tag into the frame it builds.
        bed.node
            .exec(&["ethtool", "-K", "eth0", "txvlan", "off"])
            .unwrap();
        "off"
    } else {
        "on"
    };
    for (ns, ip) in [(&bed.node, NODE_VLAN_IP), (&bed.peer, PEER_VLAN_IP)] {
        #[rustfmt::skip]
        ns.ip(&[
            "link", "add", "link", "eth0", "name", "eth0.100", "type", "vlan", "id", VID,
            "reorder_hdr", reorder_hdr,
        ])
        .unwrap();
        ns.ip(&["addr", "add", &format!("{ip}/24"), "dev", "eth0.100"])
            .unwrap();
        ns.ip(&["link", "set", "eth0.100", "up"]).unwrap();
    }
    bed.node
        .ip(&[
            "addr",
            "add",
            &format!("{UNKNOWN_ON_VLAN}/32"),
            "dev",
            "eth0.100",
        ])
        .unwrap();
    for ip in [OWNED, FOREIGN, UNKNOWN] {
        bed.peer
            .ip(&["route", "add", &format!("{ip}/32"), "dev", "eth0.100"])
            .unwrap();
    }
    let owners = std::fs::read_to_string(&bed.owners).unwrap();
    std::fs::write(
        &bed.owners,
        format!("{owners}  - ip: {UNKNOWN_ON_VLAN}\n    owner: null\n"),
    )
    .unwrap();
    bed
}

/// What the peer learns on its VLAN device for each IP.
fn learned(bed: &Bed, ips: &[Ipv4Addr]) -> Vec<Option<[u8; 6]>> {
    let mut out = Vec::new();
    for ip in ips {
        bed.peer.flush_neigh("eth0.100").unwrap();
        bed.peer.poke(&ip.to_string()).unwrap();
        let got = testbed::wait_for(Duration::from_secs(2), || {
            bed.peer
                .cached_mac("eth0.100", &ip.to_string())
                .ok()
                .flatten()
        });
        out.push(got);
    }
    out
}

/// The node's announce leak from `FOREIGN` toward the peer on the VLAN: the
/// SPA the peer receives.
fn leak_spa(bed: &Bed) -> Ipv4Addr {
    let cap = RawSocket::open(&bed.peer, "eth0.100").unwrap();
    bed.node.flush_neigh("eth0.100").unwrap();
    cap.drain();
    bed.node
        .poke_from(&FOREIGN.to_string(), &PEER_VLAN_IP.to_string())
        .unwrap();
    let got = cap
        .wait_arp(Duration::from_secs(3), |c| {
            c.op == 1 && c.tpa == PEER_VLAN_IP && c.sha == bed.node_mac
        })
        .unwrap()
        .expect("the node's ARP request reached the peer");
    got.spa
}

fn check(bed: &Bed, guarded: &str) {
    let node = Some(bed.node_mac);
    assert_eq!(
        learned(bed, &[OWNED, FOREIGN, UNKNOWN, UNKNOWN_ON_VLAN]),
        vec![node, None, None, node],
        "guard on {guarded}: owned and unknown-on-eth0.100 pass, the rest is dropped"
    );
    assert_eq!(
        leak_spa(bed),
        NODE_VLAN_IP,
        "guard on {guarded}: the leak is rewritten to eth0.100's primary"
    );
}

#[test]
fn guard_on_the_vlan_device() {
    testbed::require_root();
    if !kernel::require("VLAN devices", kernel::has_link_kind("vlan")) {
        return;
    }
    let bed = vlan_bed("vlan-dev", false);
    let args = bed.args(&[]);
    let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
    args[1] = "eth0.100";
    let _guard = testbed::Daemon::start(&bed.node, &args).unwrap();
    check(&bed, "eth0.100");
}

#[test]
fn guard_on_the_parent_judges_a_tag_in_metadata_by_its_vlan_device() {
    testbed::require_root();
    if !kernel::require("VLAN devices", kernel::has_link_kind("vlan")) {
        return;
    }
    let bed = vlan_bed("vlan-meta", false);
    let _guard = bed.start(&[]).unwrap();
    let before = bed.total("arp_vlan_in_metadata").unwrap();
    check(&bed, "eth0 (tag in metadata)");
    assert!(
        bed.total("arp_vlan_in_metadata").unwrap() > before,
        "the frames carried their tag in metadata"
    );
    // The VLAN device is re-created under the running guard (a new ifindex,
    // its addresses again): the guard follows it.
    bed.node.ip(&["link", "del", "eth0.100"]).unwrap();
    #[rustfmt::skip]
    bed.node
        .ip(&["link", "add", "link", "eth0", "name", "eth0.100", "type", "vlan", "id", VID])
        .unwrap();
    for a in [
        format!("{NODE_VLAN_IP}/24"),
        format!("{UNKNOWN_ON_VLAN}/32"),
    ] {
        bed.node
            .ip(&["addr", "add", &a, "dev", "eth0.100"])
            .unwrap();
    }
    bed.node.ip(&["link", "set", "eth0.100", "up"]).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    check(&bed, "eth0, VLAN device re-created");
}

#[test]
fn guard_on_the_parent_judges_a_tag_in_the_data_by_its_vlan_device() {
    testbed::require_root();
    if !kernel::require("VLAN devices", kernel::has_link_kind("vlan")) {
        return;
    }
    let bed = vlan_bed("vlan-data", true);
    let _guard = bed.start(&[]).unwrap();
    let before = bed.total("arp_vlan_in_metadata").unwrap();
    check(&bed, "eth0 (tag in data)");
    assert_eq!(
        bed.total("arp_vlan_in_metadata").unwrap(),
        before,
        "the tag is in the frame, not in metadata"
    );
}

/// A takeover announcement sent on the VLAN device leaves the parent with
/// its tag in skb metadata; the guard on the parent drops it (the IP is
/// foreign there yet) and holds it; once the IP is owned here it re-sends
/// the copy with the tag put back into the bytes, and the peer's VLAN
/// device hears it (its entry moves to the node).
#[test]
fn a_held_announcement_keeps_its_vlan_tag() {
    testbed::require_root();
    if !kernel::require("VLAN devices", kernel::has_link_kind("vlan")) {
        return;
    }
    let bed = vlan_bed("vlan-held", false);
    let guard = bed.start(&[]).unwrap();
    let other = [2, 0, 0, 0, 0, 0xbb];
    bed.peer
        .sysctl("net.ipv4.neigh.eth0/100.base_reachable_time_ms", "600000")
        .unwrap();
    bed.peer
        .set_neigh("eth0.100", FOREIGN, &other, "reachable")
        .unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    let speaker = RawSocket::open(&bed.node, "eth0.100").unwrap();
    let garp = testbed::ArpSpec::gratuitous(2, bed.node_mac, FOREIGN).to_bytes();
    assert!(!speaker.send(&garp).unwrap(), "dropped on the parent");
    let owners = std::fs::read_to_string(&bed.owners).unwrap();
    let owners = owners.replace(
        &format!("- ip: {FOREIGN}\n    owner: node-b"),
        &format!("- ip: {FOREIGN}\n    owner: node-a"),
    );
    bed.replace_owners(&owners).unwrap();
    let moved = testbed::wait_until(Duration::from_secs(5), || {
        bed.peer
            .cached_mac("eth0.100", &FOREIGN.to_string())
            .unwrap()
            == Some(bed.node_mac)
    });
    assert!(
        moved,
        "the re-sent copy did not reach the peer's VLAN device:\n{}",
        guard.log_text()
    );
    guard.expect_log("held announcements re-sent", Duration::from_secs(1));
}
