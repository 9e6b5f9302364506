//! Every shipped alert fires where it should (issue 42), for what one node
//! sees of its own: the test bed's node (an ownership file, a neighbour on
//! the segment) under one scenario per test, its `/metrics` scraped every
//! second, the shipped PrometheusRule evaluated by promtool on those series
//! ([`testbed::alerting`]); see `alerts_fire.rs` for the cluster's.
//!
//! - a takeover nobody announces (ArpGuardSilentTakeover), a client that
//!   keeps sending to the node after it lost the IP (ArpGuardStaleClients),
//!   a rogue MAC claiming an IP the node owns (ArpGuardResponderConflict),
//!   and a guard on the neighbour host told to guard an uplink it does not
//!   have (ArpGuardNotAttached);
//! - IPv6 with more extension headers than the parser follows
//!   (ArpGuardIpv6Unfollowed), beside a held advertisement re-sent.

use std::{
    net::{IpAddr, Ipv4Addr},
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use guard_common::ndp_build::NdSpec;
use testbed::{
    alerting::{end_of, fired_after, firing, Firing, Proof, STEP},
    bed::{Bed, FOREIGN, FOREIGN_ON_EGRESS, NODE, NODE_IP, OTHER, OWNED, OWNED_ON_EGRESS},
    bed6::{Bed6, FOREIGN6, OWNER_MAC, UNKNOWN6},
    ip_bytes, nd_bytes,
    promtool::{self, counter_like, Expect},
    scrape::{Sample, Scraper},
    ArpSpec, Daemon, Netns, RawSocket,
};

const CLIENT_A: [u8; 6] = [0x02, 0, 0x5e, 0, 0x53, 0xc1];
const CLIENT_B: [u8; 6] = [0x02, 0, 0x5e, 0, 0x53, 0xc2];
const CLIENT_A_IP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 31);
const CLIENT_B_IP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 32);
/// A MAC no node has.
const ROGUE: [u8; 6] = [0x02, 0, 0x5e, 0, 0x53, 0x66];
/// The age the stale clients alert waits for.
const STALE_ALERT: f64 = 300.0;

/// Check `expect` on `samples`; on failure, panic with `logs`.
fn prove(samples: &[Sample], ages: &[&str], expect: Vec<Expect>, logs: impl Fn() -> String) {
    let spec = promtool::shipped_rules().unwrap();
    let proof = Proof {
        file: file!(),
        fired_by: guard::reference::FIRED_BY,
        grows: &counter_like,
        ages,
        expect,
    };
    if let Err(e) = proof.check(&spec, samples) {
        panic!("{e:#}\n{}", logs());
    }
}

fn metric(ns: &Netns, series: &str) -> f64 {
    testbed::counter(ns, series)
}

/// The guard's state for `ip` (`/explain`).
fn state_of(ns: &Netns, ip: impl Into<IpAddr>) -> String {
    let ip = ip.into();
    let (_, body) = ns
        .enter(move || {
            Ok(testbed::http_get(
                "127.0.0.1:9477",
                &format!("/explain?ip={ip}"),
            ))
        })
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    v["state"].as_str().unwrap_or("-").to_owned()
}

/// The ownership file with the owners of `moves` changed.
fn owners_with(yaml: &str, moves: &[(IpAddr, &str, &str)]) -> String {
    moves.iter().fold(yaml.to_owned(), |y, (ip, from, to)| {
        y.replace(
            &format!("- ip: {ip}\n    owner: {from}"),
            &format!("- ip: {ip}\n    owner: {to}"),
        )
    })
}

/// Clears a flag however the scope ends (a panic too).
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// A guard on the peer host, told to guard `bond9` (it has none): it runs,
/// not ready, attached nowhere.
fn guard_without_uplink(bed: &Bed) -> Daemon {
    let owners = bed.dir.path().join("peer-owners.yaml");
    std::fs::write(&owners, "ips: []\n").unwrap();
    let owners = owners.to_string_lossy().into_owned();
    let args = [
        "-i",
        "bond9",
        "--node-name",
        "peer",
        "--ownership-file",
        &owners,
    ];
    let d = Daemon::spawn(&bed.peer, &args).unwrap();
    let listening = || {
        (bed.peer)
            .enter(|| Ok(std::net::TcpStream::connect("127.0.0.1:9477").is_ok()))
            .unwrap_or(false)
    };
    let up = testbed::wait_until(Duration::from_secs(30), || {
        listening() && metric(&bed.peer, "arp_guard_mode{mode=\"enforce\"}") == 1.0
    });
    assert!(up, "no /metrics on the peer:\n{}", d.log_text());
    d
}

