//! The LB filter in front of `LB_IPS` (one bit per hash of an LB IP): the
//! real program through BPF_PROG_TEST_RUN while the daemon's writer adds and
//! removes IPs, two of them on the same bit. The safe direction: an IP in
//! the LB set is judged from the moment `apply` returns, and the bit of an IP
//! that left stays set while another IP stands on it.

use std::net::Ipv4Addr;

use guard::testing::{LbIp, Provenance, Snapshot, View};
use guard_common::{lb_filter_slot, Ownership};
use testbed::ArpSpec;

use test_run::{datapath, DROP, PASS};

const MAC: [u8; 6] = [2, 0, 0x5e, 0, 0x53, 9];
const PEER: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);

/// Two addresses of 10.64.0.0/10 on the same filter bit (a birthday
/// search: a few thousand addresses suffice for 2^20 bits).
fn colliding_pair() -> (Ipv4Addr, Ipv4Addr) {
    let mut seen = std::collections::HashMap::new();
    for i in 0..(1u32 << 22) {
        let ip = 0x0a40_0000 + i;
        if let Some(first) = seen.insert(lb_filter_slot(ip), ip) {
            return (Ipv4Addr::from(first), Ipv4Addr::from(ip));
        }
    }
    panic!("no two addresses share a bit: the hash is not a hash");
}

fn foreign(ips: &[Ipv4Addr]) -> View {
    let mut v = View::default();
    for ip in ips {
        v.lb.insert(
            (*ip).into(),
            LbIp {
                state: Ownership::Foreign,
                source: Provenance::Interface("test".into()),
            },
        );
    }
    v
}

fn verdict(dp: &guard::testing::Datapath, ip: Ipv4Addr) -> i32 {
    let frame = ArpSpec::reply(MAC, ip, [2, 0, 0, 0, 0, 1], PEER).to_bytes();
    dp.test_run_from(&frame, 0).unwrap().0
}

#[test]
fn ips_sharing_a_bit_are_judged_until_each_leaves() {
    testbed::require_root();
    let (a, b) = colliding_pair();
    assert_eq!(lb_filter_slot(a.into()), lb_filter_slot(b.into()));
    let mut dp = datapath(true);
    // Neither is an LB IP yet: both pass as not-LB.
    assert_eq!((verdict(&dp, a), verdict(&dp, b)), (PASS, PASS));
    let r = dp.apply(&foreign(&[a, b]), false);
    assert!(r.failed.is_empty(), "{:?}", r.failed);
    assert_eq!((verdict(&dp, a), verdict(&dp, b)), (DROP, DROP));
    // `a` leaves; `b` stands on the same bit and must still be judged.
    dp.apply(&foreign(&[b]), false);
    assert_eq!((verdict(&dp, a), verdict(&dp, b)), (PASS, DROP));
    // The last one leaves: the bit goes, and the frame is counted as not-LB
    // without the hash lookup (the same total either way).
    let before = Snapshot::of_datapath(&dp).unwrap().stats["not_lb"];
    dp.apply(&foreign(&[]), false);
    assert_eq!(verdict(&dp, b), PASS);
    assert_eq!(
        Snapshot::of_datapath(&dp).unwrap().stats["not_lb"],
        before + 1
    );
    // And back: judged as soon as apply returns.
    dp.apply(&foreign(&[a]), false);
    assert_eq!((verdict(&dp, a), verdict(&dp, b)), (DROP, PASS));
}

/// A restarted daemon on pinned maps: a second load takes over `LB_IPS`
/// from the pins with a fresh, empty filter, and the reload from the kernel
/// (what start-up does before anything is attached) must make the filter
/// stand for every IP the pinned map holds, without any write of the view.
#[test]
fn a_second_load_on_pinned_maps_rebuilds_the_filter() {
    testbed::require_root();
    let fs = testbed::bed::Bpffs::new("filter").unwrap();
    let cfg = guard::testing::DatapathConfig {
        pin_dir: Some(fs.path().join("arp-guard")),
        ..guard::testing::DatapathConfig::default()
    };
    let ips: Vec<Ipv4Addr> = (1..=300)
        .map(|i| Ipv4Addr::from(0x0a50_0000u32 + i))
        .collect();
    {
        let mut first = guard::testing::Datapath::load(&cfg).unwrap();
        let r = first.apply(&foreign(&ips), false);
        assert!(r.failed.is_empty(), "{:?}", r.failed);
    }
    let mut second = guard::testing::Datapath::load(&cfg).unwrap();
    second.heartbeat().unwrap();
    // Before the reload the new filter is empty: every frame would pass as
    // not-LB (which is why start-up reloads before it attaches).
    assert_eq!(verdict(&second, ips[0]), PASS);
    second.reload_from_kernel().unwrap();
    for ip in &ips {
        assert_eq!(verdict(&second, *ip), DROP, "{ip}");
    }
}

/// The per-change writer (one Kubernetes event, one address) keeps the
/// filter as the full writer does.
#[test]
fn per_change_writes_keep_the_filter() {
    testbed::require_root();
    let (a, b) = colliding_pair();
    let mut dp = datapath(true);
    let changed = |ips: &[Ipv4Addr]| {
        ips.iter()
            .map(|ip| std::net::IpAddr::V4(*ip))
            .collect::<std::collections::BTreeSet<_>>()
    };
    let r = dp.apply_changes(&foreign(&[a]), &changed(&[a]), false);
    assert!(r.failed.is_empty(), "{:?}", r.failed);
    assert_eq!((verdict(&dp, a), verdict(&dp, b)), (DROP, PASS));
    dp.apply_changes(&foreign(&[a, b]), &changed(&[b]), false);
    assert_eq!((verdict(&dp, a), verdict(&dp, b)), (DROP, DROP));
    dp.apply_changes(&foreign(&[b]), &changed(&[a]), false);
    assert_eq!((verdict(&dp, a), verdict(&dp, b)), (PASS, DROP));
    dp.apply_changes(&foreign(&[]), &changed(&[b]), false);
    assert_eq!((verdict(&dp, a), verdict(&dp, b)), (PASS, PASS));
}
