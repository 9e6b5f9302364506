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
    scrape::Scraper,
};

const IP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 100);
const GAUGE: &str = "arp_guard_owned_ips_without_carrier";

fn events(bed: &ClusterBed, reason: &str) -> Vec<Value> {
    (bed.api.events().into_iter())
        .filter(|e| e["reason"] == reason)
        .collect()
}

#[test]
fn an_owner_whose_link_is_down_says_so_within_seconds() {
    testbed::require_root();
    let bed = ClusterBed::new("lnk", &[IP]).unwrap();
    bed.cilium_service("web", &[&IP.to_string()], "node-a", 3600);
    // With the DaemonSet's privileges: reading carrier and posting Events
    // need nothing more.
    let args = ["--announcer", "cilium", "--kube-events-interval", "1s"];
    let guards = bed.start_wrapped(&daemonset_wrapper(), &args).unwrap();
    let logs = || {
        (bed.nodes.iter().zip(&guards))
            .map(|(n, g)| format!("{}:\n{}", n.name, g.log_text()))
            .collect::<Vec<_>>()
            .join("\n")
    };
    check(bed.wait_answer(IP, Some("node-a"), Duration::from_secs(10)));
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
