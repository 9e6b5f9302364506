//! The feed's API check (a cached GET of the `kubernetes` Service when the
//! streams' heartbeat is overdue, at once when the datapath hints that
//! something moved unseen, or every 2 s while they fail) is asked beside
//! the feed's loop, never in it: while it hangs, a Lease's expiry still
//! takes effect at its time. Before, the loop awaited it, and a takeover
//! due while the API was slow waited up to the check's 2 s timeout.

use std::{
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use testbed::{
    cluster_bed::ClusterBed,
    fake_api::{objects, Fault, Resource},
    wait_for, ArpSpec, RawSocket,
};

const LB: &str = "198.51.100.100";

/// Node `i`'s state for [`LB`] in its `/status`.
fn state(bed: &ClusterBed, i: usize) -> Option<String> {
    let (_, body) = bed.nodes[i]
        .ns
        .enter(|| guard::testing::get("127.0.0.1:9477".parse().unwrap(), "/status"))
        .ok()?;
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    let row = v["ips"].as_array()?.iter().find(|r| r["ip"] == LB)?.clone();
    row["state"].as_str().map(str::to_owned)
}

/// The API checks asked so far (GETs of one Service: nothing else GETs one).
fn checks(bed: &ClusterBed) -> u64 {
    (bed.api.tally().iter())
        .filter(|((_, verb, res), _)| *verb == "get" && res.starts_with("services"))
        .map(|(_, c)| c.requests)
        .sum()
}

#[test]
fn a_hung_api_check_does_not_hold_back_a_lease_expiry() {
    testbed::require_root();
    let bed = ClusterBed::new("chk", &[LB.parse::<Ipv4Addr>().unwrap()]).unwrap();
    bed.api.apply(
        Resource::Services,
        objects::service("default", "web", &[LB]),
    );
    // The API check's GET is never answered; lists, watches and the Lease's
    // confirming GET are.
    bed.api.set_fault(Resource::Services, Some(Fault::HungGet));
    // Bookmarks about once a minute, as a real server sends them (the fake's
    // default of 1 s would keep the streams from ever being quiet).
    bed.api.set_bookmark_every(Duration::from_secs(60));
    let guard = bed
        .start_on(
            0,
            // Blind threshold 8 s: on a hint, the check is asked once the
            // streams have been quiet 5 s (the threshold less its timeout
            // and 1 s).
            &[
                "--announcer",
                "cilium",
                "--presence-period",
                "0",
                "--stale-after",
                "8s",
            ],
            Duration::from_secs(20),
        )
        .unwrap();
    assert_eq!(state(&bed, 0).as_deref(), Some("unknown"), "no Lease yet");
    assert_eq!(guard.count_log(r#""to":"owned""#), 0);
    // node-b holds it (renewed far ahead): foreign on node-a.
    bed.api.apply(
        Resource::Leases,
        objects::cilium_lease("web", "node-b", 600, "2026-11-30T09:59:00.000000Z"),
    );
    assert!(
        wait_for(Duration::from_secs(5), || (state(&bed, 0).as_deref()
            == Some("foreign"))
        .then_some(()))
        .is_some(),
        "node-b's Lease seen"
    );
    // At rest, with the heartbeat a minute apart, nothing asks.
    let asked = checks(&bed);
    std::thread::sleep(Duration::from_secs(8));
    assert_eq!(checks(&bed), asked, "no check at rest");
    // A speaker on node-a announces the IP the feed calls foreign: the
    // datapath's hint. The moment a check is asked, it hangs for its 2 s
    // timeout.
    let speaker = RawSocket::open(&bed.nodes[0].ns, "eth0").unwrap();
    let garp = ArpSpec::gratuitous(2, bed.nodes[0].mac, LB.parse().unwrap()).to_bytes();
    assert!(!speaker.send(&garp).unwrap(), "node-a's speaker is stopped");
    assert!(
        wait_for(Duration::from_secs(10), || (checks(&bed) > asked)
            .then_some(()))
        .is_some(),
        "the API check is asked on the datapath's hint"
    );
    // A 1 s Lease nobody renews, seen now: it expires in the middle of the
    // hung check.
    let applied = Instant::now();
    bed.api.apply(
        Resource::Leases,
        objects::cilium_lease("web", "node-a", 1, "2026-11-30T10:00:00.000000Z"),
    );
    // The daemon's own log says when it changed its mind (the /status
    // would have to be polled within the Lease's one second).
    guard.expect_log(r#""from":"foreign","to":"owned""#, Duration::from_secs(3));
    let expired = wait_for(Duration::from_secs(10), || {
        guard
            .wait_log(r#""from":"owned","to":"unknown""#, Duration::ZERO)
            .map(|_| applied.elapsed())
    })
    .expect("the Lease expires");
    // The check was still out: the one asked before the Lease, no other.
    assert_eq!(checks(&bed), asked + 1, "no second check meanwhile");
    // At +1 s and its confirming GET (the loop's deadline), well before
    // the check gives up (+2 s). The loop that awaited the check took 3.0 s
    // here (it saw the Lease expire only after the check's timeout, and
    // then the feed degraded); a plain late expiry would be about 2 s.
    assert!(
        expired < Duration::from_millis(1_800),
        "the expiry took effect {expired:?} after the Lease was seen (due at 1 s)"
    );
    assert!(
        expired >= Duration::from_secs(1),
        "not before it was due: {expired:?}"
    );
}
