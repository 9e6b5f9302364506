//! Ownership from the Kubernetes API, end to end: the real daemon on two node
//! namespaces reads a fake API server that speaks the real list/watch
//! protocol, and a neighbour on the segment shows which node's kernel answer
//! gets through as Leases and ServiceL2Status objects change.

use std::{net::Ipv4Addr, time::Duration};

use testbed::{
    cluster_bed::{check, ClusterBed},
    fake_api::{objects, Fault, Resource},
    wait_for, wait_until, ArpSpec, RawSocket,
};

const LB: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 100);
const CHANGE: Duration = Duration::from_secs(8);

/// Node `i`'s `/status` row for `ip`.
fn status_row(bed: &ClusterBed, i: usize, ip: &str) -> serde_json::Value {
    let (_, body) = bed.nodes[i]
        .ns
        .enter(|| guard::testing::get("127.0.0.1:9477".parse().unwrap(), "/status"))
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let rows = v["ips"].as_array().cloned().unwrap_or_default();
    rows.into_iter()
        .find(|r| r["ip"] == ip)
        .unwrap_or_else(|| panic!("no {ip} in {v}"))
}

/// A two-node bed whose Service `web` (LB) is announced by node-a under a
/// Cilium lease of `lease_secs`.
fn web_held_by_node_a(name: &str, lease_secs: i32) -> ClusterBed {
    let bed = ClusterBed::new(name, &[LB]).unwrap();
    bed.cilium_service("web", &["198.51.100.100"], "node-a", lease_secs);
    bed
}

#[test]
fn cilium_lease_moves_and_the_guards_swap_verdicts() {
    testbed::require_root();
    let bed = ClusterBed::new("cil", &[LB]).unwrap();
    bed.cilium_service("web", &["198.51.100.100", "fd00::100"], "node-a", 60);
    // node-b first: it holds nothing yet, and the holder, node-a, has no
    // guard yet (no presence record), so its name matching no holder is
    // reported once, after its first look at the cluster; node-a's is not.
    // (Started the other way, whether node-b says it depends on which it
    // reads first, the Lease or node-a's presence record: a guarded holder
    // makes a typo unlikely, and it says nothing.)
    let args = ["--announcer", "cilium"];
    let sync = Duration::from_secs(20);
    let b = bed.start_on(1, &args, sync).unwrap();
    let warning = "matches none of the lease holders";
    b.expect_log(warning, Duration::from_secs(5));
    let guards = [bed.start_on(0, &args, sync).unwrap(), b];
    check(bed.wait_answer(LB, Some("node-a"), CHANGE));
    assert_eq!(guards[1].count_log(warning), 1, "once");
    assert_eq!(guards[0].count_log(warning), 0);
    // Only node-a answers: node-b's kernel reply is dropped (foreign).
    for _ in 0..3 {
        assert_eq!(bed.who_answers(LB).as_deref(), Some("node-a"));
    }
    // Dual stack: the Service's IPv6 address follows the same Lease (it is
    // guarded in Neighbor Discovery).
    for (i, want) in [(0, "owned"), (1, "foreign")] {
        let row = status_row(&bed, i, "fd00::100");
        assert_eq!(
            (&row["family"], &row["state"]),
            (&"ipv6".into(), &want.into()),
            "{row}"
        );
    }
    // The holder moves to node-b.
    bed.api.apply(
        Resource::Leases,
        objects::cilium_lease("web", "node-b", 60, "2026-11-30T10:00:05.000000Z"),
    );
    check(bed.wait_answer(LB, Some("node-b"), CHANGE));
    for g in &guards {
        g.expect_log("ownership changed", Duration::from_secs(5));
    }
    for _ in 0..3 {
        assert_eq!(bed.who_answers(LB).as_deref(), Some("node-b"));
    }
    // The Lease disappears (Service deleted and re-created later): no owner.
    bed.api.delete(
        Resource::Leases,
        "kube-system",
        "cilium-l2announce-default-web",
    );
    check(bed.wait_answer(LB, None, CHANGE));
}

