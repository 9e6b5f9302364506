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
//! capabilities and read-only root. What is asserted is what the client
//! caches (`ip neigh`): moved to the new owner within 2 s with the flag,
//! still the old owner without it, and never a rogue claimant's MAC.

use std::{
    net::{Ipv4Addr, SocketAddr, UdpSocket},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use testbed::{
    netns::fmt_mac,
    takeover::{Style, TakeoverBed, LB},
    ArpSpec, Netns, RawSocket,
};

/// The bound: the client holds the new owner's MAC this soon.
const HEALED_WITHIN: Duration = Duration::from_secs(2);
const ROGUE: [u8; 6] = [0x02, 0, 0x5e, 0, 0x53, 0x66];

fn metric(ns: &Netns, series: &str) -> f64 {
    let (_, text) = ns
        .enter(|| Ok(testbed::http_get("127.0.0.1:9477", "/metrics")))
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// The client ignores gratuitous ARP for the LB IP (any ARP whose target
/// is the LB IP): only a frame addressed to it can change its entry.
fn ignore_gratuitous(client: &Netns) {
    let lb = LB.to_string();
    for cmd in [
        vec!["nft", "add", "table", "arp", "router"],
        vec![
            "nft",
            "add",
            "chain",
            "arp",
            "router",
            "in",
            "{ type filter hook input priority 0; }",
        ],
        vec![
            "nft", "add", "rule", "arp", "router", "in", "arp", "daddr", "ip", &lb, "drop",
        ],
    ] {
        client.exec(&cmd).unwrap();
    }
}

/// The client's own stack sends UDP to the LB IP every 50 ms until dropped.
struct Traffic {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Traffic {
    fn start(client: &Netns) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let socket = client
            .enter(|| Ok(UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?))
            .unwrap();
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                // A send the stack refuses (no neighbour yet) is retried.
                let _ = socket.send_to(b"stale?", SocketAddr::from((LB, 7777)));
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        Traffic {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Traffic {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

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
    ignore_gratuitous(&t.bed.peer);
    let traffic = Traffic::start(&t.bed.peer);
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
        metric(old, "arp_guard_client_refreshes_total{outcome=\"sent\"}") >= 1.0,
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
    assert!(metric(old, "arp_guard_client_refreshes_total{outcome=\"sent\"}") <= 3.0);
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

#[test]
fn a_rogue_claimant_is_never_taught() {
    // The census alone (presence off: with it, the owner's own record
    // would make its MAC certain, rogue or not).
    let (mut t, _traffic) = stale_bed(
        "rf3",
        &["--refresh-stale-clients", "--presence-period", "0"],
    );
    // A rogue on the segment claims the IP too, before and after the move:
    // the census sees two MACs since the move, so no MAC is certain.
    let rogue = RawSocket::open(&t.bed.peer, "eth0").unwrap();
    let claim = ArpSpec::gratuitous(2, ROGUE, LB).to_bytes();
    rogue.send(&claim).unwrap();
    let (_, started, _) = t.take_over().unwrap();
    let old = &t.bed.nodes[0].ns;
    let seen = Instant::now();
    while seen.elapsed() < Duration::from_secs(4) {
        rogue.send(&claim).unwrap();
        assert_ne!(cached(&t), Some(ROGUE), "the rogue's MAC is never taught");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        cached(&t),
        Some(t.bed.nodes[0].mac),
        "no refresh without a certain owner ({:?} after the move)",
        started.elapsed()
    );
    assert_eq!(
        metric(old, "arp_guard_client_refreshes_total{outcome=\"sent\"}"),
        0.0
    );
    assert!(
        metric(
            old,
            "arp_guard_client_refreshes_total{outcome=\"owner_uncertain\"}"
        ) >= 1.0,
        "the client was considered and skipped:\n{}",
        t.guards[0].log_text()
    );
}
