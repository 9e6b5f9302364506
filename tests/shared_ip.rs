//! Services that share one LB IP, elected separately (issue 45): Cilium
//! and kube-vip hold one Lease per Service, MetalLB one ServiceL2Status per
//! Service, and when their records name different nodes, each of those
//! nodes announces the IP. Against the fake API and real guards on three
//! nodes:
//!
//! - Cilium Leases `default/web` -> node-a and `default/web2` -> node-b on
//!   198.51.100.100: one Warning `SplitElection` on each Service, naming
//!   both and their holders, posted by one node only (the same one for
//!   both), not repeated within the hour; `arp_guard_split_election_ips`
//!   on every guard, ArpGuardSplitElection fires (promtool on the real
//!   series); `arp-guard status` and `explain` name it; then the Leases
//!   agree: a Normal `SplitElectionResolved` on each Service;
//! - kube-vip per-Service Leases and MetalLB statuses: the same Event;
//! - `--settle-shared-ips` (all Services `externalTrafficPolicy: Cluster`):
//!   both nodes' speakers keep announcing, the client's cache stays on the
//!   node kept; without the flag, today's behaviour (the IP unknown, both
//!   speakers pass, the cache follows the last one); never with a `Local`
//!   Service.

use std::{net::Ipv4Addr, time::Duration};

use serde_json::Value;
use testbed::{
    alarm_rounds::announce,
    alerting::{prove_one, Firing, STEP},
    cluster_bed::{check, ClusterBed, CILIUM_PRESENCE_ARGS},
    fake_api::{objects, Resource},
    scrape::Scraper,
    Daemon, RawSocket,
};

const IP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 100);

/// Events repeat after 1 s in these tests (a series would grow), except
/// where a reason sets its own floor (SplitElection: an hour).
const FAST: &[&str] = &["--kube-events-interval", "1s"];

fn bed(tag: &str) -> ClusterBed {
    ClusterBed::with_nodes(tag, &[IP], 3).unwrap()
}

fn start(bed: &ClusterBed, args: &[&str]) -> Vec<Daemon> {
    let mut a = args.to_vec();
    a.extend_from_slice(FAST);
    bed.start(&a).unwrap()
}

/// The Events with `reason`, by the Service they are on.
fn events(bed: &ClusterBed, reason: &str) -> Vec<Value> {
    (bed.api.events().into_iter())
        .filter(|e| e["reason"] == reason)
        .collect()
}