#[test]
fn an_expired_lease_makes_the_ip_unknown() {
    testbed::require_root();
    let bed = ClusterBed::new("exp", &[LB]).unwrap();
    // Nobody renews this 4 s lease: 4 s after the guards saw it, it expires.
    bed.cilium_service("web", &["198.51.100.100"], "node-a", 4);
    let guards = bed.start(&["--announcer", "cilium"]).unwrap();
    assert_eq!(bed.who_answers(LB).as_deref(), Some("node-a"));
    // Expired: unknown on both nodes, so both kernels' replies are dropped...
    check(bed.wait_answer(LB, None, Duration::from_secs(10)));
    // ...while a speaker on node-b (unknown + speaker: pass) still gets through.
    let node_b = &bed.nodes[1];
    let speaker = RawSocket::open(&node_b.ns, "eth0").unwrap();
    let cap = RawSocket::open(&bed.peer, "eth0").unwrap();
    cap.drain();
    assert!(speaker
        .send(&ArpSpec::gratuitous(2, node_b.mac, LB).to_bytes())
        .unwrap());
    assert!(cap
        .wait_arp(Duration::from_secs(2), |c| c.spa == LB
            && c.sha == node_b.mac)
        .unwrap()
        .is_some());
    // Renewal brings it back: the guard judges by what it observes, not the holder's clock.
    bed.api.apply(
        Resource::Leases,
        objects::cilium_lease("web", "node-a", 60, "2026-11-30T09:00:00.000000Z"),
    );
    check(bed.wait_answer(LB, Some("node-a"), CHANGE));
    drop(guards);
}

#[test]
fn metallb_status_appears_moves_and_disappears() {
    testbed::require_root();
    let bed = ClusterBed::new("mlb", &[LB]).unwrap();
    bed.api.apply(
        Resource::Services,
        objects::service("default", "web", &["198.51.100.100"]),
    );
    let _guards = bed.start(&["--announcer", "metallb"]).unwrap();
    // No ServiceL2Status yet: nobody owns it, no kernel answer gets out.
    assert_eq!(bed.who_answers(LB), None);
    bed.api.apply(
        Resource::L2Statuses,
        objects::l2status("metallb-system", "l2-x1", "node-a", "default", "web"),
    );
    check(bed.wait_answer(LB, Some("node-a"), CHANGE));
    bed.api.apply(
        Resource::L2Statuses,
        objects::l2status("metallb-system", "l2-x1", "node-b", "default", "web"),
    );
    check(bed.wait_answer(LB, Some("node-b"), CHANGE));
    // A status in another namespace is not MetalLB's and changes nothing.
    bed.api.apply(
        Resource::L2Statuses,
        objects::l2status("elsewhere", "l2-y", "node-a", "default", "web"),
    );
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(bed.who_answers(LB).as_deref(), Some("node-b"));
    bed.api
        .delete(Resource::L2Statuses, "metallb-system", "l2-x1");
    check(bed.wait_answer(LB, None, CHANGE));
}

#[test]
fn losing_the_api_degrades_foreign_to_unknown_and_recovers() {
    testbed::require_root();
    let bed = web_held_by_node_a("down", 120);
    let status = bed.dir.path().join("status-b.json");
    let status_arg = status.to_str().unwrap();
    let sync = Duration::from_secs(20);
    let guards = [
        bed.start_on(0, &["--announcer", "cilium", "--stale-after", "3s"], sync)
            .unwrap(),
        bed.start_on(
            1,
            &[
                "--announcer",
                "cilium",
                "--stale-after",
                "3s",
                "--status-file",
                status_arg,
            ],
            sync,
        )
        .unwrap(),
    ];
    // The status file shows the feed's state as it changes.
    let feed_state = || -> Option<(bool, bool)> {
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&status).ok()?).ok()?;
        Some((
            v["feed"]["synced"].as_bool()?,
            v["feed"]["degraded"].as_bool()?,
        ))
    };
    assert!(wait_until(Duration::from_secs(5), || feed_state()
        == Some((true, false))));
    let node_b = &bed.nodes[1];
    let speaker = RawSocket::open(&node_b.ns, "eth0").unwrap();
    let garp = ArpSpec::gratuitous(2, node_b.mac, LB).to_bytes();
    // Foreign on node-b: its speaker is stopped.
    assert!(
        !speaker.send(&garp).unwrap(),
        "foreign: node-b's speaker frame is dropped"
    );
    bed.api.set_down(true);
    let stale = guards[1].wait_log("ownership feed stale", Duration::from_secs(15));
    assert!(stale.is_some(), "{}", guards[1].log_text());
    // Stale knowledge no longer blocks node-b's speaker...
    assert!(wait_for(Duration::from_secs(3), || speaker
        .send(&garp)
        .unwrap()
        .then_some(()))
    .is_some());
    // ...but its kernel still may not answer for an IP it does not hold (unknown + kernel).
    assert_eq!(bed.who_answers(LB).as_deref(), Some("node-a"));
    assert_eq!(
        feed_state(),
        Some((true, true)),
        "the status file says degraded"
    );
    bed.api.set_down(false);
    guards[1].expect_log("fresh again", Duration::from_secs(15));
    assert!(wait_until(Duration::from_secs(3), || feed_state()
        == Some((true, false))));
    assert!(
        wait_until(Duration::from_secs(3), || !speaker.send(&garp).unwrap()),
        "foreign again"
    );
}

