//! Every shipped alert fires where it should (issue 42): each test here
//! builds the scenario one alert (or a few) exists for, on a ClusterBed
//! with real guards, scrapes their `/metrics` every second for a few
//! seconds, and has promtool evaluate the shipped PrometheusRule on those
//! very series ([`testbed::alerting`]): the alert fires, for exactly the
//! instances expected, with its labels and summary. The reference
//! (`docs/reference/alerts.md`) names the test that fires each rule
//! (`guard::reference::FIRED_BY`), and each test checks that it is the one
//! named. The dashboard's queries are checked on the same series
//! ([`testbed::dashboard`]).
//!
//! - a node name the announcer does not use (kube-vip names the leader by
//!   its host name): the guard stops its own owner, ArpGuardDroppingOwnedIP
//!   on that node only (the other node holds nothing and stays quiet);
//! - kernels that answer for LB IPs they do not own (strictARP off), in
//!   monitor mode: ArpGuardPersistentDrops, ArpGuardProbeConflict,
//!   ArpGuardNotEnforcing;
//! - owners that do not answer, or answer from an interface their guard
//!   does not guard, and a Node without a guard: ArpGuardSilentOwner,
//!   ArpGuardOwnerWrongInterface, ArpGuardNodeUncovered.
//!
//! The other alerts: `alerts_fire_node.rs`, `alerts_fire_feed.rs`,
//! `alarms.rs` (ArpGuardSpeakerSplitBrain).