/// node-a's oldest stale client as promtool replays its age (the last
/// scrape, then one second more each step): the first step at which it is
/// past the alert's 300 s, and its age at step `tick`.
fn oldest_at(samples: &[Sample], tick: usize) -> (usize, f64) {
    let input = promtool::series(samples, STEP);
    let (_, values) = (input.iter())
        .find(|(k, _)| {
            k.starts_with("arp_guard_stale_client_oldest_seconds{")
                && k.contains("instance=\"node-a\"")
        })
        .expect("a stale client age");
    let (&last, &v) = values.iter().next_back().unwrap();
    // promtool's `a+bxn`: a, then b added once a step.
    let mut x = v + 1.0;
    for _ in last + 1..tick {
        x += 1.0;
    }
    let first = last + (STALE_ALERT - v).max(0.0).ceil() as usize + 1;
    (first, if tick > last { x } else { v })
}

/// The moves of the ownership file: OWNED away, FOREIGN and
/// FOREIGN_ON_EGRESS here; the second announced (a takeover timed), the
/// first not (silent). Client A sends three packets after the move and
/// follows it (a failover time).
fn moves(bed: &Bed, wire: &RawSocket, logs: impl Fn() -> String) {
    let moves = [
        (OWNED.into(), NODE, OTHER),
        (FOREIGN.into(), OTHER, NODE),
        (FOREIGN_ON_EGRESS.into(), OTHER, NODE),
    ];
    bed.replace_owners(&owners_with(&testbed::bed::default_owners(), &moves))
        .unwrap();
    let owned = testbed::wait_until(Duration::from_secs(5), || {
        state_of(&bed.node, FOREIGN_ON_EGRESS) == "owned" && state_of(&bed.node, OWNED) == "foreign"
    });
    assert!(owned, "{}", logs());
    let speaker = RawSocket::open(&bed.node, "eth0").unwrap();
    let garp = ArpSpec::gratuitous(2, bed.node_mac, FOREIGN_ON_EGRESS).to_bytes();
    assert!(speaker.send(&garp).unwrap());
    for _ in 0..3 {
        wire.send(&to_node(bed, CLIENT_A, CLIENT_A_IP, OWNED))
            .unwrap();
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A packet from (`mac`, `src`) to `dst` through the node's MAC.
fn to_node(bed: &Bed, mac: [u8; 6], src: Ipv4Addr, dst: Ipv4Addr) -> Vec<u8> {
    ip_bytes(mac, bed.node_mac, src.into(), dst.into(), Some(9))
}

/// Client B never follows the move and the rogue keeps claiming, until
/// the node has seen all of it (and four scrapes more).
fn stale_client_and_rogue(bed: &Bed, wire: &RawSocket, logs: impl Fn() -> String) {
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        s.spawn(|| {
            let claim = ArpSpec::reply(ROGUE, OWNED_ON_EGRESS, bed.node_mac, NODE_IP).to_bytes();
            while !stop.load(Ordering::SeqCst) {
                wire.send(&to_node(bed, CLIENT_B, CLIENT_B_IP, OWNED))
                    .unwrap();
                wire.send(&claim).unwrap();
                std::thread::sleep(Duration::from_millis(250));
            }
        });
        let seen = testbed::wait_until(Duration::from_secs(30), || {
            [
                ("arp_guard_silent_takeovers_total", 1.0),
                ("arp_guard_stale_clients{cause=\"after_move\"}", 1.0),
                ("arp_guard_client_failover_seconds_count", 1.0),
                ("arp_guard_takeover_first_announcement_seconds_count", 1.0),
                (
                    "arp_guard_responder_conflicts{reason=\"claimed_elsewhere\"}",
                    1.0,
                ),
            ]
            .iter()
            .all(|(series, at_least)| metric(&bed.node, series) >= *at_least)
        });
        assert!(seen, "{}", logs());
        std::thread::sleep(STEP * 4);
    });
}

