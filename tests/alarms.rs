//! No false alarms, one story per cause (issue 33).
//!
//! Ordinary takeovers, the way each announcer performs them, in monitor and
//! in enforce mode: two nodes with strictARP on (arp_ignore=1,
//! arp_announce=2), every LB IP on kube-ipvs0 and on its owner's eth0 (the
//! owner answers ARP; the active census asks), a client sending to every
//! IP. Per announcer two Services, ten takeovers each, back and forth: the
//! old owner stops (its address goes), the new one takes the address and
//! announces, and the feed says so
//!
//! - Cilium: the Lease, then one gratuitous reply;
//! - kube-vip: its Lease, then a gratuitous request and reply;
//! - MetalLB: a gratuitous request and reply, then every 1.1 s for 5 s (as
//!   MetalLB does), and its ServiceL2Status 0-8 s after the first.
//!
//! Leases are renewed every 2 s (15 s duration). The daemons' `/metrics`
//! are scraped every second, and the shipped PrometheusRule is evaluated
//! by promtool on those very series (held on for 40 virtual minutes after
//! the rounds, past every rule's window and `for:`): no alert fires (in
//! monitor mode but ArpGuardNotEnforcing, which says that monitor mode does
//! not guard), and the fake API holds no Warning Event. Then the positive
//! control, so that the test can fail: a speaker on node-b announces an IP
//! node-a owns (split brain), and promtool sees ArpGuardSpeakerSplitBrain
//! for node-b.
//!
//! The bed and its rounds are `testbed::alarm_rounds`'s (shared with
//! `alarms_restart.rs`, the same quiet through a restart and an upgrade).
//!
//! Not in the VM lane: lease and round timings assume a native CPU.