use std::{
    net::Ipv4Addr,
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use testbed::{
    alerting::{end_of, fired_after, firing, Firing, Proof, STEP},
    cluster_bed::{ClusterBed, CILIUM_PRESENCE_ARGS, PRESENCE_NS},
    deploy::daemonset_wrapper,
    fake_api::{objects, Resource},
    promtool::{self, counter_like, Expect},
    scrape::{Sample, Scraper},
    ArpSpec, Daemon, RawSocket,
};

/// Scrape every guard of `bed` while `scenario` runs; the samples.
fn scraped(bed: &ClusterBed, scenario: impl FnOnce()) -> Vec<Sample> {
    let targets: Vec<(&str, &testbed::Netns)> =
        bed.nodes.iter().map(|n| (n.name.as_str(), &n.ns)).collect();
    let scraper = Scraper::start(&targets, STEP).unwrap();
    scenario();
    scraper.stop()
}

/// Check `expect` on `samples`; on failure, panic with the guards' logs.
fn prove(samples: &[Sample], expect: Vec<Expect>, logs: impl Fn() -> String) {
    let spec = promtool::shipped_rules().unwrap();
    let proof = Proof {
        file: file!(),
        fired_by: guard::reference::FIRED_BY,
        grows: &counter_like,
        ages: &[],
        expect,
    };
    if let Err(e) = proof.check(&spec, samples) {
        panic!("{e:#}\n{}", logs());
    }
}

fn logs_of(bed: &ClusterBed, guards: &[Daemon]) -> String {
    (bed.nodes.iter().zip(guards))
        .map(|(n, g)| format!("{}:\n{}", n.name, g.log_text()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Clears a flag however the scope ends (a panic too).
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// kube-vip knows node-a by its host name (`node-a.lab`, its Lease's
/// holderIdentity) while the guard there runs as `node-a` (NODE_NAME, the
/// Node's name). node-a is the leader: the VIP on its uplink, and its
/// gratuitous ARP every second. The guard on node-a judges the VIP foreign
/// (held by `node-a.lab`), stops every announcement of it, and node-a
/// never becomes its owner: ArpGuardDroppingOwnedIP on node-a. node-b's
/// name matches no holder either (it holds nothing), but its announcer is
/// quiet: nothing there.
#[test]
fn a_node_name_the_announcer_does_not_use_pages() {
    testbed::require_root();
    let vip = Ipv4Addr::new(198, 51, 100, 140);
    let bed = ClusterBed::new("afn", &[vip]).unwrap();
    bed.api.apply(
        Resource::Services,
        objects::service("default", "web", &[&vip.to_string()]),
    );
    let renew = objects::renew_now();
    let lease = objects::lease("default", "kubevip-web", "node-a.lab", 3600, &renew);
    bed.api.apply(Resource::Leases, lease);
    for n in &bed.nodes {
        // strictARP on: the kernel answers only for addresses on eth0.
        n.ns.sysctl("net.ipv4.conf.all.arp_ignore", "1").unwrap();
        n.ns.sysctl("net.ipv4.conf.all.arp_announce", "2").unwrap();
    }
    let leader = &bed.nodes[0];
    (leader
        .ns
        .ip(&["addr", "add", &format!("{vip}/32"), "dev", "eth0"]))
    .unwrap();
    let args = ["--announcer", "kube-vip", "--split-brain-after", "3s"];
    let guards = bed.start(&args).unwrap();
    let speaker = RawSocket::open(&leader.ns, "eth0").unwrap();
    let stop = AtomicBool::new(false);
    let expired = "arp_guard_announce_total{outcome=\"expired\"}";
    let samples = scraped(&bed, || {
        std::thread::scope(|s| {
            let _stop = StopOnDrop(&stop);
            s.spawn(|| {
                while !stop.load(Ordering::SeqCst) {
                    for op in [1, 2] {
                        let garp = ArpSpec::gratuitous(op, leader.mac, vip).to_bytes();
                        speaker.send(&garp).unwrap();
                    }
                    std::thread::sleep(Duration::from_secs(1));
                }
            });
            let seen = testbed::wait_until(Duration::from_secs(30), || {
                testbed::counter(&leader.ns, expired) > 0.0
            });
            assert!(seen, "never expired on node-a\n{}", logs_of(&bed, &guards));
            std::thread::sleep(STEP * 4);
        });
    });
    for n in &bed.nodes {
        let unmatched = testbed::counter(&n.ns, "arp_guard_node_name_unmatched");
        assert_eq!(unmatched, 1.0, "{}", n.name);
    }
    guards[0].expect_log("matches none of the lease holders", Duration::from_secs(1));
    assert_eq!(testbed::counter(&bed.nodes[1].ns, expired), 0.0);
    let spec = promtool::shipped_rules().unwrap();
    let alert = "ArpGuardDroppingOwnedIP";
    let at = fired_after(&spec, alert, end_of(&samples));
    let expect = vec![firing(&spec, alert, at, &[Firing::on("node-a")]).unwrap()];
    prove(&samples, expect, || logs_of(&bed, &guards));
}

/// What the kernels of the seed incident fire once its scrapes end at
/// `end`: every node that does not own an IP answers for it; node-c asks
/// about both IPs, node-a and node-b about the other's, and each hears two
/// MACs; monitor mode everywhere.
fn kernels_alerts(ips: &[Ipv4Addr; 2], end: Duration) -> Vec<Expect> {
    let spec = promtool::shipped_rules().unwrap();
    let at = |alert: &str| fired_after(&spec, alert, end);
    let (web0, web1) = (ips[0].to_string(), ips[1].to_string());
    let answering = [
        ("node-b", &web0),
        ("node-c", &web0),
        ("node-a", &web1),
        ("node-c", &web1),
    ]
    .map(|(node, ip)| {
        Firing::new(
            &[("instance", node), ("lb_ip", ip), ("origin", "kernel")],
            None,
        )
    });
    let asking = [("node-a", 1.0), ("node-b", 1.0), ("node-c", 2.0)]
        .map(|(node, n)| Firing::new(&[("instance", node)], Some(n)));
    let monitor = ["node-a", "node-b", "node-c"].map(|node| {
        Firing::new(
            &[
                ("instance", node),
                ("job", "arp-guard"),
                ("mode", "monitor"),
            ],
            None,
        )
    });
    [
        ("ArpGuardPersistentDrops", &answering[..]),
        ("ArpGuardProbeConflict", &asking[..]),
        ("ArpGuardNotEnforcing", &monitor[..]),
    ]
    .into_iter()
    .map(|(alert, each)| firing(&spec, alert, at(alert), each).unwrap())
    .collect()
}

/// The seed incident in monitor mode: kube-proxy in IPVS mode with
/// strictARP off, every node's kernel answers ARP for every LB IP on its
/// kube-ipvs0. Three nodes, two Services (owned by node-a and node-b), a
/// client that asks for both twice a second, the active census asking every
/// second: every node that does not own an IP keeps answering for it
/// (ArpGuardPersistentDrops, per node, IP and origin), every asker hears two
/// MACs answer (ArpGuardProbeConflict), and monitor mode says it does not
/// guard (ArpGuardNotEnforcing).
#[test]
fn kernels_that_keep_answering_page() {
    testbed::require_root();
    let ips = [
        Ipv4Addr::new(198, 51, 100, 141),
        Ipv4Addr::new(198, 51, 100, 142),
    ];
    let bed = ClusterBed::with_nodes("afk", &ips, 3).unwrap();
    bed.cilium_service("web0", &[&ips[0].to_string()], "node-a", 3600);
    bed.cilium_service("web1", &[&ips[1].to_string()], "node-b", 3600);
    for n in &bed.nodes {
        bed.api.apply(Resource::Nodes, objects::node(&n.name));
    }
    let args: Vec<&str> = (CILIUM_PRESENCE_ARGS.iter().copied())
        .chain(["--mode", "monitor", "--probe-interval", "1s"])
        .chain(["--probe-in-monitor-mode", "--kube-events-interval", "1s"])
        .collect();
    let guards = bed.start(&args).unwrap();
    let samples = scraped(&bed, || {
        let t0 = std::time::Instant::now();
        while t0.elapsed() < Duration::from_secs(15) {
            bed.peer.flush_neigh("eth0").unwrap();
            for ip in ips {
                bed.peer.poke(&ip.to_string()).unwrap();
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    });
    let expect = kernels_alerts(&ips, end_of(&samples));
    prove(&samples, expect, || logs_of(&bed, &guards));
}

/// A presence record for node-a as its guard would publish it, except
/// that the MAC of its uplink is on `eth1`, an interface it does not guard
/// (a second NIC), and its guard Pod Ready for good. node-a runs no guard
/// here: the record stands for one.
fn record_on_the_wrong_interface(bed: &ClusterBed) {
    let mac = testbed::netns::fmt_mac(&bed.nodes[0].mac);
    let record = serde_json::json!({"node": "node-a", "mode": "enforce", "version": "0",
        "health": "enforcing", "interfaces": [{"name": "eth0", "mac": "02:00:5e:00:53:0a"}],
        "other": [{"name": "eth1", "mac": mac}]});
    bed.api.apply(
        Resource::Leases,
        serde_json::json!({
            "metadata": {"name": "arp-guard-node-a", "namespace": PRESENCE_NS,
                "labels": {"app.kubernetes.io/component": "arp-guard-presence"},
                "annotations": {"arp-guard.io/presence": record.to_string()}},
            "spec": {"holderIdentity": "node-a", "renewTime": "2026-11-30T10:00:00.000000Z"},
        }),
    );
    bed.kubelet.pin("node-a", true);
}

/// The active census on node-b (asking every second), about two IPs
/// node-a owns: one node-a answers from a MAC its record puts on an
/// unguarded interface (ArpGuardOwnerWrongInterface), one node-a does not
/// hold, so nobody answers (ArpGuardSilentOwner). node-c is a Node with no
/// guard at all (ArpGuardNodeUncovered, once node-b has read the Nodes:
/// asked for by `/cluster`).
#[test]
fn silent_and_misplaced_owners_page() {
    testbed::require_root();
    let (misplaced, silent) = (
        Ipv4Addr::new(198, 51, 100, 143),
        Ipv4Addr::new(198, 51, 100, 144),
    );
    let bed = ClusterBed::new("afo", &[misplaced, silent]).unwrap();
    bed.cilium_service("web0", &[&misplaced.to_string()], "node-a", 3600);
    bed.cilium_service("web1", &[&silent.to_string()], "node-a", 3600);
    for n in ["node-a", "node-b", "node-c"] {
        bed.api.apply(Resource::Nodes, objects::node(n));
    }
    (bed.nodes[0].ns)
        .ip(&["addr", "del", &format!("{silent}/32"), "dev", "kube-ipvs0"])
        .unwrap();
    record_on_the_wrong_interface(&bed);
    let args: Vec<&str> = (CILIUM_PRESENCE_ARGS.iter().copied())
        .chain(["--probe-interval", "1s", "--probe-silent-after", "2"])
        .collect();
    let b =
        (bed.start_on_wrapped(1, &daemonset_wrapper(), &args, Duration::from_secs(20))).unwrap();
    let node_b = &bed.nodes[1];
    let probes = |verdict: &str| {
        let series = format!("arp_guard_probe_ips{{verdict=\"{verdict}\"}}");
        testbed::counter(&node_b.ns, &series)
    };
    let scraper = Scraper::start(&[("node-b", &node_b.ns)], STEP).unwrap();
    let mut cluster = serde_json::Value::Null;
    let uncovered = "arp_guard_presence_nodes{state=\"uncovered\"}";
    let seen = testbed::wait_until(Duration::from_secs(30), || {
        let (_, body) = (node_b.ns)
            .enter(|| Ok(testbed::http_get("127.0.0.1:9477", "/cluster")))
            .unwrap();
        cluster = serde_json::from_str(&body).unwrap_or_default();
        testbed::counter(&node_b.ns, uncovered) == 1.0
            && probes("silent_owner") == 1.0
            && probes("wrong_interface") == 1.0
    });
    assert!(seen, "{cluster:#}\n{}", b.log_text());
    assert_eq!(cluster["uncovered"], serde_json::json!(["node-c"]));
    std::thread::sleep(STEP * 4);
    let samples = scraper.stop();
    let spec = promtool::shipped_rules().unwrap();
    let end = end_of(&samples);
    let fires = |alert: &str, who: Firing| {
        firing(&spec, alert, fired_after(&spec, alert, end), &[who]).unwrap()
    };
    let node_b = || Firing::new(&[("instance", "node-b")], Some(1.0));
    let expect = vec![
        fires("ArpGuardSilentOwner", node_b()),
        fires("ArpGuardOwnerWrongInterface", node_b()),
        // Cluster-wide: the lowest count of any guard.
        fires("ArpGuardNodeUncovered", Firing::new(&[], Some(1.0))),
    ];
    prove(&samples, expect, || format!("node-b:\n{}", b.log_text()));
}