/// One node, three things going wrong on it at once, and a guard on the
/// neighbour host with no uplink: the ownership file moves OWNED away
/// (client A follows, client B keeps sending: stale), makes FOREIGN owned
/// with no announcement (silent) and FOREIGN_ON_EGRESS owned with one (a
/// takeover timed); a rogue MAC keeps claiming OWNED_ON_EGRESS, which the
/// node owns.
#[test]
fn a_takeover_stale_clients_and_a_rogue_on_one_node_page() {
    testbed::require_root();
    let bed = Bed::new("afs").unwrap();
    let args = [
        "--silent-takeover-after",
        "1s",
        "--stale-client-after",
        "3s",
        "--split-brain-after",
        "3s",
    ];
    let guard = bed.start(&args).unwrap();
    let lonely = guard_without_uplink(&bed);
    let logs = || {
        format!(
            "node-a:\n{}\npeer:\n{}",
            guard.log_text(),
            lonely.log_text()
        )
    };
    let scraper = Scraper::start(&[("node-a", &bed.node), ("peer", &bed.peer)], STEP).unwrap();
    let wire = RawSocket::open(&bed.peer, "eth0").unwrap();
    moves(&bed, &wire, logs);
    stale_client_and_rogue(&bed, &wire, logs);
    let samples = scraper.stop();
    let spec = promtool::shipped_rules().unwrap();
    let end = end_of(&samples);
    let fires = |alert: &str, who: Firing| {
        firing(&spec, alert, fired_after(&spec, alert, end), &[who]).unwrap()
    };
    // On an evaluation of the rules (the value shown is that evaluation's).
    let (first, _) = oldest_at(&samples, 0);
    let every = promtool::EVALUATION_INTERVAL.as_secs();
    let at_stale = Duration::from_secs((first as u64 + 60).div_ceil(every) * every);
    let (_, age) = oldest_at(&samples, at_stale.as_secs() as usize);
    let stale = Firing::new(&[("instance", "node-a")], Some(age));
    let reason = Firing::new(
        &[("instance", "node-a"), ("reason", "claimed_elsewhere")],
        None,
    );
    let expect = vec![
        fires("ArpGuardSilentTakeover", Firing::on("node-a")),
        fires("ArpGuardResponderConflict", reason),
        firing(&spec, "ArpGuardStaleClients", at_stale, &[stale]).unwrap(),
        fires("ArpGuardNotAttached", Firing::on("peer")),
    ];
    let ages = ["arp_guard_stale_client_oldest_seconds"];
    prove(&samples, &ages, expect, logs);
}

/// The IPv6 bed: the node's speaker sends an unsolicited advertisement of
/// FOREIGN6 (held: foreign here), which the guard re-sends once the
/// ownership file makes the IP this node's; then advertisements behind
/// five extension headers, more than the parser follows: passed unjudged,
/// counted, and alerted (ArpGuardIpv6Unfollowed).
#[test]
fn ipv6_the_parser_cannot_follow_pages() {
    testbed::require_root();
    let bed = Bed6::new("af6").unwrap();
    let guard = bed.start(&[]).unwrap();
    let scraper = Scraper::start(&[("node-a", &bed.node)], STEP).unwrap();
    let speaker = RawSocket::open(&bed.node, "eth0").unwrap();
    bed.peer_knows(FOREIGN6, OWNER_MAC).unwrap();
    let advert = nd_bytes(&NdSpec::unsolicited(bed.node_mac, FOREIGN6.octets()));
    assert!(!speaker.send(&advert).unwrap(), "dropped: foreign here");
    std::thread::sleep(Duration::from_millis(300));
    let moved = [(FOREIGN6.into(), OTHER, NODE)];
    bed.replace_owners(&owners_with(&testbed::bed6::plan().owners, &moved))
        .unwrap();
    let replayed = "arp_guard_announce_total{outcome=\"replayed\"}";
    let resent = testbed::wait_until(Duration::from_secs(5), || {
        metric(&bed.node, replayed) >= 1.0
    });
    assert!(resent, "{}", guard.log_text());
    let deep = nd_bytes(&NdSpec {
        ext_headers: 5,
        ..NdSpec::unsolicited(bed.node_mac, UNKNOWN6.octets())
    });
    let unfollowed = "arp_guard_datapath_frames_total{class=\"ipv6_unfollowed\"}";
    for _ in 0..4 {
        assert!(speaker.send(&deep).unwrap(), "passed");
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(metric(&bed.node, unfollowed) >= 4.0, "{}", guard.log_text());
    std::thread::sleep(STEP * 3);
    let samples = scraper.stop();
    let spec = promtool::shipped_rules().unwrap();
    let alert = "ArpGuardIpv6Unfollowed";
    let at = fired_after(&spec, alert, end_of(&samples));
    let expect = vec![firing(&spec, alert, at, &[Firing::on("node-a")]).unwrap()];
    prove(&samples, &[], expect, || guard.log_text());
}