#[test]
fn relists_after_410_and_cut_watches_and_service_changes() {
    testbed::require_root();
    let bed = ClusterBed::new("gone", &[LB, Ipv4Addr::new(198, 51, 100, 101)]).unwrap();
    bed.cilium_service("web", &["198.51.100.100"], "node-a", 120);
    // Presence off: its own lists would count below.
    let _guards = bed
        .start(&["--announcer", "cilium", "--presence-period", "0"])
        .unwrap();
    check(bed.wait_answer(LB, Some("node-a"), CHANGE));
    // The Lease is deleted while no watch delivers, the history compacted,
    // then every watch cut: resuming the watches gets 410 Gone, and only a
    // relist can show that the Lease is gone.
    let lists = bed.api.lists();
    bed.api.hold_watches();
    bed.api.delete(
        Resource::Leases,
        "kube-system",
        "cilium-l2announce-default-web",
    );
    bed.api.compact();
    bed.api.drop_watches();
    check(bed.wait_answer(LB, None, Duration::from_secs(15)));
    // The owner's relist silenced the LB IP; the other guard's may still be
    // under way on a loaded machine.
    assert!(
        wait_until(Duration::from_secs(30), || bed.api.lists() >= lists + 4),
        "both streams of both guards relisted ({} lists, from {lists})",
        bed.api.lists()
    );
    bed.api.apply(
        Resource::Leases,
        objects::cilium_lease("web", "node-b", 120, "2026-11-30T10:00:07.000000Z"),
    );
    check(bed.wait_answer(LB, Some("node-b"), CHANGE));
    // The IP moves to another Service (with its own Lease held by node-a).
    let lb2 = Ipv4Addr::new(198, 51, 100, 101);
    bed.api.apply(
        Resource::Leases,
        objects::cilium_lease("api", "node-a", 120, "2026-11-30T10:00:08.000000Z"),
    );
    bed.api.apply(
        Resource::Services,
        objects::service("default", "web", &["198.51.100.101"]),
    );
    bed.api.apply(
        Resource::Services,
        objects::service("default", "api", &["198.51.100.100"]),
    );
    check(bed.wait_answer(LB, Some("node-a"), CHANGE));
    check(bed.wait_answer(lb2, Some("node-b"), CHANGE));
    // Two Services share an IP and their owners disagree: nobody owns it.
    bed.api.apply(
        Resource::Services,
        objects::service("default", "web", &["198.51.100.100", "198.51.100.101"]),
    );
    check(bed.wait_answer(LB, None, CHANGE));
    // Deleted: the IP is web's alone again; re-created: shared again.
    bed.api.delete(Resource::Services, "default", "api");
    check(bed.wait_answer(LB, Some("node-b"), CHANGE));
    bed.api.apply(
        Resource::Services,
        objects::service("default", "api", &["198.51.100.100"]),
    );
    check(bed.wait_answer(LB, None, CHANGE));
}

