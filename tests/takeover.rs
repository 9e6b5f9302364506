//! A takeover announcement is never lost to the guard: the announcement a
//! new owner sends before its guard has heard of the takeover is dropped
//! (the IP is still foreign there), held, and re-sent byte for byte the
//! moment the IP becomes owned (here the ownership file makes it so: the
//! kernel's side of it, IPv4 and IPv6, under the DaemonSet's
//! capabilities). What never becomes owned stays stopped; monitor mode
//! holds nothing; every takeover is timed to its first announcement, or
//! called silent. The announcers' own orders, against a client's cache,
//! are in `takeover_rounds.rs`.

use std::time::Duration;

use testbed::{
    bed::{Bed, FOREIGN, NODE, OWNED},
    bed6::{Bed6, FOREIGN6, OWNER_MAC},
    nd_bytes, ArpSpec, Daemon, Netns, RawSocket,
};

fn metric(ns: &Netns, series: &str) -> f64 {
    let (_, text) = ns
        .enter(|| Ok(testbed::http_get("127.0.0.1:9477", "/metrics")))
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// The node's `/status` row for `ip`.
fn status_row(ns: &Netns, ip: impl std::fmt::Display) -> serde_json::Value {
    let (_, body) = ns
        .enter(|| Ok(testbed::http_get("127.0.0.1:9477", "/status")))
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let ip = ip.to_string();
    v["ips"]
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["ip"] == ip.as_str()).cloned())
        .unwrap_or(serde_json::Value::Null)
}

/// Wait until the node's guard has `ip` in `state`.
fn wait_state(ns: &Netns, ip: impl std::fmt::Display + Copy, state: &str) {
    assert!(
        testbed::wait_until(Duration::from_secs(5), || status_row(ns, ip)["state"]
            == state),
        "{ip} never became {state}: {:#}",
        status_row(ns, ip)
    );
}

/// The node's speaker announces `ip`; whether the kernel let it out.
fn garp(speaker: &RawSocket, mac: [u8; 6], ip: std::net::Ipv4Addr) -> bool {
    speaker
        .send(&ArpSpec::gratuitous(2, mac, ip).to_bytes())
        .unwrap()
}

/// The peer's entry for `ip` points at `mac` (reachable for long).
fn peer_knows(bed: &Bed, ip: std::net::Ipv4Addr, mac: [u8; 6]) {
    bed.peer
        .sysctl("net.ipv4.neigh.eth0.base_reachable_time_ms", "600000")
        .unwrap();
    bed.peer.set_neigh("eth0", ip, &mac, "reachable").unwrap();
}

fn set_owner(bed: &Bed, ip: std::net::Ipv4Addr, owner: &str) {
    set_owner_in(&bed.owners, ip, owner)
}

/// Rewrite the owner of `ip` in an ownership file (atomically, as a
/// ConfigMap update does).
fn set_owner_in(owners: &std::path::Path, ip: impl std::fmt::Display, owner: &str) {
    let text = std::fs::read_to_string(owners).unwrap();
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    while let Some(l) = lines.next() {
        out.push_str(l);
        out.push('\n');
        if l.trim_start() == format!("- ip: {ip}") {
            // Replace the owner line that follows (if any).
            if lines
                .peek()
                .is_some_and(|n| n.trim_start().starts_with("owner:"))
            {
                lines.next();
            }
            out.push_str(&format!("    owner: {owner}\n"));
        }
    }
    testbed::replace_file(owners, &out).unwrap();
}

const OTHER_MAC: [u8; 6] = [2, 0, 0, 0, 0, 0xbb];

#[test]
fn an_announcement_held_for_a_takeover_goes_out_once_the_ip_is_owned() {
    testbed::require_root();
    let bed = Bed::new("tkf").unwrap();
    let guard = bed.start(&[]).unwrap();
    let speaker = RawSocket::open(&bed.node, "eth0").unwrap();
    peer_knows(&bed, FOREIGN, OTHER_MAC);
    std::thread::sleep(Duration::from_millis(1100));
    // The announcer speaks first: the guard drops it (foreign here).
    assert!(!garp(&speaker, bed.node_mac, FOREIGN), "dropped at egress");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        bed.peer.cached_mac("eth0", &FOREIGN.to_string()).unwrap(),
        Some(OTHER_MAC)
    );
    // Then this node becomes the owner: the held frame goes out.
    set_owner(&bed, FOREIGN, NODE);
    let moved = testbed::wait_until(Duration::from_secs(3), || {
        bed.peer.cached_mac("eth0", &FOREIGN.to_string()).unwrap() == Some(bed.node_mac)
    });
    assert!(
        moved,
        "the held announcement was not re-sent:\n{}",
        guard.log_text()
    );
    guard.expect_log("held announcements re-sent", Duration::from_secs(2));
    assert_eq!(
        bed.packets(FOREIGN, "gratuitous", "guard", "passed")
            .unwrap(),
        1
    );
    assert!(bed.total("announce_deferred").unwrap() >= 1);
    assert!(testbed::wait_until(Duration::from_secs(2), || metric(
        &bed.node,
        "arp_guard_announce_total{outcome=\"replayed\"}"
    ) == 1.0));
    // The takeover was announced (by the re-send).
    let row = status_row(&bed.node, FOREIGN);
    assert_eq!(row["takeover"]["via"], "guard", "{row:#}");
    assert_eq!(row["takeover"]["silent"], false, "{row:#}");
}

