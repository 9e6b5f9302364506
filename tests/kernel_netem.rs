//! The API path as it is in a real network, made with netem on the nodes'
//! management links: slow and lossy (the guards still sync and follow a
//! Lease that moves), then cut (every packet lost: the feed goes stale, the
//! stale guard stops nothing a speaker sends, the owner is never blocked),
//! then back (fresh again, foreign again). Needs netem: runs in
//! `cargo xtask vm-test`.

use std::{net::Ipv4Addr, time::Duration};

use testbed::{
    cluster_bed::{check, ClusterBed},
    fake_api::{objects, Resource},
    kernel, wait_until, ArpSpec, RawSocket,
};

const LB: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 100);

/// Replace the management link's netem settings on every node.
fn api_path(bed: &ClusterBed, netem: &[&str]) {
    for n in &bed.nodes {
        let mut args = vec!["tc", "qdisc", "replace", "dev", "mgmt0", "root", "netem"];
        args.extend_from_slice(netem);
        n.ns.exec(&args).unwrap();
    }
}

#[test]
fn a_slow_lossy_api_path_converges_and_a_cut_one_fails_open() {
    testbed::require_root();
    if !kernel::require("netem", kernel::has_netem()) {
        return;
    }
    let bed = ClusterBed::new("netem", &[LB]).unwrap();
    bed.cilium_service("web", &["198.51.100.100"], "node-a", 120);
    // 150 ms +- 50 ms each way and 10% of packets lost, from the start.
    let lossy = ["delay", "150ms", "50ms", "loss", "10%"];
    api_path(&bed, &lossy);
    let sync = Duration::from_secs(60);
    let args = ["--announcer", "cilium", "--stale-after", "5s"];
    let guards = [
        bed.start_on(0, &args, sync).unwrap(),
        bed.start_on(1, &args, sync).unwrap(),
    ];
    check(bed.wait_answer(LB, Some("node-a"), Duration::from_secs(20)));
    bed.api.apply(
        Resource::Leases,
        objects::cilium_lease("web", "node-b", 120, "2026-11-30T10:00:05.000000Z"),
    );
    check(bed.wait_answer(LB, Some("node-b"), Duration::from_secs(30)));

    // node-a's speaker is foreign now: stopped while its feed is fresh.
    let node_a = &bed.nodes[0];
    let speaker = RawSocket::open(&node_a.ns, "eth0").unwrap();
    let garp = ArpSpec::gratuitous(2, node_a.mac, LB).to_bytes();
    // node-a learns of the move through its own lossy path, maybe later
    // than node-b did.
    assert!(
        wait_until(Duration::from_secs(30), || !speaker.send(&garp).unwrap()),
        "foreign on node-a: its speaker's frame is dropped"
    );

    // The path is cut: the feed goes stale and the guard stops blocking speakers.
    api_path(&bed, &["loss", "100%"]);
    let stale = guards[0].wait_log("ownership feed stale", Duration::from_secs(60));
    assert!(stale.is_some(), "{}", guards[0].log_text());
    assert!(
        wait_until(Duration::from_secs(5), || speaker.send(&garp).unwrap()),
        "a stale guard lets the speaker through"
    );
    // The owner keeps answering all along.
    assert_eq!(bed.who_answers(LB).as_deref(), Some("node-b"));

    // Back to slow and lossy: fresh again, foreign again.
    api_path(&bed, &lossy);
    guards[0].expect_log("fresh again", Duration::from_secs(90));
    assert!(
        wait_until(Duration::from_secs(10), || !speaker.send(&garp).unwrap()),
        "foreign again"
    );
    let _ = &guards[1];
}