#[test]
fn kube_vip_leases_per_service_annotated_and_global() {
    testbed::require_root();
    let lb2 = Ipv4Addr::new(198, 51, 100, 101);
    let bed = ClusterBed::new("kvip", &[LB, lb2]).unwrap();
    // Per-service election: Lease kubevip-<svc> in the Service's namespace...
    bed.api.apply(
        Resource::Services,
        objects::service("shop", "web", &["198.51.100.100"]),
    );
    bed.api.apply(
        Resource::Leases,
        objects::lease(
            "shop",
            "kubevip-web",
            "node-b",
            120,
            "2026-11-30T10:00:00.000000Z",
        ),
    );
    // ...or the one the kube-vip.io/leaseName annotation names (here ns/name).
    let mut api = objects::service("shop", "api", &["198.51.100.101"]);
    api["metadata"]["annotations"] = serde_json::json!({"kube-vip.io/leaseName": "infra/api-lock"});
    api["metadata"]["labels"] = serde_json::json!({"tier": "edge"});
    bed.api.apply(Resource::Services, api);
    bed.api.apply(
        Resource::Leases,
        objects::lease(
            "infra",
            "api-lock",
            "node-a",
            120,
            "2026-11-30T10:00:00.000000Z",
        ),
    );
    let guards = bed.start(&["--announcer", "kube-vip"]).unwrap();
    check(bed.wait_answer(LB, Some("node-b"), CHANGE));
    check(bed.wait_answer(lb2, Some("node-a"), CHANGE));
    drop(guards);
    // Global election: one Lease's holder announces every Service; and a label
    // selector keeps only the Services it matches (web's IP is then unknown).
    bed.api.apply(
        Resource::Leases,
        objects::lease(
            "kube-system",
            "plndr-svcs-lock",
            "node-b",
            120,
            "2026-11-30T10:00:01.000000Z",
        ),
    );
    let _guards = bed
        .start(&[
            "--announcer",
            "kube-vip",
            "--kube-vip-election",
            "global",
            "--service-selector",
            "tier=edge",
        ])
        .unwrap();
    check(bed.wait_answer(lb2, Some("node-b"), CHANGE));
    check(bed.wait_answer(LB, None, CHANGE));
}

/// The API goes silent (connections accepted, never answered) for longer
/// than a watch lasts, and changes happen meanwhile: the guard degrades,
/// stays up, and after the outage relists and enforces the new owner.
#[test]
fn api_silent_for_minutes_then_back() {
    testbed::require_root();
    let bed = web_held_by_node_a("long", 600);
    let guards = bed
        .start(&["--announcer", "cilium", "--stale-after", "3s"])
        .unwrap();
    check(bed.wait_answer(LB, Some("node-a"), CHANGE));
    let node_a = &bed.nodes[0];
    let drops_on_a = || testbed::daemon::dropped(&node_a.ns, "eth0", LB).unwrap();
    let dropped_before = drops_on_a();
    bed.api.set_blackhole(true);
    for g in &guards {
        g.expect_log("ownership feed stale", Duration::from_secs(20));
    }
    // Failover happens while the guards cannot see it.
    bed.api.apply(
        Resource::Leases,
        objects::cilium_lease("web", "node-b", 600, "2026-11-30T10:01:00.000000Z"),
    );
    // Longer than the watch timeout (55 s) and the client's read timeout (70 s).
    std::thread::sleep(Duration::from_secs(75));
    // Meanwhile each datapath keeps its last state within the rules: owned on
    // node-a, and on node-b foreign degraded to unknown (its kernel still
    // stopped). The owner's guard dropped nothing for the IP while blind...
    assert_eq!(
        drops_on_a(),
        dropped_before,
        "the owner's guard dropped nothing"
    );
    // ...and the neighbour learns node-a (polled: one resolution may take
    // longer than a try on a loaded machine).
    check(bed.wait_answer(LB, Some("node-a"), CHANGE));
    bed.api.set_blackhole(false);
    for g in &guards {
        g.expect_log("fresh again", Duration::from_secs(30));
    }
    check(bed.wait_answer(LB, Some("node-b"), CHANGE));
}

