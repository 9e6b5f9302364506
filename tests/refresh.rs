//! Healing stale clients (`--refresh-stale-clients`): after a takeover, a
//! client whose cache still holds the old owner's MAC (a 10-minute
//! reachable time, and it ignores gratuitous ARP for the LB IP, as many
//! routers and firewalls do) keeps sending to the old owner. The old
//! owner's guard sees that traffic arrive for an IP that is foreign there,
//! knows the new owner's MAC from its census (the new owner announced, alone,
//! since the move) and sends the client one unicast ARP reply teaching it.
//!
//! The bed is `testbed::takeover` (two nodes, Cilium's order: the Lease,
//! then one gratuitous ARP), the guards run with the DaemonSet's
//! capabilities and read-only root; IPv6 on `testbed::bed6` (the ownership
//! file, an advertisement forged for the owner). What is asserted is what the client
//! caches (`ip neigh`): moved to the new owner within 2 s with the flag,
//! still the old owner without it, and never a rogue claimant's MAC.

use std::{
    net::{SocketAddr, UdpSocket},
    time::{Duration, Instant},
};

use testbed::{
    netns::fmt_mac,
    stale_client::{ignore_gratuitous, Traffic},
    takeover::{Style, TakeoverBed, LB},
    ArpSpec, RawSocket,
};

/// The bound: the client holds the new owner's MAC this soon.
const HEALED_WITHIN: Duration = Duration::from_secs(2);
const ROGUE: [u8; 6] = [0x02, 0, 0x5e, 0, 0x53, 0x66];

fn cached(t: &TakeoverBed) -> Option<[u8; 6]> {
    t.bed.peer.cached_mac("eth0", &LB.to_string()).ok()?
}

/// A bed with node-a owning the IP, the client pinned to it (10-minute
/// cache, gratuitous ARP ignored) and sending; guards with `extra`.
fn stale_bed(tag: &str, extra: &[&str]) -> (TakeoverBed, Traffic) {
    let t = TakeoverBed::new_wrapped(
        tag,
        Style::Cilium,
        true,
        extra,
        &testbed::deploy::daemonset_wrapper(),
    )
    .unwrap();
    ignore_gratuitous(&t.bed.peer, LB);
    let traffic = Traffic::start(&t.bed.peer, LB);
    assert_eq!(
        cached(&t),
        Some(t.bed.nodes[0].mac),
        "the client starts at node-a"
    );
    (t, traffic)
}

#[test]
fn a_stale_client_is_taught_the_new_owner_with_the_flag() {
    let (mut t, _traffic) = stale_bed("rf1", &["--refresh-stale-clients"]);
    let (to, started, _) = t.take_over().unwrap();
    let want = t.bed.nodes[to].mac;
    let healed = testbed::wait_for(Duration::from_secs(10), || {
        (cached(&t) == Some(want)).then(|| started.elapsed())
    });
    let old = &t.bed.nodes[0].ns;
    let log = t.guards[0].log_text();
    let healed = healed.unwrap_or_else(|| {
        panic!(
            "the client still holds {:?}; node-a's log:\n{log}",
            cached(&t).map(|m| fmt_mac(&m))
        )
    });
    assert!(
        healed <= HEALED_WITHIN,
        "healed after {healed:?}, over {HEALED_WITHIN:?}"
    );
    assert!(
        testbed::counter(old, "arp_guard_client_refreshes_total{outcome=\"sent\"}") >= 1.0,
        "the refresh is counted"
    );
    assert!(
        log.contains("stale client refreshed"),
        "the refresh is logged:\n{log}"
    );
    assert!(
        log.contains(&format!("\"owner_mac\":\"{}\"", fmt_mac(&want))),
        "with the owner's MAC:\n{log}"
    );
    // The client moved and stopped arriving at node-a: no more refreshes
    // than the per-minute limit, ever.
    std::thread::sleep(Duration::from_secs(1));
    assert!(testbed::counter(old, "arp_guard_client_refreshes_total{outcome=\"sent\"}") <= 3.0);
    eprintln!("healed after {healed:?}");
}

#[test]
fn without_the_flag_the_client_stays_stale() {
    let (mut t, _traffic) = stale_bed("rf2", &[]);
    let (_, started, _) = t.take_over().unwrap();
    let old_mac = t.bed.nodes[0].mac;
    // It is misdirected at node-a all along, and nobody teaches it.
    let listed = testbed::wait_for(Duration::from_secs(5), || {
        let (_, body) = t.bed.nodes[0]
            .ns
            .enter(|| Ok(testbed::http_get("127.0.0.1:9477", "/clients")))
            .ok()?;
        let v: serde_json::Value = serde_json::from_str(&body).ok()?;
        (v["ips"][LB.to_string()]["sending"].as_u64() >= Some(1)).then_some(())
    });
    assert!(listed.is_some(), "node-a lists the misdirected client");
    while started.elapsed() < HEALED_WITHIN + Duration::from_secs(1) {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        cached(&t),
        Some(old_mac),
        "without the flag nothing is sent"
    );
    assert!(!t.guards[0].log_text().contains("stale client refreshed"));
}

