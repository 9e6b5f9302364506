//! Kubernetes Events on the Service: what the guards find is told where an
//! operator looks (`kubectl describe svc web`), against the fake API server
//! and real frames: a two-node cluster (kube-vip style Leases, `default/web`
//! on 198.51.100.100 owned by node-a, a client with a cache entry for it).
//!
//! - a silent takeover: one Warning `SilentTakeover` on the Service, the
//!   node named (reporting instance, related Node, message);
//! - a split-brain speaker on the non-owner, stopped again and again: one
//!   Warning `SplitBrainSpeaker`, repeats a series of the same Event;
//! - a forged second MAC claiming the owned IP: Warning `ResponderConflict`
//!   from the owner, then Normal `ResponderConflictResolved`;
//! - clients that keep sending to node-b, which does not own the IP: no
//!   Event while fewer than `--kube-events-stale-clients` are stale, then
//!   one Warning `StaleClients` naming node-b and the clients;
//! - a flood stays within the per-stream rate limit;
//! - `--kube-events=false`: no request for events at all;
//! - the API refusing events (403): counted, and guarding goes on.

use std::{
    net::{Ipv4Addr, SocketAddr, UdpSocket},
    time::Duration,
};

use serde_json::Value;
use testbed::{
    cluster_bed::PEER_IP,
    fake_api::{objects, Resource},
    netns::fmt_mac,
    takeover::{Style, TakeoverBed, LB},
    ArpSpec,
};

/// The common flags: takeovers called silent after 1 s, and streams that
/// may publish again after 1 s (so that a test sees a series grow).
const FAST: &[&str] = &[
    "--silent-takeover-after",
    "1s",
    "--kube-events-interval",
    "1s",
    "--split-brain-after",
    "2s",
];

fn bed(tag: &str, extra: &[&str]) -> TakeoverBed {
    let mut args = FAST.to_vec();
    args.extend_from_slice(extra);
    TakeoverBed::new(tag, Style::KubeVip, true, &args).unwrap()
}

/// The Events with `reason`.
fn events(t: &TakeoverBed, reason: &str) -> Vec<Value> {
    (t.bed.api.events().into_iter())
        .filter(|e| e["reason"] == reason)
        .collect()
}

/// Past the silent-takeover threshold after the start, no Event: node-a
/// learned at its first sync that it owns `web`, which is not a takeover
/// (a restart must not look like a silent one). The requests for events
/// so far.
fn settled(t: &TakeoverBed) -> (u64, u64) {
    std::thread::sleep(Duration::from_millis(2500));
    assert!(
        t.bed.api.events().is_empty(),
        "an Event at start: {:#?}",
        t.bed.api.events()
    );
    t.bed.api.event_requests()
}

/// Wait until an Event with `reason` exists; it.
fn wait_event(t: &TakeoverBed, reason: &str, within: Duration) -> Value {
    testbed::wait_for(within, || events(t, reason).into_iter().next()).unwrap_or_else(|| {
        panic!(
            "no {reason} Event; events: {:#?}\nnode-a:\n{}\nnode-b:\n{}",
            t.bed.api.events(),
            t.guards[0].log_text(),
            t.guards[1].log_text()
        )
    })
}

/// node-b holds the Lease now, and nobody announces it.
fn silent_takeover(t: &TakeoverBed) {
    t.bed.api.apply(
        Resource::Leases,
        objects::lease(
            "default",
            "kubevip-web",
            "node-b",
            60,
            "2026-11-30T10:00:01.000000Z",
        ),
    );
}

/// The Event is on the Service `default/web` (with its UID, which kubectl
/// describe selects by), from arp-guard on `node`.
fn on_web_from(e: &Value, node: &str) {
    let r = &e["regarding"];
    assert_eq!(r["kind"], "Service", "{e:#}");
    assert_eq!(r["namespace"], "default", "{e:#}");
    assert_eq!(r["name"], "web", "{e:#}");
    assert!(r["uid"].as_str().is_some_and(|u| !u.is_empty()), "{e:#}");
    assert_eq!(e["metadata"]["namespace"], "default", "{e:#}");
    assert_eq!(e["reportingController"], "arp-guard", "{e:#}");
    assert_eq!(e["reportingInstance"], node, "{e:#}");
}

