//! The fixture of the BPF_PROG_TEST_RUN tests (prog_test_run, ndp_test_run,
//! lb_filter, fuzz_differential): the LB set and the real program, loaded
//! through the daemon's own datapath (`guard::testing`), whose maps hold it. BPF_PROG_TEST_RUN runs the program on the loopback
//! device (ifindex 1), so "on the egress interface" means on lo here.

use std::{
    collections::BTreeMap,
    net::{Ipv4Addr, Ipv6Addr},
};

use guard::testing::{Datapath, LbIp, Provenance, Snapshot, View};
use guard_common::{LeakAction, Mode, Ownership};

pub const LO: u32 = 1;
pub const PRIMARY: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 11);
/// TC_ACT_UNSPEC: the program's "pass, let the next program decide".
pub const PASS: i32 = -1;
pub const DROP: i32 = 2;
pub const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(1);
pub const DEAD_AFTER: std::time::Duration = std::time::Duration::from_secs(2);
/// Heartbeat ages (ns) that are stale, and dead, under these thresholds.
pub const STALE_AGE: u64 = 1_200_000_000;
pub const DEAD_AGE: u64 = 3_000_000_000;

/// LB IPs with each state, some also on the egress interface.
pub fn lb_ips() -> Vec<(Ipv4Addr, Ownership, bool)> {
    vec![
        (Ipv4Addr::new(198, 51, 100, 101), Ownership::Owned, false),
        (Ipv4Addr::new(198, 51, 100, 102), Ownership::Foreign, false),
        (Ipv4Addr::new(198, 51, 100, 103), Ownership::Unknown, false),
        (Ipv4Addr::new(198, 51, 100, 104), Ownership::Unknown, true),
        (Ipv4Addr::new(198, 51, 100, 105), Ownership::Foreign, true),
        (Ipv4Addr::new(198, 51, 100, 106), Ownership::Owned, true),
    ]
}

/// IPv6 LB IPs with each state (judged in Neighbor Discovery).
pub fn lb_ips6() -> Vec<(Ipv6Addr, Ownership)> {
    let ip = |last| Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, last);
    vec![
        (ip(0x101), Ownership::Owned),
        (ip(0x102), Ownership::Foreign),
        (ip(0x103), Ownership::Unknown),
    ]
}

/// The view of [`lb_ips`] and [`lb_ips6`] on lo (and lo's primary IPv4 when `with_primary`).
pub fn view(with_primary: bool) -> View {
    let mut view = View::default();
    for (ip, state, on_egress) in lb_ips() {
        view.lb.insert(
            ip.into(),
            LbIp {
                state,
                source: Provenance::Interface("test".into()),
            },
        );
        if on_egress {
            view.if_addrs.insert((LO, ip));
        }
    }
    for (ip, state) in lb_ips6() {
        let source = Provenance::Interface("test".into());
        view.lb.insert(ip.into(), LbIp { state, source });
    }
    view.if_addrs.insert((LO, PRIMARY));
    if with_primary {
        view.if_primary.insert(LO, PRIMARY);
    }
    view
}

/// The capacity the fixture's maps are sized for. It holds nine LB IPs;
/// at the daemon's default (65,536) COUNTERS has 524,288 buckets, and every
/// read of the counters, which the table tests take before and after each
/// frame, walks them all: that walk was most of `prog_test_run`'s time,
/// minutes under emulation. Full maps are `map_health.rs`'s subject.
pub const MAX_LB_IPS: u32 = 64;

/// The real program, loaded, its maps holding [`view`].
pub fn datapath(with_primary: bool) -> Datapath {
    let mut dp = Datapath::load(&guard::testing::DatapathConfig {
        mode: Mode::Enforce,
        leak_action: LeakAction::Rewrite,
        max_lb_ips: MAX_LB_IPS,
        ..guard::testing::DatapathConfig::default()
    })
    .expect("load the BPF program (root?)");
    let r = dp.apply(&view(with_primary), false);
    assert!(r.failed.is_empty(), "{:?}", r.failed);
    // Short gate thresholds, so that the tests can fake a stale or dead
    // daemon without depending on the host's uptime.
    dp.set_gate(guard::testing::Gate {
        stale_after: STALE_AFTER,
        dead_after: DEAD_AFTER,
    })
    .unwrap();
    // Fresh, dated ahead so that a slow run cannot age it into `stale`.
    dp.heartbeat_at(guard::testing::monotonic_ns() + 3_600_000_000_000)
        .unwrap();
    dp
}

/// Date the heartbeat so that the program sees it `live` now (under the
/// tests' short gate thresholds): fresh is dated ahead, so that a slow run
/// cannot age it.
pub fn date_heartbeat(dp: &mut Datapath, live: guard_common::Liveness) {
    use guard_common::Liveness;
    let now = guard::testing::monotonic_ns();
    dp.heartbeat_at(match live {
        Liveness::Fresh => now + 3_600_000_000_000,
        Liveness::Stale => now - STALE_AGE,
        Liveness::Dead => now - DEAD_AGE,
    })
    .unwrap();
}

/// Run `frame` as if it came in through `ingress` (0: built by the kernel)
/// on an emptied COUNTERS: the return code, the frame as the program left
/// it, and what the run counted. Emptied first, the counters are one row
/// to read, not every earlier frame's (the table tests run thousands).
pub fn counted_run(
    dp: &mut Datapath,
    frame: &[u8],
    ingress: u32,
) -> (i32, Vec<u8>, BTreeMap<DeltaKey, u64>) {
    dp.clear_counters().unwrap();
    let before = Snapshot::rows_of_datapath(dp).unwrap();
    let (ret, out) = dp.test_run_from(frame, ingress).unwrap();
    let after = Snapshot::rows_of_datapath(dp).unwrap();
    (ret, out, counter_delta(&before, &after))
}

/// A counter row's key: (ip, kind, origin, state, verdict).
pub type DeltaKey = (guard_common::IpKey, u8, u8, u8, u8);

/// Counter changes between two snapshots: (ip, kind, origin, state, verdict) -> packets.
pub fn counter_delta(before: &Snapshot, after: &Snapshot) -> BTreeMap<DeltaKey, u64> {
    let mut d = BTreeMap::new();
    for r in &after.rows {
        let b = before
            .rows
            .iter()
            .find(|x| x.key == r.key)
            .map_or(0, |x| x.value.packets);
        if r.value.packets != b {
            d.insert(
                (
                    r.key.ip,
                    r.key.kind,
                    r.key.origin,
                    r.key.state,
                    r.key.verdict,
                ),
                r.value.packets - b,
            );
        }
    }
    d
}
