//! The responder census: the observe-only ingress program on the guarded
//! uplink records who claims each LB IP; the daemon turns it into
//! responders, conflicts, metrics, events and `arp-guard responders`.
//!
//! The node of the test bed is the observer. Claims arrive from the peer's
//! side of the segment as real frames: gratuitous ARP from two speakers (two
//! sender MACs), a rogue reply for an IP the node owns, a flood of forged
//! MACs.

#[path = "fixture_responder.rs"]
mod fixture_responder;

use std::{
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use serde_json::Value;
use testbed::{
    bed::{Bed, FOREIGN, NODE_IP, OWNED, UNKNOWN},
    guard_binary, wait_for, ArpSpec, EventTail, Netns, RawSocket,
};

const SPEAKER_A: [u8; 6] = [0x02, 0, 0x5e, 0, 0x53, 0xa1];
const SPEAKER_B: [u8; 6] = [0x02, 0, 0x5e, 0, 0x53, 0xb2];
const ROGUE: [u8; 6] = [0x02, 0, 0x5e, 0, 0x53, 0x66];

fn api(ns: &Netns, path: &str) -> (u16, String) {
    let path = path.to_owned();
    ns.enter(move || Ok(testbed::http_get("127.0.0.1:9477", &path)))
        .expect("entering the namespace")
}

fn responders(ns: &Netns) -> Value {
    let (code, body) = api(ns, "/responders");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// `arp-guard responders [IP] -o json` in the node: (exit code, document).
fn responders_cli(ns: &Netns, ip: Option<Ipv4Addr>) -> (i32, Value) {
    let mut args = vec![
        guard_binary().to_string_lossy().into_owned(),
        "responders".into(),
    ];
    if let Some(ip) = ip {
        args.push(ip.to_string());
    }
    args.extend(["-o".into(), "json".into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = ns.exec_output(&args).unwrap();
    let doc = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "responders -o json: {e}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap_or(-1), doc)
}

fn gratuitous(from: &RawSocket, mac: [u8; 6], ip: Ipv4Addr) {
    assert!(from
        .send(&ArpSpec::gratuitous(1, mac, ip).to_bytes())
        .unwrap());
}

/// The census of `ip` once `ok` holds for it (the daemon reads every
/// second; a conflict shows once it has lasted 3 s).
fn census_of(ns: &Netns, ip: impl std::fmt::Display, ok: impl Fn(&Value) -> bool) -> Value {
    wait_for(Duration::from_secs(12), || {
        let doc = responders(ns);
        let e = doc["ips"][ip.to_string()].clone();
        ok(&e).then_some(e)
    })
    .unwrap_or_else(|| panic!("census of {ip}: {:#}", responders(ns)))
}

fn metric(ns: &Netns, series: &str) -> Option<f64> {
    let (_, text) = api(ns, "/metrics");
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

#[test]
fn two_speakers_claiming_one_ip_are_a_conflict_on_a_third_node() {
    testbed::require_root();
    let bed = Bed::new("cen2").unwrap();
    // The node owns neither IP: it only watches the segment.
    let guard = bed.start(&["--mode", "monitor"]).unwrap();
    let wire = RawSocket::open(&bed.peer, "eth0").unwrap();
    let events = EventTail::start(&bed.node).unwrap();

    // Speaker A announces FOREIGN; speaker B takes it while A goes on.
    gratuitous(&wire, SPEAKER_A, FOREIGN);
    std::thread::sleep(Duration::from_millis(100));
    gratuitous(&wire, SPEAKER_B, FOREIGN);
    std::thread::sleep(Duration::from_millis(100));
    gratuitous(&wire, SPEAKER_A, FOREIGN);
    // One claimant alone on another IP is no conflict.
    gratuitous(&wire, SPEAKER_A, UNKNOWN);

    let e = census_of(&bed.node, FOREIGN, |e| e["conflict"] == "contested");
    assert_eq!(e["active"], 2, "{e:#}");
    let macs: Vec<&str> = e["responders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["mac"].as_str().unwrap())
        .collect();
    // Most recent first: A claimed last.
    assert_eq!(macs, ["02:00:5e:00:53:a1", "02:00:5e:00:53:b2"]);
    assert_eq!(e["responders"][0]["claims"], 2);
    assert_eq!(e["responders"][0]["kinds"][0], "gratuitous");
    assert_eq!(e["responders"][0]["interface"], "eth0");
    let one = census_of(&bed.node, UNKNOWN, |e| e["active"] == 1);
    assert!(one.get("conflict").is_none(), "{one:#}");

    // Metrics: the number of responders per IP, and conflicts by reason.
    let responders_series = format!("arp_guard_responders{{lb_ip=\"{FOREIGN}\",family=\"ipv4\"}}");
    assert_eq!(metric(&bed.node, &responders_series), Some(2.0));
    assert_eq!(
        metric(
            &bed.node,
            &format!("arp_guard_responders{{lb_ip=\"{UNKNOWN}\",family=\"ipv4\"}}")
        ),
        Some(1.0)
    );
    assert_eq!(
        metric(
            &bed.node,
            "arp_guard_responder_conflicts{reason=\"contested\"}"
        ),
        Some(1.0)
    );
    assert!(
        metric(
            &bed.node,
            "arp_guard_census_frames_total{outcome=\"claims\"}"
        )
        .unwrap()
            >= 4.0
    );

    // The CLI: the table, and exit 1 for a conflict; 0 for the clean IP.
    let (code, doc) = responders_cli(&bed.node, Some(FOREIGN));
    assert_eq!(code, 1, "{doc:#}");
    assert_eq!(doc["ips"][FOREIGN.to_string()]["conflict"], "contested");
    let (code, doc) = responders_cli(&bed.node, Some(UNKNOWN));
    assert_eq!(code, 0, "{doc:#}");
    let out = bed
        .node
        .exec_output(&[guard_binary().to_str().unwrap(), "responders"])
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{table}");
    assert!(table.contains("CONFLICT:contested"), "{table}");
    eprintln!("{table}");

    // The status has a conflicts section; the event stream and the log say it once.
    let (_, status) = api(&bed.node, "/status");
    let status: Value = serde_json::from_str(&status).unwrap();
    assert_eq!(
        status["conflicts"][0]["ip"],
        FOREIGN.to_string(),
        "{status:#}"
    );
    assert_eq!(status["conflicts"][0]["reason"], "contested");
    let ev = events.wait_line("responder_conflict", Duration::from_secs(5));
    assert!(
        ev.contains(&FOREIGN.to_string()) && ev.contains("02:00:5e:00:53:b2"),
        "{ev}"
    );
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        guard.count_log("responder conflict:"),
        1,
        "{}",
        guard.log_text()
    );
    // Observe-only: in monitor mode nothing was dropped, and nothing is
    // counted as judged on egress for these frames.
    assert!(guard.log_text().contains("census attached to ingress"));
}

#[test]
fn a_rogue_mac_claiming_the_owners_ip_is_raised_on_the_owner() {
    testbed::require_root();
    let bed = Bed::new("cenr").unwrap();
    // A claim of an owned IP is reported once it outlasts a late feed
    // (--split-brain-after; 3 s here).
    let guard = bed.start(&["--split-brain-after", "3s"]).unwrap();
    let wire = RawSocket::open(&bed.peer, "eth0").unwrap();
    // Claims in the first 2 s after the node became the owner are taken for
    // the previous owner's last words: the rogue comes later.
    std::thread::sleep(Duration::from_secs(3));
    // "OWNED is at ROGUE", sent to the node as a reply.
    let reply = ArpSpec::reply(ROGUE, OWNED, bed.node_mac, NODE_IP).to_bytes();
    assert!(wire.send(&reply).unwrap());
    let e = census_of(&bed.node, OWNED, |e| !e["conflict"].is_null());
    assert_eq!(e["conflict"], "claimed_elsewhere", "{e:#}");
    assert_eq!(e["responders"][0]["mac"], "02:00:5e:00:53:66");
    assert_eq!(e["responders"][0]["kinds"][0], "reply");
    assert_eq!(
        metric(
            &bed.node,
            "arp_guard_responder_conflicts{reason=\"claimed_elsewhere\"}"
        ),
        Some(1.0)
    );
    let line = guard.expect_log("responder conflict:", Duration::from_secs(5));
    assert!(
        line.contains("claimed_elsewhere") && line.contains(&OWNED.to_string()),
        "{line}"
    );
    // The owner's own answers are untouched by the census: the peer still
    // learns OWNED -> the node.
    assert_eq!(bed.peer_learns(&[OWNED]).unwrap(), [Some(bed.node_mac)]);
}

#[test]
fn ipv6_advertisements_are_claims_with_their_family() {
    use guard_common::ndp_build::NdSpec;
    use testbed::{
        bed6::{Bed6, OWNED6},
        nd_bytes,
    };
    testbed::require_root();
    let bed = Bed6::new("cen6").unwrap();
    let _guard = bed.start(&["--split-brain-after", "3s"]).unwrap();
    let wire = RawSocket::open(&bed.peer, "eth0").unwrap();
    std::thread::sleep(Duration::from_secs(3));
    // A rogue host tells the segment "OWNED6 is at ROGUE".
    let na = nd_bytes(&NdSpec::unsolicited(ROGUE, OWNED6.octets()));
    assert!(wire.send(&na).unwrap());
    let e = census_of(&bed.node, OWNED6, |e| !e["conflict"].is_null());
    assert_eq!(e["conflict"], "claimed_elsewhere", "{e:#}");
    assert_eq!(e["responders"][0]["mac"], "02:00:5e:00:53:66");
    assert_eq!(e["responders"][0]["kinds"][0], "na_unsolicited");
    let series = format!("arp_guard_responders{{lb_ip=\"{OWNED6}\",family=\"ipv6\"}}");
    assert_eq!(metric(&bed.node, &series), Some(1.0));
    assert!(responders(&bed.node)["totals"]["ndp"].as_u64().unwrap() >= 1);
}

#[test]
fn one_responder_and_a_clean_failover_are_no_conflict() {
    testbed::require_root();
    let bed = Bed::new("cen1").unwrap();
    let guard = bed.start(&["--census-window", "6s"]).unwrap();
    let wire = RawSocket::open(&bed.peer, "eth0").unwrap();
    for _ in 0..3 {
        gratuitous(&wire, SPEAKER_A, FOREIGN);
        std::thread::sleep(Duration::from_millis(100));
    }
    let e = census_of(&bed.node, FOREIGN, |e| e["responders"][0]["claims"] == 3);
    assert_eq!(e["active"], 1);
    assert!(e.get("conflict").is_none(), "{e:#}");
    // A failover: A falls silent, B begins after: a move, not a conflict.
    std::thread::sleep(Duration::from_millis(300));
    gratuitous(&wire, SPEAKER_B, FOREIGN);
    let e = census_of(&bed.node, FOREIGN, |e| e["active"] == 2);
    assert!(e.get("conflict").is_none(), "{e:#}");
    let (code, _) = responders_cli(&bed.node, None);
    assert_eq!(code, 0);
    // After the window only B is current.
    let e = census_of(&bed.node, FOREIGN, |e| e["active"] == 1);
    assert_eq!(e["responders"][0]["mac"], "02:00:5e:00:53:b2");
    assert_eq!(e["responders"][1]["active"], false);
    assert_eq!(
        metric(
            &bed.node,
            "arp_guard_responder_conflicts{reason=\"contested\"}"
        ),
        Some(0.0)
    );
    assert_eq!(
        guard.count_log("responder conflict"),
        0,
        "{}",
        guard.log_text()
    );
}

#[test]
fn a_flood_of_forged_macs_is_bounded_and_the_owner_still_answers() {
    testbed::require_root();
    let bed = Bed::new("cenf").unwrap();
    let guard = bed.start(&[]).unwrap();
    let wire = RawSocket::open(&bed.peer, "eth0").unwrap();
    let rss_before = guard.rss_kib();
    let capacity = guard_common::MAX_RESPONDERS as usize;
    let n = 3 * capacity;
    let t = Instant::now();
    for i in 0..n as u32 {
        let b = i.to_be_bytes();
        let mac = [0x02, 0x66, b[0], b[1], b[2], b[3]];
        let _ = wire.send(&ArpSpec::gratuitous(1, mac, FOREIGN).to_bytes());
    }
    eprintln!("sent {n} forged claims in {:?}", t.elapsed());
    // The table holds at most its capacity; the newest claims are kept.
    // The veth may drop some of the burst on a loaded machine: enough when
    // more claims arrived than the table holds.
    let doc = wait_for(Duration::from_secs(15), || {
        let d = responders(&bed.node);
        let claims = d["totals"]["claims"].as_u64().unwrap_or(0) as usize;
        (claims > capacity && !d["ips"][FOREIGN.to_string()]["conflict"].is_null()).then_some(d)
    })
    .unwrap_or_else(|| panic!("{:#}", responders(&bed.node)["totals"]));
    let entries = doc["entries"].as_u64().unwrap() as usize;
    assert!(entries <= capacity, "{entries} entries");
    assert!(entries > capacity / 2, "LRU keeps a full table: {entries}");
    let e = &doc["ips"][FOREIGN.to_string()];
    assert_eq!(
        e["responders"].as_array().unwrap().len(),
        16,
        "listed bounded"
    );
    assert_eq!(e["conflict"], "contested", "{e:#}");
    // What the API answers and the daemon holds stay small.
    let (_, body) = api(&bed.node, "/responders");
    assert!(body.len() < 64 * 1024, "{} bytes", body.len());
    let (_, metrics) = api(&bed.node, "/metrics");
    let series = metrics
        .lines()
        .filter(|l| l.starts_with("arp_guard_responders{"))
        .count();
    assert!(series <= 6, "one series per LB IP at most: {series}");
    let grown = guard.rss_kib().saturating_sub(rss_before);
    assert!(grown < 32 * 1024, "RSS grew {grown} KiB");
    // The guard itself is untouched: the owner's IP is still answered.
    assert_eq!(bed.peer_learns(&[OWNED]).unwrap(), [Some(bed.node_mac)]);
}

/// The census attaches as the guard does: a TCX link where the kernel has
/// TCX (Linux 6.6), else a netlink clsact filter in arp-guard's ingress
/// slot (the VM lane's 5.10 and 6.1); `status` says which.
#[test]
fn the_census_attaches_as_the_guard_does() {
    testbed::require_root();
    let bed = Bed::new("cen-how").unwrap();
    let guard = bed.start(&[]).unwrap();
    let how = if testbed::kernel::has_tcx() {
        "tcx"
    } else {
        "netlink-clsact"
    };
    let line = guard.expect_log("census attached to ingress", Duration::from_secs(5));
    assert!(line.contains(how), "{line}");
    let out = bed
        .node
        .exec(&[guard_binary().to_str().unwrap(), "status"])
        .unwrap();
    assert!(out.contains(&format!("census {how}")), "{out}");
    let wire = RawSocket::open(&bed.peer, "eth0").unwrap();
    gratuitous(&wire, SPEAKER_A, FOREIGN);
    census_of(&bed.node, FOREIGN, |e| e["active"] == 1);
    assert_eq!(
        bed.peer_learns(&[OWNED, FOREIGN]).unwrap(),
        [Some(bed.node_mac), None],
        "the guard enforces beside the census"
    );
}

#[test]
fn without_the_census_the_guard_runs_and_says_so() {
    testbed::require_root();
    let bed = Bed::new("cen0").unwrap();
    let guard = bed.start(&["--no-census"]).unwrap();
    let (code, body) = api(&bed.node, "/responders");
    assert_eq!(code, 404, "{body}");
    assert!(body.contains("census is off"), "{body}");
    let (code, body) = api(&bed.node, "/clients");
    assert_eq!(code, 404, "{body}");
    assert!(body.contains("census is off"), "{body}");
    let out = bed
        .node
        .exec(&[guard_binary().to_str().unwrap(), "status"])
        .unwrap();
    assert!(out.contains("responder census: off"), "{out}");
    assert!(!guard.log_text().contains("census attached"));
    // The guard works as ever: the neighbour learns the owned IP, not the foreign one.
    assert_eq!(
        bed.peer_learns(&[OWNED, FOREIGN]).unwrap(),
        [Some(bed.node_mac), None]
    );
}

#[test]
fn the_census_runs_with_the_daemonsets_privileges() {
    testbed::require_root();
    let bed = Bed::new("cenp").unwrap();
    let guard = bed
        .start_wrapped(&testbed::deploy::daemonset_wrapper(), &[])
        .unwrap();
    guard.expect_log("census attached to ingress", Duration::from_secs(3));
    let wire = RawSocket::open(&bed.peer, "eth0").unwrap();
    gratuitous(&wire, SPEAKER_A, FOREIGN);
    let e = census_of(&bed.node, FOREIGN, |e| e["active"] == 1);
    assert_eq!(e["responders"][0]["mac"], "02:00:5e:00:53:a1");
}

/// The census is first in the ingress chain and observes only: a datapath
/// responder attached after it (as Cilium's would be when it comes later)
/// still gets every request and answers, and its own replies leave as ever.
#[test]
fn a_program_after_the_census_still_sees_every_frame() {
    testbed::require_root();
    let bed = Bed::new("cenc").unwrap();
    let guard = bed.start(&[]).unwrap();
    guard.expect_log("census attached to ingress", Duration::from_secs(3));
    const RESPONDER_MAC: [u8; 6] = [0x02, 0, 0x5e, 0, 0x53, 0xaa];
    let _responder =
        fixture_responder::attach(&bed.node, "eth0", vec![OWNED], RESPONDER_MAC, false);
    bed.peer.flush_neigh("eth0").unwrap();
    bed.peer.poke(&OWNED.to_string()).unwrap();
    let learned = wait_for(Duration::from_secs(3), || {
        bed.peer.cached_mac("eth0", &OWNED.to_string()).unwrap()
    });
    assert_eq!(
        learned,
        Some(RESPONDER_MAC),
        "the responder after the census answered"
    );
}