#[test]
fn a_silent_takeover_is_a_warning_on_the_service_naming_the_node() {
    testbed::require_root();
    let t = bed("kev-st", &[]);
    settled(&t);
    silent_takeover(&t);
    let e = wait_event(&t, "SilentTakeover", Duration::from_secs(10));
    on_web_from(&e, "node-b");
    assert_eq!(e["type"], "Warning");
    assert_eq!(e["related"]["kind"], "Node");
    assert_eq!(e["related"]["name"], "node-b");
    let note = e["note"].as_str().unwrap();
    assert!(
        note.starts_with(&format!(
            "node-b took over {LB} and sent no announcement within 1s"
        )),
        "{note}"
    );
    // One takeover, one Event.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(events(&t, "SilentTakeover").len(), 1);
    assert_eq!(t.bed.api.events().len(), 1, "{:#?}", t.bed.api.events());
}

#[test]
fn a_split_brain_speaker_is_one_warning_whose_repeats_are_a_series() {
    testbed::require_root();
    let t = bed("kev-sb", &[]);
    let (posts0, patches0) = settled(&t);
    let mac = t.bed.nodes[1].mac;
    // node-b's speaker keeps announcing the IP node-a owns; its guard stops
    // every one of them.
    let garp = ArpSpec::gratuitous(2, mac, LB).to_bytes();
    let count = |e: &Value| e["series"]["count"].as_i64().unwrap_or(1);
    let mut seen = None;
    for _ in 0..60 {
        assert!(!t.speakers[1].send(&garp).unwrap(), "the guard let it out");
        std::thread::sleep(Duration::from_millis(200));
        seen = events(&t, "SplitBrainSpeaker").into_iter().next();
        if seen.as_ref().is_some_and(|e| count(e) >= 3) {
            break;
        }
    }
    let e = seen.expect("a SplitBrainSpeaker Event");
    on_web_from(&e, "node-b");
    assert_eq!(e["type"], "Warning");
    assert_eq!(e["related"]["name"], "node-b");
    assert!(count(&e) >= 3, "repeats counted in its series: {e:#}");
    let note = e["note"].as_str().unwrap();
    assert!(
        note.starts_with("a speaker on node-b (eth0) has announced"),
        "{note}"
    );
    assert!(note.contains("node-b does not own it"), "{note}");
    // One Event, updated in place.
    assert_eq!(events(&t, "SplitBrainSpeaker").len(), 1);
    let (posts, patches) = t.bed.api.event_requests();
    assert_eq!(posts - posts0, 1);
    assert!(patches - patches0 >= 2);
}

#[test]
fn a_forged_claim_of_an_owned_ip_is_a_conflict_then_resolved() {
    testbed::require_root();
    // Presence renewed every second: conflicts are judged once the records
    // could say whose kernels answer (2 periods and a second).
    let t = bed(
        "kev-cf",
        &["--census-window", "3s", "--presence-period", "1s"],
    );
    let forged = [0x02, 0, 0, 0, 0, 0x99];
    let garp = ArpSpec::gratuitous(2, forged, LB).to_bytes();
    // The conflict counts once it lasted CONFIRM_AFTER (3 s).
    let found = testbed::wait_for(Duration::from_secs(15), || {
        t.capture.send(&garp).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        events(&t, "ResponderConflict").into_iter().next()
    });
    let e = found.unwrap_or_else(|| panic!("no conflict:\n{}", t.guards[0].log_text()));
    // The owner reports it; node-b (whose census sees the claim too) does not.
    on_web_from(&e, "node-a");
    assert_eq!(e["type"], "Warning");
    let note = e["note"].as_str().unwrap();
    assert!(
        note.contains(
            "node-a owns 198.51.100.100 and another MAC claims it too (02:00:00:00:00:99)"
        ),
        "{note}"
    );
    // Quiet for the window: resolved.
    let ok = wait_event(&t, "ResponderConflictResolved", Duration::from_secs(15));
    on_web_from(&ok, "node-a");
    assert_eq!(ok["type"], "Normal");
    assert!(events(&t, "ResponderConflict")
        .iter()
        .all(|e| e["reportingInstance"] == "node-a"));
}

