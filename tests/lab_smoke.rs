//! The lab (the project's main job) on a short run: the incident's mechanism
//! shows in phase 1 and is gone in phase 2.

use testbed::lab::{run, Options};

#[test]
fn lab_reproduces_then_stops_the_incident() {
    testbed::require_root();
    // With three nodes racing, the chance that the owner wins all ten is
    // about (1/3)^10: phase 1 shows the incident.
    let attempts = 10;
    let (before, after) = run(&Options {
        attempts,
        binary: testbed::guard_binary(),
    })
    .unwrap();
    assert_eq!(before.attempts, attempts);
    // Without the guard an attempt succeeds exactly when the client happened
    // to learn the owner's MAC (which MAC wins is the race itself).
    for (who, (n, ok)) in &before.learned {
        if who == "node1" {
            assert_eq!(n, ok, "learning the owner's MAC must work");
        } else {
            assert_eq!(*ok, 0, "learning {who}'s MAC must fail (no endpoint there)");
        }
    }
    assert_eq!(
        before.successes,
        before.learned.get("node1").map_or(0, |e| e.1)
    );
    // With the guard every attempt reaches the owner.
    assert_eq!(after.successes, attempts, "{after:?}");
    assert_eq!(after.learned.keys().collect::<Vec<_>>(), ["node1"]);
    for node in ["node2", "node3"] {
        let dropped: u64 = after.counters[node]["counters"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| {
                r["kind"] == "reply"
                    && r["origin"] == "kernel"
                    && r["state"] == "foreign"
                    && r["verdict"] == "dropped"
            })
            .map(|r| r["packets"].as_u64().unwrap())
            .sum();
        assert!(
            dropped >= u64::from(attempts),
            "{node} dropped {dropped} replies for {attempts} attempts"
        );
    }
}