fn logs(bed: &ClusterBed, guards: &[Daemon]) -> String {
    (bed.nodes.iter().zip(guards))
        .map(|(n, g)| format!("{}:\n{}", n.name, g.log_text()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Wait for one `reason` Event on each of `services`; them.
fn on_each(bed: &ClusterBed, guards: &[Daemon], reason: &str, services: &[&str]) -> Vec<Value> {
    let found = testbed::wait_for(Duration::from_secs(20), || {
        let ev = events(bed, reason);
        let on = |s: &&str| ev.iter().any(|e| e["regarding"]["name"] == *s);
        services.iter().all(on).then_some(ev)
    });
    found.unwrap_or_else(|| {
        panic!(
            "no {reason} on each of {services:?}: {:#?}\n{}",
            bed.api.events(),
            logs(bed, guards)
        )
    })
}

/// The Warning on each Service: its type, the other Service and both
/// holders named, one reporting node for all.
fn told_once_each(ev: &[Value], services: &[&str], holders: &[&str]) {
    assert_eq!(ev.len(), services.len(), "one Event per Service: {ev:#?}");
    let posters: std::collections::BTreeSet<&str> = (ev.iter())
        .filter_map(|e| e["reportingInstance"].as_str())
        .collect();
    assert_eq!(posters.len(), 1, "posted by one node: {ev:#?}");
    for e in ev {
        assert_eq!(e["type"], "Warning", "{e:#}");
        let note = e["note"].as_str().unwrap_or_default();
        for s in services.iter().chain(holders) {
            assert!(note.contains(s), "{s} not in {note}");
        }
        assert!(note.contains("Fix:"), "{note}");
    }
}

#[test]
fn a_split_election_is_told_once_on_each_service_and_pages() {
    testbed::require_root();
    let bed = bed("shc");
    bed.cilium_service("web", &[&IP.to_string()], "node-a", 3600);
    bed.cilium_service("web2", &[&IP.to_string()], "node-b", 3600);
    let guards = start(&bed, CILIUM_PRESENCE_ARGS);
    let targets: Vec<(&str, &testbed::Netns)> =
        bed.nodes.iter().map(|n| (n.name.as_str(), &n.ns)).collect();
    let scraper = Scraper::start(&targets, STEP).unwrap();
    on_each(&bed, &guards, "SplitElection", &["web", "web2"]);
    // Posted once: a few more rounds of the 5 s check add nothing.
    std::thread::sleep(Duration::from_secs(11));
    let ev = events(&bed, "SplitElection");
    told_once_each(&ev, &["default/web", "default/web2"], &["node-a", "node-b"]);
    assert!(ev[0]["note"]
        .as_str()
        .unwrap()
        .contains("cilium-l2announce-default-web2"));
    // Every guard counts it; the status and explain name it.
    for n in &bed.nodes {
        let series = "arp_guard_split_election_ips{settled=\"false\"}";
        assert_eq!(testbed::counter(&n.ns, series), 1.0, "{}", n.name);
    }
    let c = &bed.nodes[2].ns;
    let bin = testbed::guard_binary();
    let out = c.exec_output(&[bin.to_str().unwrap(), "status"]).unwrap();
    let status = String::from_utf8_lossy(&out.stdout);
    assert!(
        status.contains("SPLIT ELECTIONS") && status.contains("default/web2=node-b"),
        "{status}"
    );
    let out = (c.exec_output(&[bin.to_str().unwrap(), "explain", &IP.to_string()])).unwrap();
    let explain = String::from_utf8_lossy(&out.stdout);
    assert!(
        explain.contains("SPLIT ELECTION") && explain.contains("--settle-shared-ips is off"),
        "{explain}"
    );
    let samples = scraper.stop();

    // The Leases agree again: resolved, on each Service.
    bed.api.apply(
        Resource::Leases,
        objects::cilium_lease("web2", "node-a", 3600, "2026-11-30T10:00:05.000000Z"),
    );
    let ok = on_each(&bed, &guards, "SplitElectionResolved", &["web", "web2"]);
    assert!(ok.iter().all(|e| e["type"] == "Normal"), "{ok:#?}");
    for n in &bed.nodes {
        let series = "arp_guard_split_election_ips{settled=\"false\"}";
        assert!(testbed::wait_until(
            Duration::from_secs(5),
            || testbed::counter(&n.ns, series) == 0.0
        ));
    }

    // The alert, on the series the guards exported while it lasted.
    let everyone = Firing::new(&[], Some(1.0));
    let fired = prove_one(
        file!(),
        guard::reference::FIRED_BY,
        &samples,
        "ArpGuardSplitElection",
        &[everyone],
    );
    if let Err(e) = fired {
        panic!("{e:#}\n{}", logs(&bed, &guards));
    }
}

#[test]
fn kube_vip_per_service_leases_and_metallb_statuses_split_alike() {
    testbed::require_root();
    let bed = bed("shk");
    for s in ["web", "web2"] {
        bed.api.apply(
            Resource::Services,
            objects::service("default", s, &[&IP.to_string()]),
        );
    }
    let renew = "2026-11-30T10:00:00.000000Z";
    bed.api.apply(
        Resource::Leases,
        objects::lease("default", "kubevip-web", "node-a", 3600, renew),
    );
    bed.api.apply(
        Resource::Leases,
        objects::lease("default", "kubevip-web2", "node-c", 3600, renew),
    );
    bed.api.apply(
        Resource::L2Statuses,
        objects::l2status("metallb-system", "l2-1", "node-b", "default", "web"),
    );
    bed.api.apply(
        Resource::L2Statuses,
        objects::l2status("metallb-system", "l2-2", "node-c", "default", "web2"),
    );
    {
        let guards = start(&bed, &["--announcer", "kube-vip"]);
        let ev = on_each(&bed, &guards, "SplitElection", &["web", "web2"]);
        told_once_each(&ev, &["default/web", "default/web2"], &["node-a", "node-c"]);
        assert!(
            ev[0]["note"].as_str().unwrap().contains("svc_election"),
            "{ev:#?}"
        );
    }
    // MetalLB's statuses, read by guards started afresh: their Events are
    // those naming the statuses.
    let guards = start(&bed, &["--announcer", "metallb"]);
    let mlb = |ev: Vec<Value>| -> Vec<Value> {
        (ev.into_iter())
            .filter(|e| {
                e["note"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("ServiceL2Status")
            })
            .collect()
    };
    testbed::wait_for(Duration::from_secs(20), || {
        let ev = mlb(events(&bed, "SplitElection"));
        (ev.len() >= 2).then_some(ev)
    })
    .unwrap_or_else(|| panic!("{:#?}\n{}", bed.api.events(), logs(&bed, &guards)));
    std::thread::sleep(Duration::from_secs(6));
    let ev = mlb(events(&bed, "SplitElection"));
    told_once_each(&ev, &["default/web", "default/web2"], &["node-b", "node-c"]);
}

/// Cilium Leases web -> node-a, web2 -> node-b, both Services `Cluster`
/// (or web2 `Local`); node-a's and node-b's speakers both announce the IP,
/// one after the other, a second apart (past the neighbour's locktime),
/// four times each. Which node's MAC the client's cache holds after each.
fn client_after_both_announce(tag: &str, settle: bool, web2_local: bool) -> Vec<String> {
    let bed = bed(tag);
    for (s, holder, local) in [("web", "node-a", false), ("web2", "node-b", web2_local)] {
        let mut svc = objects::service("default", s, &[&IP.to_string()]);
        if !local {
            svc["spec"]["externalTrafficPolicy"] = "Cluster".into();
        }
        bed.api.apply(Resource::Services, svc);
        bed.api.apply(
            Resource::Leases,
            objects::cilium_lease(s, holder, 3600, "2026-11-30T10:00:00.000000Z"),
        );
    }
    let mut args = vec!["--announcer", "cilium"];
    if settle {
        args.push("--settle-shared-ips");
    }
    let guards = bed.start(&args).unwrap();
    // Each node's kube-ipvs0 holds the IP: the guards judge it (unknown, or
    // owned by node-a and foreign on node-b when settled).
    std::thread::sleep(Duration::from_secs(1));
    let speakers: Vec<RawSocket> = (bed.nodes[..2].iter())
        .map(|n| RawSocket::open(&n.ns, "eth0").unwrap())
        .collect();
    let client = &bed.peer;
    client
        .sysctl("net.ipv4.neigh.eth0.base_reachable_time_ms", "600000")
        .unwrap();
    client
        .set_neigh("eth0", IP, &bed.nodes[0].mac, "reachable")
        .unwrap();
    let mut held = Vec::new();
    for round in 0..8 {
        let i = if round % 2 == 0 { 1 } else { 0 };
        std::thread::sleep(Duration::from_millis(1200));
        announce(&speakers[i], bed.nodes[i].mac, IP, &[2]);
        std::thread::sleep(Duration::from_millis(200));
        let mac = client.cached_mac("eth0", &IP.to_string()).unwrap();
        let node = (bed.nodes.iter())
            .find(|n| Some(n.mac) == mac)
            .map_or_else(|| format!("{mac:?}"), |n| n.name.clone());
        held.push(node);
    }
    drop(guards);
    held
}

#[test]
fn settled_the_client_stays_on_the_node_kept_and_unsettled_it_follows_both() {
    testbed::require_root();
    let settled = client_after_both_announce("shs", true, false);
    assert!(
        settled.iter().all(|n| n == "node-a"),
        "settled on node-a: {settled:?}"
    );
    // Without the flag, today's behaviour: the IP is unknown, both
    // speakers pass, the client follows whichever announced last.
    let unsettled = client_after_both_announce("shu", false, false);
    assert!(unsettled.iter().any(|n| n == "node-b"), "{unsettled:?}");
    assert!(unsettled.iter().any(|n| n == "node-a"), "{unsettled:?}");
    // Never with a Local Service: node-b may hold web2's only endpoints.
    let local = client_after_both_announce("shl", true, true);
    assert!(local.iter().any(|n| n == "node-b"), "{local:?}");
}

#[test]
fn the_settle_flag_is_named_in_the_event() {
    testbed::require_root();
    let bed = bed("shn");
    for (s, holder) in [("web", "node-b"), ("web2", "node-a")] {
        let mut svc = objects::service("default", s, &[&IP.to_string()]);
        svc["spec"]["externalTrafficPolicy"] = "Cluster".into();
        bed.api.apply(Resource::Services, svc);
        bed.api.apply(
            Resource::Leases,
            objects::cilium_lease(s, holder, 3600, "2026-11-30T10:00:00.000000Z"),
        );
    }
    let mut args = CILIUM_PRESENCE_ARGS.to_vec();
    args.push("--settle-shared-ips");
    let guards = start(&bed, &args);
    let ev = on_each(&bed, &guards, "SplitElection", &["web", "web2"]);
    let note = ev[0]["note"].as_str().unwrap();
    // web is first by name: its holder, node-b, is kept.
    assert!(note.contains("keeps node-b as the owner"), "{note}");
    check(bed.wait_answer(IP, Some("node-b"), Duration::from_secs(10)));
}