#[test]
fn a_split_brain_speaker_stays_stopped_and_its_held_frames_expire() {
    testbed::require_root();
    let bed = Bed::new("tks").unwrap();
    let guard = bed
        .start(&["--announce-hold", "1s", "--split-brain-after", "2s"])
        .unwrap();
    let speaker = RawSocket::open(&bed.node, "eth0").unwrap();
    peer_knows(&bed, FOREIGN, OTHER_MAC);
    std::thread::sleep(Duration::from_millis(1100));
    for _ in 0..3 {
        assert!(!garp(&speaker, bed.node_mac, FOREIGN));
        std::thread::sleep(Duration::from_millis(100));
    }
    // Given up after the hold, split brain once --split-brain-after passed
    // without the IP becoming owned here.
    guard.expect_log(
        "split brain: a speaker on this node",
        Duration::from_secs(5),
    );
    assert_eq!(
        bed.peer.cached_mac("eth0", &FOREIGN.to_string()).unwrap(),
        Some(OTHER_MAC),
        "a split-brain speaker stays stopped"
    );
    // Three identical frames: one held, two duplicates (its copy renewed,
    // each judged): all three split brain, each once its own time is up
    // (the log line comes with the first; a slow machine judges the others
    // a turn of the loop later).
    let expired = || metric(&bed.node, "arp_guard_announce_total{outcome=\"expired\"}");
    let all = testbed::wait_for(Duration::from_secs(5), || (expired() >= 3.0).then_some(()));
    assert!(all.is_some(), "expired: {}", expired());
    assert_eq!(expired(), 3.0);
    assert_eq!(
        metric(&bed.node, "arp_guard_announce_total{outcome=\"duplicate\"}"),
        2.0
    );
    assert_eq!(
        metric(&bed.node, "arp_guard_announce_total{outcome=\"replayed\"}"),
        0.0
    );
    // A takeover after the window re-sends nothing.
    set_owner(&bed, FOREIGN, NODE);
    wait_state(&bed.node, FOREIGN, "owned");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        bed.packets(FOREIGN, "gratuitous", "guard", "passed")
            .unwrap(),
        0
    );
    assert_eq!(
        bed.peer.cached_mac("eth0", &FOREIGN.to_string()).unwrap(),
        Some(OTHER_MAC)
    );
}

/// The ownership feed later than the hold (MetalLB's status seconds after
/// its announcements): the held frame is not re-sent, and it is counted as
/// late, not as split brain; in monitor mode the same (the frame passed).
#[test]
fn a_takeover_after_the_hold_is_a_late_feed_not_split_brain() {
    testbed::require_root();
    for mode in ["enforce", "monitor"] {
        let bed = Bed::new(&format!("tkl{}", &mode[..1])).unwrap();
        let guard = bed
            .start(&[
                "--mode",
                mode,
                "--announce-hold",
                "1s",
                "--split-brain-after",
                "20s",
            ])
            .unwrap();
        let speaker = RawSocket::open(&bed.node, "eth0").unwrap();
        assert_eq!(garp(&speaker, bed.node_mac, FOREIGN), mode == "monitor");
        std::thread::sleep(Duration::from_millis(2500));
        set_owner(&bed, FOREIGN, NODE);
        wait_state(&bed.node, FOREIGN, "owned");
        let late = "arp_guard_announce_total{outcome=\"late\"}";
        assert!(
            testbed::wait_until(Duration::from_secs(3), || metric(&bed.node, late) == 1.0),
            "{mode}: late {}\n{}",
            metric(&bed.node, late),
            guard.log_text()
        );
        guard.expect_log("the ownership feed was late", Duration::from_secs(1));
        for outcome in ["expired", "replayed", "in_time"] {
            let series = format!("arp_guard_announce_total{{outcome=\"{outcome}\"}}");
            assert_eq!(metric(&bed.node, &series), 0.0, "{mode}: {outcome}");
        }
        let noted = metric(&bed.node, "arp_guard_announce_total{outcome=\"noted\"}");
        assert_eq!(noted, if mode == "monitor" { 1.0 } else { 0.0 }, "{mode}");
    }
}

#[test]
fn monitor_mode_holds_and_sends_nothing() {
    testbed::require_root();
    let bed = Bed::new("tkm0").unwrap();
    let _guard = bed.start(&["--mode", "monitor"]).unwrap();
    let speaker = RawSocket::open(&bed.node, "eth0").unwrap();
    assert!(
        garp(&speaker, bed.node_mac, FOREIGN),
        "monitor mode lets it out"
    );
    set_owner(&bed, FOREIGN, NODE);
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(bed.total("announce_deferred").unwrap(), 0);
    assert_eq!(
        bed.packets(FOREIGN, "gratuitous", "guard", "passed")
            .unwrap(),
        0
    );
    assert_eq!(
        bed.packets(FOREIGN, "gratuitous", "speaker", "would_drop")
            .unwrap(),
        1
    );
}

