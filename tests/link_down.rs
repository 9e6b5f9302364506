//! An owner whose announcing link is down while its Lease still names it
//! (issue 45; reported for Cilium: the announce NIC down, the agent
//! renewing over another): its own guard tells at once. node-a owns
//! `default/web` (a Cilium Lease) and reaches the API over `mgmt0`, a
//! separate interface; its uplink `eth0` loses carrier (the switch's end
//! set down):
//!
//! - a Warning `OwnerLinkDown` on the Service within 5 s, naming the node,
//!   the interface and the Lease; posted by node-a only;
//! - at once, `arp-guard status` says it and the interface shows NO
//!   CARRIER, `arp_guard_owned_ips_without_carrier` is 1 there (0 on
//!   node-b), and ArpGuardOwnerLinkDown fires on node-a only (promtool on
//!   the real series);
//! - carrier back: a Normal `OwnerLinkRestored`, the gauge 0, and node-a
//!   answers for its IP as before (the finding never stopped a frame).
//!
//! Where the link was also the way to the API (the Events refused while it
//! is down) and the node lost its Lease meanwhile, the Warning still goes,
//! said to be late, before its Normal end; `kubectl arp-guard status` takes
//! the ended Warning as no finding (`guard_wire::events`, unit-tested in
//! the plugin).
//!
//! The same on a bond whose slaves all lose carrier: `kernel_bond.rs`, in
//! the VM lane.

use std::{
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use serde_json::Value;
use testbed::{
    alerting::{prove_one, Firing, STEP},
    cluster_bed::{check, ClusterBed},
    deploy::daemonset_wrapper,
    fake_api::{objects, Resource},
    scrape::Scraper,
    Daemon,
};

const IP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 100);
const GAUGE: &str = "arp_guard_owned_ips_without_carrier";

fn events(bed: &ClusterBed, reason: &str) -> Vec<Value> {
    (bed.api.events().into_iter())
        .filter(|e| e["reason"] == reason)
        .collect()
}

/// node-a owns `default/web` (a Cilium Lease) and answers for it; guards on
/// both nodes with the DaemonSet's privileges (reading carrier and posting
/// Events need nothing more), Events at most once a second a stream.
fn owned_by_node_a(tag: &str) -> (ClusterBed, Vec<Daemon>) {
    testbed::require_root();
    let bed = ClusterBed::new(tag, &[IP]).unwrap();
    bed.cilium_service("web", &[&IP.to_string()], "node-a", 3600);
    let args = ["--announcer", "cilium", "--kube-events-interval", "1s"];
    let guards = bed.start_wrapped(&daemonset_wrapper(), &args).unwrap();
    check(bed.wait_answer(IP, Some("node-a"), Duration::from_secs(10)));
    (bed, guards)
}

/// Every guard's log, for a failure's message.
fn logs(bed: &ClusterBed, guards: &[Daemon]) -> String {
    (bed.nodes.iter().zip(guards))
        .map(|(n, g)| format!("{}:\n{}", n.name, g.log_text()))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn an_owner_whose_link_is_down_says_so_within_seconds() {
    let (bed, guards) = owned_by_node_a("lnk");
    let logs = || logs(&bed, &guards);
    let targets: Vec<(&str, &testbed::Netns)> =
        bed.nodes.iter().map(|n| (n.name.as_str(), &n.ns)).collect();
    let scraper = Scraper::start(&targets, STEP).unwrap();
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        events(&bed, "OwnerLinkDown").is_empty(),
        "{:#?}",
        bed.api.events()
    );

    let t0 = Instant::now();
    bed.switch.ip(&["link", "set", "data0", "down"]).unwrap();
    let e = testbed::wait_for(Duration::from_secs(10), || {
        events(&bed, "OwnerLinkDown").into_iter().next()
    })
    .unwrap_or_else(|| panic!("no OwnerLinkDown: {:#?}\n{}", bed.api.events(), logs()));
    let took = t0.elapsed();
    assert!(took <= Duration::from_secs(5), "told after {took:?}");
    assert_eq!(e["type"], "Warning", "{e:#}");
    assert_eq!(e["reportingInstance"], "node-a", "{e:#}");
    assert_eq!(e["regarding"]["name"], "web", "{e:#}");
    let note = e["note"].as_str().unwrap_or_default();
    for want in [
        "node-a",
        "eth0",
        "cilium-l2announce-default-web",
        "no carrier",
    ] {
        assert!(note.contains(want), "{want} not in {note}");
    }
    // At once, in every case: the status line, the gauge.
    let a = &bed.nodes[0].ns;
    let bin = testbed::guard_binary();
    let out = a.exec_output(&[bin.to_str().unwrap(), "status"]).unwrap();
    let status = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        status.contains("OWNER LINK DOWN") && status.contains("NO CARRIER"),
        "{status}"
    );
    assert_eq!(testbed::counter(a, GAUGE), 1.0);
    assert_eq!(testbed::counter(&bed.nodes[1].ns, GAUGE), 0.0);
    std::thread::sleep(STEP * 3);
    let samples = scraper.stop();

    bed.switch.ip(&["link", "set", "data0", "up"]).unwrap();
    let ok = testbed::wait_for(Duration::from_secs(10), || {
        events(&bed, "OwnerLinkRestored").into_iter().next()
    })
    .unwrap_or_else(|| panic!("no OwnerLinkRestored: {:#?}\n{}", bed.api.events(), logs()));
    assert_eq!(ok["type"], "Normal", "{ok:#}");
    assert_eq!(events(&bed, "OwnerLinkDown").len(), 1, "told once");
    assert!(testbed::wait_until(
        Duration::from_secs(5),
        || testbed::counter(a, GAUGE) == 0.0
    ));
    check(bed.wait_answer(IP, Some("node-a"), Duration::from_secs(10)));

    let node_a = Firing::new(&[("instance", "node-a")], Some(1.0));
    let fired = prove_one(
        file!(),
        guard::reference::FIRED_BY,
        &samples,
        "ArpGuardOwnerLinkDown",
        &[node_a],
    );
    if let Err(e) = fired {
        panic!("{e:#}\n{}", logs());
    }
}