use std::{
    collections::BTreeMap,
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use serde_json::Value;
use testbed::{
    alarm_rounds::{self, announce, client_knows_node_a, none_fire, svc, Svc, GUARD_ARGS},
    cluster_bed::ClusterBed,
    fake_api::{objects, Resource},
    promtool::{self, Expect},
    scrape::Scraper,
    takeover::Style,
    RawSocket,
};

/// The scrape interval, and the step of promtool's timeline.
const STEP: Duration = Duration::from_secs(1);
/// After the rounds, every series is held this long (the longest window
/// plus the longest `for:`, with room).
const HOLD: Duration = Duration::from_secs(40 * 60);
/// Takeovers per Service (two Services per announcer: 20 per announcer).
const ROUNDS: usize = 10;

const SERVICES: [Svc; 6] = [
    svc("cil0", 101, Style::Cilium),
    svc("cil1", 102, Style::Cilium),
    svc("kv0", 103, Style::KubeVip),
    svc("kv1", 104, Style::KubeVip),
    svc("mlb0", 105, Style::MetalLb),
    svc("mlb1", 106, Style::MetalLb),
];
/// The positive control's Service (MetalLB's status: no Lease to renew),
/// owned by node-a throughout.
const CONTROL: Svc = svc("ctl", 110, Style::MetalLb);

fn all_ips() -> Vec<Ipv4Addr> {
    SERVICES.iter().chain([&CONTROL]).map(|s| s.ip).collect()
}

/// What one mode's run leaves for the checks.
struct Run {
    mode: &'static str,
    samples: Vec<testbed::scrape::Sample>,
    rounds_end: Duration,
    control_end: Duration,
    warnings: Vec<Value>,
    logs: String,
}

/// The rounds and the control in one mode's bed, scraped throughout.
fn run(tag: &str, mode: &'static str) -> Run {
    let bed = ClusterBed::new(tag, &all_ips()).unwrap();
    let services: Vec<&Svc> = SERVICES.iter().chain([&CONTROL]).collect();
    let holders = alarm_rounds::prepare(&bed, &services);
    let args: Vec<&str> = ["--mode", mode].iter().chain(GUARD_ARGS).copied().collect();
    let guards = bed.start(&args).unwrap();
    client_knows_node_a(&bed, &all_ips());
    let targets: Vec<(&str, &testbed::Netns)> =
        bed.nodes.iter().map(|n| (n.name.as_str(), &n.ns)).collect();
    let scraper = Scraper::start(&targets, STEP).unwrap();
    let rounds: Vec<&Svc> = SERVICES.iter().collect();
    let plan = (&rounds[..], &all_ips()[..], ROUNDS);
    let (rounds_end, control_end, warnings) = alarm_rounds::drive(
        &bed,
        plan,
        &holders,
        |_| {},
        || {
            // Past the last step's scrape.
            std::thread::sleep(STEP * 2);
            let rounds_end = scraper.elapsed();
            let warnings: Vec<Value> = (bed.api.events().into_iter())
                .filter(|e| e["type"] == "Warning")
                .collect();
            let control_end = control(&bed, &scraper);
            (rounds_end, control_end, warnings)
        },
    );
    let samples = scraper.stop();
    let logs = format!(
        "node-a:\n{}\nnode-b:\n{}",
        guards[0].log_text(),
        guards[1].log_text()
    );
    assert!(
        control_end.is_some(),
        "{mode}: the control never expired on node-b\n{logs}"
    );
    let control_end = control_end.unwrap_or_default();
    Run {
        mode,
        samples,
        rounds_end,
        control_end,
        warnings,
        logs,
    }
}

/// The control: node-b's speaker announces what node-a owns, for 5 s;
/// when node-b has counted it split brain (None: never), and scraped.
fn control(bed: &ClusterBed, scraper: &Scraper) -> Option<Duration> {
    let speaker = RawSocket::open(&bed.nodes[1].ns, "eth0").unwrap();
    for _ in 0..5 {
        announce(&speaker, bed.nodes[1].mac, CONTROL.ip, &[1, 2]);
        std::thread::sleep(Duration::from_secs(1));
    }
    let expired = "arp_guard_announce_total{outcome=\"expired\"}";
    let ns_b = &bed.nodes[1].ns;
    let seen = testbed::wait_until(Duration::from_secs(30), || {
        testbed::counter(ns_b, expired) > 0.0
    });
    std::thread::sleep(STEP * 3);
    seen.then(|| scraper.elapsed())
}

/// A series' value in the last scrape before `until`, summed over nodes.
fn last_sum(r: &Run, series: &str, until: Duration) -> f64 {
    ["node-a", "node-b"]
        .iter()
        .filter_map(|node| {
            let s = r
                .samples
                .iter()
                .rfind(|s| s.instance == *node && s.at <= until)?;
            s.text
                .lines()
                .find_map(|l| l.strip_prefix(series)?.trim().parse::<f64>().ok())
        })
        .sum()
}

fn check(r: &Run) {
    // The late feed was exercised: MetalLB's first frames outlived the hold
    // (5 s) before its status came (up to 8 s), and were counted late.
    let outcome = |o: &str| {
        let series = format!("arp_guard_announce_total{{outcome=\"{o}\"}}");
        last_sum(r, &series, r.rounds_end)
    };
    let (late, expired) = (outcome("late"), outcome("expired"));
    let in_time = outcome(if r.mode == "monitor" {
        "in_time"
    } else {
        "replayed"
    });
    eprintln!(
        "{}: late {late}, in time {in_time}, expired {expired}",
        r.mode
    );
    assert!(late > 0.0 && in_time > 0.0 && expired == 0.0, "{}", r.mode);
    assert!(
        r.warnings.is_empty(),
        "{}: Warning Events in ordinary takeovers: {:#?}\n{}",
        r.mode,
        r.warnings,
        r.logs
    );
    let spec = promtool::shipped_rules().unwrap();
    // The rounds: what was scraped until they ended, then held.
    let quiet: Vec<_> = (r.samples.iter())
        .filter(|s| s.at <= r.rounds_end)
        .cloned()
        .collect();
    let input = promtool::series(&quiet, STEP);
    let until = r.rounds_end + HOLD;
    // Monitor mode does not guard, and one alert says so after 30 minutes.
    let but: &[&str] = if r.mode == "monitor" {
        &["ArpGuardNotEnforcing"]
    } else {
        &[]
    };
    let dir = promtool::workdir(&format!("alarms-{}", r.mode));
    let expect = none_fire(&spec, until, but);
    if let Err(e) = promtool::test(&dir.join("rounds"), &spec, &input, STEP, until, &expect) {
        panic!(
            "{}: alerts in ordinary takeovers: {e:#}\n{}",
            r.mode, r.logs
        );
    }
    // The control: the split brain is seen, on node-b.
    let input = promtool::series(&r.samples, STEP);
    let labels: BTreeMap<String, String> = [("instance", "node-b"), ("severity", "warning")]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    // The reference names this test as the one that fires it.
    let fired_by = (guard::reference::FIRED_BY.iter())
        .find(|(a, _, _)| *a == "ArpGuardSpeakerSplitBrain")
        .map(|(_, f, t)| (*f, *t));
    assert_eq!(
        fired_by,
        Some((
            "tests/alarms.rs",
            "ordinary_takeovers_raise_no_alarm_and_a_split_brain_does"
        ))
    );
    let summary = promtool::summary(&spec, "ArpGuardSpeakerSplitBrain", &labels).unwrap();
    let at = r.control_end + Duration::from_secs(60);
    // A split brain on a node that holds nothing is no NODE_NAME mismatch:
    // every holder has its guard (presence), so that page stays quiet.
    let later = at + Duration::from_secs(180);
    let expect = [
        Expect {
            at,
            alert: "ArpGuardSpeakerSplitBrain".into(),
            exp: vec![(labels, BTreeMap::from([("summary".to_owned(), summary)]))],
        },
        Expect {
            at: later,
            alert: "ArpGuardDroppingOwnedIP".into(),
            exp: vec![],
        },
    ];
    if let Err(e) = promtool::test(&dir.join("control"), &spec, &input, STEP, later, &expect) {
        panic!("{}: the split brain was not alerted: {e:#}", r.mode);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn ordinary_takeovers_raise_no_alarm_and_a_split_brain_does() {
    testbed::require_root();
    let t0 = Instant::now();
    let runs: Vec<Run> = std::thread::scope(|s| {
        let monitor = s.spawn(|| run("alm-m", "monitor"));
        let enforce = s.spawn(|| run("alm-e", "enforce"));
        [monitor, enforce]
            .map(|h| h.join().unwrap())
            .into_iter()
            .collect()
    });
    eprintln!("rounds and controls: {:?}", t0.elapsed());
    for r in &runs {
        check(r);
    }
    eprintln!("with promtool: {:?}", t0.elapsed());
}

/// The seed incident in monitor mode: kube-proxy in IPVS mode with
/// strictARP off, so every node's kernel answers ARP for every LB IP on its
/// kube-ipvs0 (the ClusterBed's nodes, arp_ignore=0). Three nodes, two
/// Services (owned by node-a and node-b), a client that asks for both every
/// second, the active census asking every second, Events allowed every
/// second: each Service gets exactly one Warning, from its owner, naming
/// the other nodes, the cause and the fix, and nothing else (the probe
/// conflicts the answering kernels cause are not told again; no repeat
/// within the hour).
#[test]
fn nodes_whose_kernels_answer_make_one_warning_per_service() {
    testbed::require_root();
    let ips = [
        Ipv4Addr::new(198, 51, 100, 120),
        Ipv4Addr::new(198, 51, 100, 121),
    ];
    let bed = ClusterBed::with_nodes("alm-s", &ips, 3).unwrap();
    bed.cilium_service("web0", &[&ips[0].to_string()], "node-a", 3600);
    bed.cilium_service("web1", &[&ips[1].to_string()], "node-b", 3600);
    for n in &bed.nodes {
        bed.api.apply(Resource::Nodes, objects::node(&n.name));
    }
    let args: Vec<&str> = testbed::cluster_bed::CILIUM_PRESENCE_ARGS
        .iter()
        .copied()
        .chain([
            "--mode",
            "monitor",
            "--probe-interval",
            "1s",
            "--probe-in-monitor-mode",
            "--kube-events-interval",
            "1s",
        ])
        .collect();
    let guards = bed.start(&args).unwrap();
    let warnings = |bed: &ClusterBed| -> Vec<Value> {
        (bed.api.events().into_iter())
            .filter(|e| e["type"] == "Warning")
            .collect()
    };
    let t0 = Instant::now();
    let mut told_at = None;
    while t0.elapsed() < Duration::from_secs(60) {
        for ip in ips {
            bed.peer.flush_neigh("eth0").unwrap();
            bed.peer.poke(&ip.to_string()).unwrap();
        }
        std::thread::sleep(Duration::from_millis(500));
        let w = warnings(&bed);
        let both = ["web0", "web1"]
            .iter()
            .all(|s| w.iter().any(|e| e["regarding"]["name"] == *s));
        if both && told_at.is_none() {
            told_at = Some(t0.elapsed());
        }
        // Once both are told, as long again: nothing more may come.
        if told_at.is_some_and(|t| t0.elapsed() > t * 2 + Duration::from_secs(5)) {
            break;
        }
    }
    let logs = || {
        (guards.iter().zip(&bed.nodes))
            .map(|(g, n)| format!("{}:\n{}", n.name, g.log_text()))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let w = warnings(&bed);
    eprintln!("told after {told_at:?}; {} Warning(s)", w.len());
    assert!(told_at.is_some(), "not told: {w:#?}\n{}", logs());
    assert_eq!(w.len(), 2, "one Warning per Service: {w:#?}\n{}", logs());
    // What was not told again: the askers saw two MACs answer their
    // requests (node-c asks about both IPs), and every node saw its own
    // kernel answer.
    let conflicts = testbed::counter(
        &bed.nodes[2].ns,
        "arp_guard_probe_ips{verdict=\"conflict\"}",
    );
    assert_eq!(conflicts, 2.0, "{}", logs());
    for g in &guards {
        assert!(g
            .log_text()
            .contains("kernel answers ARP for an LB IP another node owns"));
    }
    for (svc, owner, others) in [
        ("web0", "node-a", "node-b, node-c"),
        ("web1", "node-b", "node-a, node-c"),
    ] {
        let e = (w.iter())
            .find(|e| e["regarding"]["name"] == svc)
            .unwrap_or_else(|| panic!("no Warning on {svc}: {w:#?}"));
        assert_eq!(e["reason"], "NodesAnswerARP", "{e:#}");
        assert_eq!(e["reportingInstance"], owner, "{e:#}");
        assert!(e["series"].is_null(), "repeated within the hour: {e:#}");
        let note = e["note"].as_str().unwrap();
        let ip = if svc == "web0" { ips[0] } else { ips[1] };
        assert!(
            note.starts_with(&format!(
                "{others} also answer ARP for {ip}, which {owner} owns"
            )),
            "{note}"
        );
        for words in [
            "strictARP: true",
            "arp_ignore=0",
            "arp_ignore=1",
            "enforce mode",
        ] {
            assert!(note.contains(words), "{words}: {note}");
        }
    }
}