#[test]
fn a_takeover_without_an_announcement_is_silent() {
    testbed::require_root();
    let bed = Bed::new("tksi").unwrap();
    let guard = bed.start(&["--silent-takeover-after", "1s"]).unwrap();
    let speaker = RawSocket::open(&bed.node, "eth0").unwrap();
    // FOREIGN becomes owned and nobody announces it.
    set_owner(&bed, FOREIGN, NODE);
    let line = guard.expect_log("silent takeover", Duration::from_secs(5));
    assert!(line.contains(&FOREIGN.to_string()), "{line}");
    assert_eq!(metric(&bed.node, "arp_guard_silent_takeovers_total"), 1.0);
    // OWNED was owned from the start: no takeover, nothing silent.
    assert_eq!(metric(&bed.node, "arp_guard_takeovers_total"), 1.0);
    // The announcement comes late: the takeover is closed, marked.
    assert!(garp(&speaker, bed.node_mac, FOREIGN));
    guard.expect_log("announced after all", Duration::from_secs(2));
    // A takeover announced within the threshold is timed.
    set_owner(&bed, OWNED, "node-b");
    wait_state(&bed.node, OWNED, "foreign");
    set_owner(&bed, OWNED, NODE);
    wait_state(&bed.node, OWNED, "owned");
    assert_eq!(metric(&bed.node, "arp_guard_takeovers_total"), 2.0);
    std::thread::sleep(Duration::from_millis(200));
    assert!(garp(&speaker, bed.node_mac, OWNED));
    guard.expect_log("takeover announced", Duration::from_secs(2));
    // (The API's copy follows the log line.)
    assert!(testbed::wait_until(Duration::from_secs(2), || metric(
        &bed.node,
        "arp_guard_takeover_first_announcement_seconds_count"
    ) == 2.0));
    let row = status_row(&bed.node, OWNED);
    let ms = row["takeover"]["first_announcement_ms"].as_u64().unwrap();
    assert!((150..2000).contains(&ms), "{row:#}");
    assert_eq!(row["takeover"]["via"], "speaker");
    assert_eq!(metric(&bed.node, "arp_guard_silent_takeovers_total"), 1.0);
}

#[test]
fn without_cap_net_raw_the_guard_refuses_to_hold_what_it_cannot_resend() {
    testbed::require_root();
    let bed = Bed::new("tkcap").unwrap();
    let caps: Vec<String> = ["BPF", "PERFMON", "NET_ADMIN"].map(String::from).to_vec();
    let mut wrapper = Vec::new();
    if !testbed::kernel::bpf_memcg_accounting() {
        wrapper.extend(["prlimit", "--memlock=unlimited", "--"].map(str::to_owned));
    }
    wrapper.extend(testbed::deploy::wrapper(&caps, true));
    let args = bed.args(&[]);
    let run: Vec<&str> = std::iter::once("run")
        .chain(args.iter().map(String::as_str))
        .collect();
    let mut refused = Daemon::spawn_command(&bed.node, &wrapper, &run).unwrap();
    refused.wait_exit(Duration::from_secs(20)).unwrap();
    let log = refused.log_text();
    assert!(
        log.contains("CAP_NET_RAW") && log.contains("--announce-hold 0"),
        "{log}"
    );
    // With --announce-hold 0 it runs on those capabilities (and holds nothing).
    let _guard = bed
        .start_wrapped(&wrapper, &["--announce-hold", "0"])
        .unwrap();
    let speaker = RawSocket::open(&bed.node, "eth0").unwrap();
    assert!(!garp(&speaker, bed.node_mac, FOREIGN));
    assert_eq!(bed.total("announce_deferred").unwrap(), 0);
}

#[test]
fn an_ipv6_advertisement_held_for_a_takeover_goes_out_with_the_daemonsets_capabilities() {
    testbed::require_root();
    // Bed6 runs the daemon with exactly the DaemonSet's capabilities.
    let bed = Bed6::new("tk6").unwrap();
    let guard = bed.start(&[]).unwrap();
    let speaker = RawSocket::open(&bed.node, "eth0").unwrap();
    bed.peer_knows(FOREIGN6, OWNER_MAC).unwrap();
    let advert = nd_bytes(&guard_common::ndp_build::NdSpec::unsolicited(
        bed.node_mac,
        FOREIGN6.octets(),
    ));
    assert!(!speaker.send(&advert).unwrap(), "dropped: foreign here");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(bed.peer_entry(FOREIGN6).unwrap(), Some(OWNER_MAC));
    set_owner_in(&bed.owners, FOREIGN6, NODE);
    let moved = testbed::wait_until(Duration::from_secs(3), || {
        bed.peer_entry(FOREIGN6).unwrap() == Some(bed.node_mac)
    });
    assert!(
        moved,
        "the held advertisement was not re-sent:\n{}",
        guard.log_text()
    );
    assert_eq!(
        bed.packets(FOREIGN6, "na_unsolicited", "guard", "passed")
            .unwrap(),
        1
    );
}