/// The only link down: its Events cannot go (refused here), and the node
/// loses its Lease (moved to node-b). The Warning still goes, said to be
/// late and that the IP moved, and only then its end; the node answers for
/// nothing it does not own. (The daemon before this dropped both once the
/// IP was no longer its own: the operator never learned why it moved.)
#[test]
fn the_warning_that_could_not_go_goes_late_even_after_the_ip_moved() {
    let (bed, guards) = owned_by_node_a("lnl");
    let logs = || logs(&bed, &guards);
    let a = &bed.nodes[0].ns;
    // 500: not one of the statuses kube's client retries (429, 503, 504),
    // so the attempt fails at once rather than at the request's timeout.
    bed.api.set_events_refused(Some(500));
    bed.switch.ip(&["link", "set", "data0", "down"]).unwrap();
    let failed = "arp_guard_kube_events_total{reason=\"OwnerLinkDown\",outcome=\"failed\"}";
    let tried = testbed::wait_until(Duration::from_secs(10), || {
        testbed::counter(a, failed) >= 1.0
    });
    assert!(tried, "no failed attempt\n{}", logs());
    assert_eq!(testbed::counter(a, GAUGE), 1.0);
    assert!(events(&bed, "OwnerLinkDown").is_empty());

    // The API reachable again, and the Lease gone to node-b meanwhile.
    bed.api.set_events_refused(None);
    bed.api.apply(
        Resource::Leases,
        objects::cilium_lease("web", "node-b", 3600, "2026-11-30T10:00:05.000000Z"),
    );
    let end = testbed::wait_for(Duration::from_secs(15), || {
        events(&bed, "OwnerLinkRestored").into_iter().next()
    })
    .unwrap_or_else(|| panic!("no OwnerLinkRestored: {:#?}\n{}", bed.api.events(), logs()));
    let told = events(&bed, "OwnerLinkDown");
    assert_eq!(told.len(), 1, "{told:#?}");
    let note = told[0]["note"].as_str().unwrap_or_default();
    for want in ["told late", "eth0", "moved to another node"] {
        assert!(note.contains(want), "{want} not in {note}");
    }
    let end_note = end["note"].as_str().unwrap_or_default();
    assert!(end_note.contains("no longer owns"), "{end_note}");
    // In order: the Warning's time before its end's.
    let at = |e: &Value| e["eventTime"].as_str().unwrap_or_default().to_owned();
    assert!(!at(&end).is_empty(), "{end:#}");
    assert!(at(&told[0]) <= at(&end), "{:#?}", (&told[0], &end));
    assert_eq!(testbed::counter(a, GAUGE), 0.0);

    bed.switch.ip(&["link", "set", "data0", "up"]).unwrap();
    check(bed.wait_answer(IP, Some("node-b"), Duration::from_secs(10)));
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(events(&bed, "OwnerLinkDown").len(), 1, "told once");
    assert_eq!(events(&bed, "OwnerLinkRestored").len(), 1, "ended once");
}