/// A rogue claims the IP every 200 ms from `from_before` on (before the
/// move, or only after it) for 4 s after the move; what the client holds
/// meanwhile must never be the rogue's MAC. Returns the bed and node-a's
/// refreshes sent.
fn with_a_rogue(tag: &str, from_before: bool, presence: bool) -> (TakeoverBed, Traffic, f64) {
    let mut flags = vec!["--refresh-stale-clients"];
    // The census alone, or with presence (the owner's own record makes its
    // MAC certain, rogue or not), renewed and read every second here.
    flags.extend(["--presence-period", if presence { "1s" } else { "0" }]);
    let (mut t, traffic) = stale_bed(tag, &flags);
    if presence {
        // Node-a has read node-b's record.
        let (_, body) = testbed::wait_for(Duration::from_secs(10), || {
            let r = t.bed.nodes[0]
                .ns
                .enter(|| Ok(testbed::http_get("127.0.0.1:9477", "/cluster")))
                .ok()?;
            let doc: serde_json::Value = serde_json::from_str(&r.1).ok()?;
            let live = doc["guards"]
                .as_array()?
                .iter()
                .any(|g| g["node"] == t.bed.nodes[1].name.as_str() && g["live"] == true);
            live.then_some(r)
        })
        .expect("node-a never listed node-b's presence record");
        eprintln!("{body}");
    }
    let rogue = RawSocket::open(&t.bed.peer, "eth0").unwrap();
    let claim = ArpSpec::gratuitous(2, ROGUE, LB).to_bytes();
    if from_before {
        // Longer before the move than the hold window (5 s), which claims
        // may precede the move by.
        let began = Instant::now();
        while began.elapsed() < Duration::from_millis(5500) {
            rogue.send(&claim).unwrap();
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    t.take_over().unwrap();
    let seen = Instant::now();
    while seen.elapsed() < Duration::from_secs(4) {
        rogue.send(&claim).unwrap();
        assert_ne!(cached(&t), Some(ROGUE), "the rogue's MAC is never taught");
        std::thread::sleep(Duration::from_millis(200));
    }
    let sent = testbed::counter(
        &t.bed.nodes[0].ns,
        "arp_guard_client_refreshes_total{outcome=\"sent\"}",
    );
    (t, traffic, sent)
}

#[test]
fn a_rogue_beside_the_owner_is_never_taught() {
    // Both begin claiming at the move: two MACs, no certain owner.
    let (t, _traffic, sent) = with_a_rogue("rf3", false, false);
    assert_eq!(cached(&t), Some(t.bed.nodes[0].mac), "nobody taught");
    assert_eq!(sent, 0.0);
    assert!(
        testbed::counter(
            &t.bed.nodes[0].ns,
            "arp_guard_client_refreshes_total{outcome=\"owner_uncertain\"}"
        ) >= 1.0,
        "the client was considered and skipped:\n{}",
        t.guards[0].log_text()
    );
}

#[test]
fn a_claimant_from_before_the_move_does_not_count() {
    // The rogue was claiming before the move and goes on: only the MAC that
    // began claiming since the move, the new owner's, is taught.
    let (t, _traffic, sent) = with_a_rogue("rf4", true, false);
    assert_eq!(cached(&t), Some(t.bed.nodes[1].mac), "the new owner taught");
    assert!(sent >= 1.0);
}

#[test]
fn with_presence_the_owner_is_taught_beside_a_rogue() {
    // The owner's guard published its MAC: a rogue claiming beside it
    // changes nothing, the owner's MAC is certain.
    let (t, _traffic, sent) = with_a_rogue("rf5", false, true);
    assert_eq!(cached(&t), Some(t.bed.nodes[1].mac), "the new owner taught");
    assert!(sent >= 1.0);
    let log = t.guards[0].log_text();
    assert!(log.contains("\"evidence\":\"presence\""), "{log}");
}

/// IPv6: a client sending to an LB IP this node never owned (the file says
/// another node does) is taught the MAC that alone advertised it, by a
/// overriding Neighbor Advertisement sent to its MAC.
#[test]
fn an_ipv6_client_is_taught_by_an_advertisement() {
    use guard_common::ndp_build::NdSpec;
    use testbed::bed6::{Bed6, FOREIGN6, OWNER_MAC};
    let bed = Bed6::new("rf6").unwrap();
    let guard = bed.start(&["--refresh-stale-clients"]).unwrap();
    bed.peer
        .sysctl("net.ipv6.neigh.eth0.base_reachable_time_ms", "600000")
        .unwrap();
    bed.peer
        .set_neigh("eth0", FOREIGN6, &bed.node_mac, "reachable")
        .unwrap();
    // The owner advertised the IP (the peer sends it, so its own stack
    // never hears it: only the node's census does).
    let wire = RawSocket::open(&bed.peer, "eth0").unwrap();
    let advert = testbed::nd_bytes(&NdSpec::unsolicited(OWNER_MAC, FOREIGN6.octets()));
    assert!(wire.send(&advert).unwrap());
    std::thread::sleep(Duration::from_millis(1100));
    let socket = bed
        .peer
        .enter(|| Ok(UdpSocket::bind((std::net::Ipv6Addr::UNSPECIFIED, 0))?))
        .unwrap();
    let started = Instant::now();
    let healed = testbed::wait_for(Duration::from_secs(10), || {
        let _ = socket.send_to(b"stale?", SocketAddr::from((FOREIGN6, 7777)));
        std::thread::sleep(Duration::from_millis(50));
        (bed.peer_entry(FOREIGN6).ok()? == Some(OWNER_MAC)).then(|| started.elapsed())
    });
    let log = guard.log_text();
    assert!(
        healed.is_some(),
        "the client still holds {:?}:\n{log}",
        bed.peer_entry(FOREIGN6)
    );
    assert!(
        testbed::counter(
            &bed.node,
            "arp_guard_client_refreshes_total{outcome=\"sent\"}"
        ) >= 1.0,
        "{log}"
    );
    eprintln!("healed after {healed:?}");
}
