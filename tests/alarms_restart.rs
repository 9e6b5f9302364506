//! No false alarms through a restart and an upgrade (issue 42): the quiet
//! half of `alarms.rs` with the guards' lives in it. Ordinary takeovers of
//! the three announcers ([`testbed::alarm_rounds`]: one Service each,
//! back and forth) in enforce mode, the guards run as the DaemonSet runs
//! them (pins on a bpffs of their own, `--on-exit keep`), and while the
//! rounds go on:
//!
//! - a restart: node-b's guard is killed (SIGKILL, a crash or an OOM
//!   kill) and started again, taking over its pinned program;
//! - an upgrade: node-a's guard is asked to leave (SIGTERM) and leaves the
//!   guard attached, and the next daemon takes its pins over, as the
//!   DaemonSet rolls (the same build: no older one is at hand here).
//!
//! The daemons' `/metrics` are scraped every second (a daemon that is down
//! misses its scrapes, as in Prometheus), and the shipped PrometheusRule
//! is evaluated by promtool on those series, held on for 40 virtual
//! minutes after the rounds (the age of a stale client, if one were left,
//! going on ageing): no alert fires, and the fake API holds no Warning
//! Event.
//!
//! Not in the VM lane: lease and round timings assume a native CPU.

use std::{
    collections::BTreeMap,
    net::Ipv4Addr,
    sync::Mutex,
    time::{Duration, Instant},
};

use serde_json::Value;
use testbed::{
    alarm_rounds::{self, client_knows_node_a, none_fire, svc, Svc, GUARD_ARGS},
    bed::Bpffs,
    cluster_bed::ClusterBed,
    promtool::{self, Timeline},
    scrape::Scraper,
    takeover::Style,
    Daemon,
};

const STEP: Duration = Duration::from_secs(1);
/// After the rounds, every series is held this long (the longest window
/// plus the longest `for:`, with room).
const HOLD: Duration = Duration::from_secs(40 * 60);
const ROUNDS: usize = 6;
const SERVICES: [Svc; 3] = [
    svc("rcil", 161, Style::Cilium),
    svc("rkv", 162, Style::KubeVip),
    svc("rmlb", 163, Style::MetalLb),
];
/// The liveness gate out of any restart's reach (the pinned program
/// guards alone between two daemons: `lifecycle.rs`).
const GATE: [&str; 4] = [
    "--heartbeat-stale-after",
    "10m",
    "--heartbeat-dead-after",
    "20m",
];
/// When, after the rounds began, node-b's guard is restarted and node-a's
/// upgraded.
const RESTART_AT: Duration = Duration::from_secs(8);
const UPGRADE_AT: Duration = Duration::from_secs(20);

fn ips() -> Vec<Ipv4Addr> {
    SERVICES.iter().map(|s| s.ip).collect()
}

/// Node `i`'s guard, as the DaemonSet runs it, its pins in `pins`.
fn start(bed: &ClusterBed, i: usize, pins: &Bpffs) -> Daemon {
    let dir = pins.path().join("arp-guard").to_string_lossy().into_owned();
    let args: Vec<&str> = (["--mode", "enforce"].iter().chain(GUARD_ARGS).copied())
        .chain(["--pin-dir", &dir, "--on-exit", "keep"])
        .chain(GATE)
        .collect();
    bed.start_on(i, &args, Duration::from_secs(30)).unwrap()
}

/// Stop node `i`'s guard with `signal`, start the next; its log so far.
fn replace(bed: &ClusterBed, guards: &Mutex<Vec<Daemon>>, i: usize, signal: i32, pins: &Bpffs) {
    let mut old = guards.lock().unwrap().remove(i);
    old.stop(signal, Duration::from_secs(10)).unwrap();
    let next = start(bed, i, pins);
    let took_over = if testbed::kernel::has_tcx() {
        "took over the pinned attachment"
    } else {
        "replaced an arp-guard filter left behind by an earlier run"
    };
    assert!(next.log_text().contains(took_over), "{}", next.log_text());
    let mut g = guards.lock().unwrap();
    g.insert(i, next);
    // Both lives in the log.
    g.push(old);
}

#[test]
fn a_restart_and_an_upgrade_between_takeovers_raise_no_alarm() {
    testbed::require_root();
    let bed = ClusterBed::new("alr", &ips()).unwrap();
    let pins = [Bpffs::new("alr-a").unwrap(), Bpffs::new("alr-b").unwrap()];
    let services: Vec<&Svc> = SERVICES.iter().collect();
    let holders = alarm_rounds::prepare(&bed, &services);
    let guards = Mutex::new(vec![start(&bed, 0, &pins[0]), start(&bed, 1, &pins[1])]);
    client_knows_node_a(&bed, &ips());
    let targets: Vec<(&str, &testbed::Netns)> =
        bed.nodes.iter().map(|n| (n.name.as_str(), &n.ns)).collect();
    let scraper = Scraper::start(&targets, STEP).unwrap();
    let t0 = Instant::now();
    let lives = |_: &std::sync::atomic::AtomicBool| {
        std::thread::sleep(RESTART_AT.saturating_sub(t0.elapsed()));
        replace(&bed, &guards, 1, libc::SIGKILL, &pins[1]);
        std::thread::sleep(UPGRADE_AT.saturating_sub(t0.elapsed()));
        replace(&bed, &guards, 0, libc::SIGTERM, &pins[0]);
    };
    let rounds_end =
        alarm_rounds::drive(&bed, (&services, &ips(), ROUNDS), &holders, lives, || {
            // Past the last step's scrape.
            std::thread::sleep(STEP * 2);
            scraper.elapsed()
        });
    let samples = scraper.stop();
    eprintln!("rounds with a restart and an upgrade: {rounds_end:?}");
    let logs = || {
        (guards.lock().unwrap().iter())
            .map(|g| g.log_text())
            .collect::<Vec<_>>()
            .join("\n----\n")
    };
    let warnings: Vec<Value> = (bed.api.events().into_iter())
        .filter(|e| e["type"] == "Warning")
        .collect();
    assert!(
        warnings.is_empty(),
        "Warning Events: {warnings:#?}\n{}",
        logs()
    );
    let spec = promtool::shipped_rules().unwrap();
    let input = promtool::series(&samples, STEP);
    // The age of a stale client left at the end goes on ageing.
    let slopes: BTreeMap<String, f64> = (input.iter())
        .filter(|(k, v)| {
            k.starts_with("arp_guard_stale_client_oldest_seconds")
                && v.values().next_back().is_some_and(|x| *x > 0.0)
        })
        .map(|(k, _)| (k.clone(), STEP.as_secs_f64()))
        .collect();
    let until = rounds_end + HOLD;
    let t = Timeline {
        input: &input,
        slopes: &slopes,
        step: STEP,
        until,
    };
    let dir = promtool::workdir("alarms-restart");
    let expect = none_fire(&spec, until, &[]);
    if let Err(e) = promtool::run(&dir, &spec, &t, &expect, &[]) {
        panic!("alerts through a restart and an upgrade: {e:#}\n{}", logs());
    }
    let _ = std::fs::remove_dir_all(&dir);
}