/// A second client: forged frames from its own MAC and IP on the client's
/// wire, addressed to node-b's MAC.
const CLIENT_B: [u8; 6] = [0x02, 0, 0x5e, 0, 0x53, 0xc2];
const CLIENT_B_IP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 32);

/// Why node-b treats the IP as it does (its `/status` row's source), the
/// words the Event quotes.
fn source_on(t: &TakeoverBed, i: usize) -> String {
    let (_, body) = (t.bed.nodes[i].ns)
        .enter(|| Ok(testbed::http_get("127.0.0.1:9477", "/status")))
        .unwrap();
    let v: Value = serde_json::from_str(&body).unwrap();
    (v["ips"].as_array().into_iter().flatten())
        .find(|r| r["ip"] == LB.to_string())
        .and_then(|r| r["source"].as_str().map(str::to_owned))
        .unwrap_or_else(|| panic!("no row for {LB} in {v:#}"))
}

#[test]
fn stale_clients_beyond_the_threshold_are_a_warning_naming_the_node() {
    testbed::require_root();
    let t = bed(
        "kev-sc",
        &[
            "--stale-client-after",
            "1s",
            "--kube-events-stale-clients",
            "2",
        ],
    );
    let (posts0, _) = settled(&t);
    let (node_b, peer) = (&t.bed.nodes[1], &t.bed.peer);
    // The client's own stack: its entry for the IP holds node-b's MAC for
    // good, so its datagrams reach node-b, which does not own the IP.
    peer.set_neigh("eth0", LB, &node_b.mac, "permanent")
        .unwrap();
    let udp = peer
        .enter(|| Ok(UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?))
        .unwrap();
    let forged = testbed::ip_bytes(CLIENT_B, node_b.mac, CLIENT_B_IP.into(), LB.into(), Some(9));
    // One round of traffic every 100 ms: the client, and B when `both`.
    let send = |both: bool| {
        udp.send_to(b"stale?", SocketAddr::from((LB, 7777)))
            .unwrap();
        if both {
            assert!(t.capture.send(&forged).unwrap());
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let stale = |n: usize| t.guards[1].count_log("stale client:") >= n;
    // One stale client, below the threshold of two: node-b says so in its
    // log, and no Event follows (past the 1 s stream interval and the
    // reader's tick).
    let one = testbed::wait_for(Duration::from_secs(10), || {
        send(false);
        stale(1).then_some(())
    });
    assert!(one.is_some(), "{}", t.guards[1].log_text());
    for _ in 0..25 {
        send(false);
    }
    assert!(
        events(&t, "StaleClients").is_empty(),
        "an Event below the threshold: {:#?}",
        t.bed.api.events()
    );
    // A second client goes stale: the threshold is reached.
    let e = testbed::wait_for(Duration::from_secs(10), || {
        send(true);
        events(&t, "StaleClients").into_iter().next()
    })
    .unwrap_or_else(|| {
        panic!(
            "no StaleClients Event; events: {:#?}\nnode-b:\n{}",
            t.bed.api.events(),
            t.guards[1].log_text()
        )
    });
    assert!(stale(2), "{}", t.guards[1].log_text());
    on_web_from(&e, "node-b");
    assert_eq!(e["type"], "Warning");
    assert_eq!(e["action"], "WatchClients");
    assert_eq!(e["related"]["kind"], "Node");
    assert_eq!(e["related"]["name"], "node-b");
    let note = e["note"].as_str().unwrap();
    // The message: who sends where, why node-b is not the owner, and the
    // clients, each once (the peer's stack, then B, in the order they went
    // stale).
    let head = format!(
        "clients still send {LB}'s traffic to node-b, which does not own it ({}): ",
        source_on(&t, 1)
    );
    let list = (note.strip_prefix(&head))
        .and_then(|n| n.strip_suffix("; their neighbour caches hold node-b's MAC"))
        .unwrap_or_else(|| {
            panic!("{note}\nnot of the form: {head}...; their neighbour caches hold node-b's MAC")
        });
    let client = format!("{PEER_IP} ({})", fmt_mac(&peer.mac("eth0").unwrap()));
    let b = format!("{CLIENT_B_IP} ({})", fmt_mac(&CLIENT_B));
    assert_eq!(list.split(", ").collect::<Vec<_>>(), [client, b], "{note}");
    // The same two keep sending, and make no second Event: one Event, no
    // series, nothing from node-a (no client reaches it).
    for _ in 0..25 {
        send(true);
    }
    let all = events(&t, "StaleClients");
    assert_eq!(all.len(), 1, "{all:#?}");
    assert!(all[0]["series"].is_null(), "{all:#?}");
    assert_eq!(t.bed.api.event_requests().0 - posts0, 1);
    let published = "arp_guard_kube_events_total{reason=\"StaleClients\",outcome=\"published\"}";
    assert_eq!(testbed::counter(&node_b.ns, published), 1.0);
    assert_eq!(testbed::counter(&t.bed.nodes[0].ns, published), 0.0);
}

#[test]
fn a_flood_stays_within_the_rate_limit() {
    testbed::require_root();
    // The default: one Event per Service and reason a minute.
    let t = TakeoverBed::new(
        "kev-fl",
        Style::KubeVip,
        true,
        &["--split-brain-after", "0s"],
    )
    .unwrap();
    let (posts0, patches0) = settled(&t);
    let garp = ArpSpec::gratuitous(2, t.bed.nodes[1].mac, LB).to_bytes();
    for _ in 0..500 {
        t.speakers[1].send(&garp).unwrap();
        std::thread::sleep(Duration::from_millis(10));
    }
    wait_event(&t, "SplitBrainSpeaker", Duration::from_secs(5));
    std::thread::sleep(Duration::from_secs(2));
    let (posts, patches) = t.bed.api.event_requests();
    assert_eq!(
        (posts - posts0, patches - patches0),
        (1, 0),
        "{:#?}\n{:#?}",
        t.bed.api.events(),
        t.bed.api.event_log()
    );
    let published =
        "arp_guard_kube_events_total{reason=\"SplitBrainSpeaker\",outcome=\"published\"}";
    assert_eq!(testbed::counter(&t.bed.nodes[1].ns, published), 1.0);
}

#[test]
fn events_off_means_no_request_for_events() {
    testbed::require_root();
    let t = bed("kev-off", &["--kube-events=false"]);
    silent_takeover(&t);
    assert!(
        t.guards[1]
            .wait_log("silent takeover", Duration::from_secs(10))
            .is_some(),
        "{}",
        t.guards[1].log_text()
    );
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(t.bed.api.event_requests(), (0, 0));
    assert!(t.bed.api.events().is_empty());
}

#[test]
fn refused_events_are_counted_and_guarding_goes_on() {
    testbed::require_root();
    let mut t = bed("kev-403", &[]);
    t.bed.api.set_events_refused(Some(403));
    silent_takeover(&t);
    t.owner = 1;
    let failed = "arp_guard_kube_events_total{reason=\"SilentTakeover\",outcome=\"failed\"}";
    let node_b = &t.bed.nodes[1].ns;
    assert!(
        testbed::wait_until(Duration::from_secs(10), || testbed::counter(node_b, failed)
            >= 1.0),
        "{}",
        t.guards[1].log_text()
    );
    assert!(events(&t, "SilentTakeover").is_empty());
    assert!(t.guards[1]
        .log_text()
        .contains("cannot publish a Kubernetes Event"));
    // Guarding is not affected: the next takeover (back to node-a) reaches
    // the client at once, and node-b stops announcing what it lost.
    let r = t.round(Duration::from_secs(3)).unwrap();
    assert_eq!(r.to, 0);
    assert!(r.moved_after.is_some(), "the client did not follow: {r:?}");
    let garp = ArpSpec::gratuitous(2, t.bed.nodes[1].mac, LB).to_bytes();
    assert!(!t.speakers[1].send(&garp).unwrap());
}
