//! IPv6 Neighbor Discovery through the real program with BPF_PROG_TEST_RUN:
//! advertisements and solicitations about IPv6 LB IPs of each state, tagged
//! and untagged, kernel-originated and redirected, in every mode and
//! heartbeat state. Expected outcomes are written out by hand from the
//! verdict table (docs/design.md, "The NDP rows"), not derived from `guard_common`.

use std::collections::BTreeMap;

use guard::testing::Snapshot;
use guard_common::{
    key_of_ip, ndp_build::NdSpec, Kind, Liveness, Mode, Origin, Ownership, Verdict,
};

use test_run::{counted_run, counter_delta, datapath, date_heartbeat, lb_ips6, DROP, PASS};
use testbed::nd_bytes;

const MAC: [u8; 6] = [2, 0, 0x5e, 0, 0x53, 9];
const PEER: [u8; 16] = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];

fn frames_for(ip: [u8; 16]) -> Vec<(Kind, NdSpec)> {
    vec![
        (
            Kind::NaSolicited,
            NdSpec::advert(MAC, ip, [2, 0, 0, 0, 0, 1], PEER, 0x60),
        ),
        (Kind::NaUnsolicited, NdSpec::unsolicited(MAC, ip)),
        (Kind::NsLeak, NdSpec::solicit(MAC, ip, PEER)),
    ]
}

/// By hand: what the program must do with an announcement of an IPv6 LB IP
/// in `state` (the origin does not matter for NDP), and the state label.
fn expected(state: Ownership, mode: Mode, live: Liveness) -> (Verdict, Ownership) {
    use Ownership::*;
    match (state, live) {
        (Owned, _) => (Verdict::Passed, Owned),
        (Foreign, Liveness::Fresh) if mode == Mode::Enforce => (Verdict::Dropped, Foreign),
        (Foreign, Liveness::Fresh) => (Verdict::WouldDrop, Foreign),
        // A stale heartbeat makes foreign unknown; unknown NDP passes.
        (Foreign, Liveness::Stale) | (Unknown, Liveness::Stale) => (Verdict::Passed, Unknown),
        (Foreign, Liveness::Dead) => (Verdict::Passed, Foreign),
        (Unknown, _) => (Verdict::Passed, Unknown),
    }
}

#[test]
fn advertisements_and_solicitations_follow_the_table() {
    testbed::require_root();
    let mut dp = datapath(true);
    let redirect_ok = dp.test_run_sets_ingress();
    let tags: [[Option<(u16, u16)>; 2]; 3] = [
        [None, None],
        [Some((0x8100, 7)), None],
        [Some((0x88a8, 100)), Some((0x8100, 7))],
    ];
    let mut runs = 0;
    for mode in [Mode::Enforce, Mode::Monitor] {
        dp.set_config(mode, guard_common::LeakAction::Rewrite)
            .unwrap();
        for live in [Liveness::Fresh, Liveness::Stale, Liveness::Dead] {
            for (ip, state) in lb_ips6() {
                for (kind, spec) in frames_for(ip.octets()) {
                    for t in tags {
                        for (ingress, origin) in
                            [(0, Origin::Kernel), (test_run::LO, Origin::Redirect)]
                        {
                            if ingress != 0 && !redirect_ok {
                                continue;
                            }
                            date_heartbeat(&mut dp, live);
                            let frame = nd_bytes(&NdSpec { tags: t, ..spec });
                            let (ret, out, delta) = counted_run(&mut dp, &frame, ingress);
                            let (want, label) = expected(state, mode, live);
                            let ctx = format!(
                                "{ip} {state:?} {kind:?} {origin:?} tags={t:?} {mode:?} {live:?}"
                            );
                            let want_ret = if want == Verdict::Dropped { DROP } else { PASS };
                            assert_eq!(ret, want_ret, "return code: {ctx}");
                            assert_eq!(out, frame, "NDP is never rewritten: {ctx}");
                            let key = (
                                key_of_ip(ip.into()),
                                kind as u8,
                                origin as u8,
                                label as u8,
                                want as u8,
                            );
                            assert_eq!(delta, BTreeMap::from([(key, 1)]), "counters: {ctx}");
                            runs += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(runs >= 2 * 3 * 3 * 3 * 3, "{runs} runs");
}

#[test]
fn what_teaches_nothing_or_is_broken_passes_untouched_and_uncounted() {
    testbed::require_root();
    let dp = datapath(true);
    let foreign = lb_ips6()
        .into_iter()
        .find(|(_, s)| *s == Ownership::Foreign)
        .unwrap()
        .0
        .octets();
    let no_option = NdSpec {
        sll: false,
        ..NdSpec::solicit(MAC, foreign, PEER)
    };
    let dad = NdSpec {
        src: [0; 16],
        sll: false,
        ..NdSpec::solicit(MAC, [0; 16], foreign)
    };
    let hop_64 = NdSpec {
        hop_limit: 64,
        ..NdSpec::unsolicited(MAC, foreign)
    };
    let deep = NdSpec {
        ext_headers: 5,
        ..NdSpec::unsolicited(MAC, foreign)
    };
    let mut zero_opt = nd_bytes(&NdSpec::solicit(MAC, foreign, PEER));
    zero_opt[14 + 40 + 25] = 0;
    let mut cut = nd_bytes(&NdSpec::unsolicited(MAC, foreign));
    cut.truncate(14 + 40 + 12);
    // (frame, the total it must bump, or none)
    // Receivers discard the broken ones; the deep chain they may accept.
    let cases: Vec<(&str, Vec<u8>, Option<&str>)> = vec![
        ("NS without a link-layer option", nd_bytes(&no_option), None),
        ("DAD NS", nd_bytes(&dad), Some("ndp_not_lb")),
        ("hop limit 64", nd_bytes(&hop_64), Some("ndp_malformed")),
        // A fail-open limit, not a broken message: counted on its own.
        (
            "five extension headers",
            nd_bytes(&deep),
            Some("ipv6_unfollowed"),
        ),
        ("zero-length option", zero_opt, Some("ndp_malformed")),
        ("cut in the target", cut, Some("ndp_malformed")),
    ];
    for (what, frame, total) in cases {
        let before = Snapshot::of_datapath(&dp).unwrap();
        let (ret, out) = dp.test_run_from(&frame, 0).unwrap();
        let after = Snapshot::of_datapath(&dp).unwrap();
        assert_eq!(ret, PASS, "{what}");
        assert_eq!(out, frame, "{what}: byte for byte");
        assert!(counter_delta(&before, &after).is_empty(), "{what}: counted");
        let ndp = after.stats["ndp"] - before.stats["ndp"];
        assert_eq!(ndp, u64::from(total != Some("ipv6_unfollowed")), "{what}");
        if let Some(t) = total {
            assert_eq!(after.stats[t] - before.stats[t], 1, "{what}: {t}");
        }
    }
}