/// A pinned guard restarted while the API is silent keeps the ownership its
/// predecessor learned from the cluster: entries are only added until the
/// new feed has synced, so a foreign IP stays stopped meanwhile.
#[test]
fn pinned_restart_keeps_cluster_knowledge_until_synced() {
    testbed::require_root();
    let bed = ClusterBed::new("prest", &[LB]).unwrap();
    let fs = testbed::bed::Bpffs::new("prest").unwrap();
    let pins = fs.path().join("arp-guard");
    bed.cilium_service("web", &["198.51.100.100"], "node-a", 600);
    let args = ["--announcer", "cilium", "--pin-dir", pins.to_str().unwrap()];
    let mut guard = bed.start_on(1, &args, Duration::from_secs(20)).unwrap();
    let node_b = &bed.nodes[1];
    let speaker = RawSocket::open(&node_b.ns, "eth0").unwrap();
    let garp = ArpSpec::gratuitous(2, node_b.mac, LB).to_bytes();
    assert!(
        wait_until(CHANGE, || !speaker.send(&garp).unwrap()),
        "foreign on node-b"
    );
    bed.api.set_blackhole(true);
    guard.stop(libc::SIGKILL, Duration::from_secs(5)).unwrap();
    // Restarted without an API answer: no sync, so nothing is removed.
    let kc = bed.kubeconfig.to_str().unwrap();
    let mut a = vec![
        "-i",
        "eth0",
        "--node-name",
        "node-b",
        "--kubeconfig",
        kc,
        "--lb-ips-from",
        "kube-ipvs0",
    ];
    a.extend_from_slice(&args);
    let _guard = testbed::Daemon::start(&node_b.ns, &a).unwrap();
    for _ in 0..20 {
        assert!(
            !speaker.send(&garp).unwrap(),
            "the foreign entry from before the restart still stops the speaker"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    bed.api.set_blackhole(false);
    _guard.expect_log(
        "initial sync from the Kubernetes API done",
        Duration::from_secs(20),
    );
    assert!(
        !speaker.send(&garp).unwrap(),
        "and after the sync, still foreign"
    );
}

/// Renews `lease` (held by `holder`) every 500 ms, as a live holder does,
/// until dropped.
struct Renewer {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Renewer {
    fn start(api: &testbed::fake_api::FakeApi, holder: &'static str, duration: i32) -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let api = api.handle();
        let thread = std::thread::spawn(move || {
            let mut n = 0u32;
            while !flag.load(std::sync::atomic::Ordering::SeqCst) {
                n += 1;
                let renew = format!(
                    "2026-11-30T11:{:02}:{:02}.{:06}Z",
                    (n / 2) / 60 % 60,
                    (n / 2) % 60,
                    n % 1_000_000
                );
                api.apply(
                    Resource::Leases,
                    objects::cilium_lease("web", holder, duration, &renew),
                );
                std::thread::sleep(Duration::from_millis(500));
            }
        });
        Renewer {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Renewer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Whoever the neighbour learns for `ip`, checked every 300 ms for `how_long`.
fn always_answers(bed: &ClusterBed, ip: Ipv4Addr, want: &str, how_long: Duration) {
    let end = std::time::Instant::now() + how_long;
    while std::time::Instant::now() < end {
        assert_eq!(
            bed.who_answers(ip).as_deref(),
            Some(want),
            "the owner's answer must get through while the guard is blind"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// The guard going blind must never take permission away from the owner: a
/// Lease watch stuck half-way through a chunk (while GETs still work), the
/// API refusing the guard (403, 401, 500): node-a, whose Lease is renewed
/// all along, keeps answering; node-b's speaker passes once node-b is
/// degraded, its kernel does not. A confirmed move still takes effect.
#[test]
fn a_blind_guard_never_takes_the_owners_ip_away() {
    testbed::require_root();
    let bed = ClusterBed::new("blind", &[LB]).unwrap();
    bed.api.apply(
        Resource::Services,
        objects::service("default", "web", &["198.51.100.100"]),
    );
    let renewer = Renewer::start(&bed.api, "node-a", 3);
    // Presence off: its own requests would count below.
    let guards = bed
        .start(&["--announcer", "cilium", "--presence-period", "0"])
        .unwrap();
    check(bed.wait_answer(LB, Some("node-a"), CHANGE));

    // 1. The Lease watch is stuck: no renewal reaches the guards. Each
    //    seeming expiry is confirmed by a GET, which shows the renewal.
    let gets = bed.api.gets();
    bed.api.set_fault(Resource::Leases, Some(Fault::StuckWatch));
    always_answers(&bed, LB, "node-a", Duration::from_secs(10));
    assert!(bed.api.gets() > gets, "expiries were confirmed with GETs");
    for g in &guards {
        g.expect_log(
            "the Lease watch is stuck; rebuilding it",
            Duration::from_secs(5),
        );
    }
    bed.api.set_fault(Resource::Leases, None);

    // 2. The API refuses the guards' Lease requests (RBAC broken for them).
    bed.api
        .set_fault(Resource::Leases, Some(Fault::Status(403)));
    always_answers(&bed, LB, "node-a", Duration::from_secs(8));
    guards[0].expect_log(
        "cannot confirm the expiry of a Lease",
        Duration::from_secs(5),
    );

    // 3. Everything fails (500 for Services, 401 for Leases) past the
    //    staleness threshold: both guards degrade; node-a keeps its IP.
    bed.api
        .set_fault(Resource::Services, Some(Fault::Status(500)));
    bed.api
        .set_fault(Resource::Leases, Some(Fault::Status(401)));
    for g in &guards {
        g.expect_log("ownership feed stale", Duration::from_secs(30));
    }
    always_answers(&bed, LB, "node-a", Duration::from_secs(3));
    let node_b = &bed.nodes[1];
    let speaker = RawSocket::open(&node_b.ns, "eth0").unwrap();
    let garp = ArpSpec::gratuitous(2, node_b.mac, LB).to_bytes();
    assert!(
        speaker.send(&garp).unwrap(),
        "degraded node-b: foreign judged unknown, its speaker passes"
    );
    bed.api.set_fault(Resource::Services, None);
    bed.api.set_fault(Resource::Leases, None);
    for g in &guards {
        g.expect_log("fresh again", Duration::from_secs(20));
    }
    assert!(
        wait_until(CHANGE, || !speaker.send(&garp).unwrap()),
        "foreign again on node-b"
    );

    // 4. A confirmed new holder still moves the IP.
    drop(renewer);
    let _renewer = Renewer::start(&bed.api, "node-b", 3);
    check(bed.wait_answer(LB, Some("node-b"), CHANGE));
}

/// A stream that shows no progress at all (no event, no bookmark, no end of
/// watch) past its idle deadline is stuck: it is relisted, and that shows in
/// the log, the metrics and (with a short threshold) as degraded. An absurd
/// lease duration is clamped and logged once.
#[test]
fn a_silent_stream_is_rebuilt_and_shows() {
    testbed::require_root();
    let bed = web_held_by_node_a("idle", 2147483647);
    // node-a with a short threshold; node-b with the default one, taken
    // from the Lease durations in use: the absurd one is capped at 60 s.
    let sync = Duration::from_secs(20);
    let guards = [
        bed.start_on(
            0,
            &[
                "--announcer",
                "cilium",
                "--kube-watch-timeout",
                "2s",
                "--stale-after",
                "5s",
            ],
            sync,
        )
        .unwrap(),
        bed.start_on(1, &["--announcer", "cilium"], sync).unwrap(),
    ];
    let status_b = |path: &'static str| {
        bed.nodes[1]
            .ns
            .enter(move || guard::testing::get("127.0.0.1:9477".parse().unwrap(), path))
            .unwrap()
    };
    let v: serde_json::Value = serde_json::from_str(&status_b("/status").1).unwrap();
    assert_eq!(v["feed"]["threshold_seconds"], 60, "{v}");
    assert_eq!(
        guards[1].count_log("absurd leaseDurationSeconds"),
        1,
        "{}",
        guards[1].log_text()
    );
    let guard = &guards[0];
    check(bed.wait_answer(LB, Some("node-a"), CHANGE));
    bed.api
        .set_fault(Resource::Services, Some(Fault::StuckWatch));
    // Idle deadline: 2 s watch timeout + 10 s margin.
    let line = guard.expect_log("Kubernetes watch stream stuck", Duration::from_secs(20));
    assert!(line.contains("services"), "{line}");
    // blind for 12 s > 5 s: degraded
    guard.expect_log("ownership feed stale", Duration::from_secs(5));
    let (code, m) = bed.nodes[0]
        .ns
        .enter(|| guard::testing::get("127.0.0.1:9477".parse().unwrap(), "/metrics"))
        .unwrap();
    assert_eq!(code, 200);
    assert!(
        m.lines()
            .any(|l| l
                .starts_with("arp_guard_feed_rebuilds_total{stream=\"services\",reason=\"idle\"}")),
        "{m}"
    );
    assert!(
        m.contains("arp_guard_feed_stream_healthy{stream=\"leases\"} 1"),
        "{m}"
    );
    // Owned all along.
    assert_eq!(bed.who_answers(LB).as_deref(), Some("node-a"));
    bed.api.set_fault(Resource::Services, None);
    guard.expect_log("fresh again", Duration::from_secs(20));
    // The absurd duration, seen in every relist, was logged once.
    assert_eq!(
        guard.count_log("absurd leaseDurationSeconds"),
        1,
        "{}",
        guard.log_text()
    );
}
