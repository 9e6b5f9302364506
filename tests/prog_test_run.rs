//! The real BPF program, run by the kernel with BPF_PROG_TEST_RUN on frames
//! that cannot be produced on this machine's wire (VLAN-tagged kernel frames,
//! every truncation), compared verdict by verdict and counter by counter with
//! the host-side reference `guard_common::decide`.
//!
//! BPF_PROG_TEST_RUN gives the skb a dummy socket of family AF_UNSPEC and the
//! loopback device, so a frame here is kernel-originated on ifindex 1, or
//! redirected when the test context names an ingress device.

use std::{collections::BTreeMap, net::Ipv4Addr};

use guard::testing::Snapshot;
use guard_common::{
    decide, effective_state, Facts, Kind, LeakAction, Liveness, Mode, Origin, Verdict,
};
use testbed::ArpSpec;

use test_run::{counted_run, counter_delta, datapath, lb_ips, DROP, PASS, PRIMARY};

const MAC: [u8; 6] = [2, 0, 0x5e, 0, 0x53, 9];
const PEER: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);

fn frames_for(ip: Ipv4Addr) -> Vec<(Kind, ArpSpec)> {
    vec![
        (
            Kind::Reply,
            ArpSpec::reply(MAC, ip, [2, 0, 0, 0, 0, 1], PEER),
        ),
        (Kind::Gratuitous, ArpSpec::gratuitous(1, MAC, ip)),
        (Kind::Gratuitous, ArpSpec::gratuitous(2, MAC, ip)),
        (Kind::AnnounceLeak, ArpSpec::request(MAC, ip, PEER)),
    ]
}

const TAGS: [&[(u16, u16)]; 4] = [
    &[],
    &[(0x8100, 7)],
    &[(0x88a8, 100)],
    &[(0x88a8, 100), (0x8100, 7)],
];

#[test]
fn program_agrees_with_reference_on_the_whole_table() {
    testbed::require_root();
    for with_primary in [true, false] {
        let mut dp = datapath(with_primary);
        // Kernels before 5.12 cannot name an ingress device in a test run.
        let redirect_ok = dp.test_run_sets_ingress();
        if !redirect_ok {
            eprintln!("NOTE: this kernel's BPF_PROG_TEST_RUN cannot set ingress_ifindex: the redirect origin is not run");
        }
        for mode in [Mode::Enforce, Mode::Monitor] {
            for (leak_action, live) in [LeakAction::Rewrite, LeakAction::Drop]
                .into_iter()
                .flat_map(|l| {
                    [Liveness::Fresh, Liveness::Stale, Liveness::Dead].map(move |v| (l, v))
                })
            {
                dp.set_config(mode, leak_action).unwrap();
                // The tests' gate: stale after 1 s, dead after 2 s. The
                // heartbeat is dated again before every run, so that a slow
                // (loaded) machine cannot age a stale one into dead mid-loop.
                let beat = |dp: &mut guard::testing::Datapath| test_run::date_heartbeat(dp, live);
                for (ip, state, on_egress) in lb_ips() {
                    for (kind, spec) in frames_for(ip) {
                        // The test run's device is lo (ifindex 1): a frame
                        // that came in on lo was redirected out of it; one
                        // that came in on another device was forwarded.
                        for (tags, ingress, origin) in TAGS
                            .into_iter()
                            .flat_map(|t| {
                                [
                                    (t, 0, Origin::Kernel),
                                    (t, test_run::LO, Origin::Redirect),
                                    (t, 7, Origin::Kernel),
                                ]
                            })
                            .filter(|(_, ingress, _)| *ingress == 0 || redirect_ok)
                        {
                            let frame = spec.clone().tagged(tags).to_bytes();
                            let want = decide(&Facts {
                                kind,
                                origin,
                                state,
                                ip_on_egress: on_egress,
                                egress_has_ipv4: with_primary,
                                mode,
                                leak_action,
                                liveness: live,
                            });
                            beat(&mut dp);
                            let (ret, out, delta) = counted_run(&mut dp, &frame, ingress);
                            // Written out only when an assertion fails (thousands of
                            // frames: formatting each cost seconds under emulation).
                            let ctx = || {
                                format!("{ip} {state:?} on_egress={on_egress} {kind:?} {origin:?} ingress={ingress} op={} tags={tags:?} {mode:?} {leak_action:?} primary={with_primary} {live:?}", spec.op)
                            };
                            assert_eq!(
                                ret,
                                if want == Verdict::Dropped { DROP } else { PASS },
                                "return code: {}",
                                ctx()
                            );
                            let mut expected = frame.clone();
                            if want == Verdict::Rewritten {
                                let spa = 14 + 4 * tags.len() + 14;
                                expected[spa..spa + 4].copy_from_slice(&PRIMARY.octets());
                            }
                            assert_eq!(out, expected, "frame after the program: {}", ctx());
                            let judged = effective_state(state, live);
                            let key = (
                                guard_common::v4_key(u32::from(ip)),
                                kind as u8,
                                origin as u8,
                                judged as u8,
                                want as u8,
                            );
                            assert_eq!(delta, BTreeMap::from([(key, 1)]), "counters: {}", ctx());
                        }
                    }
                }
            }
        }
    }
}

/// A tagged frame is judged against the VLAN device its tags lead to
/// (`VLAN_UPPERS`, two levels), a tag with no device against the guarded
/// interface: the arp_ignore=1 rule and the rewrite address. Real VLAN
/// devices: `tests/kernel_vlan.rs` in the VM lane.
#[test]
fn tags_are_judged_against_their_vlan_device() {
    testbed::require_root();
    const VLAN_DEV: u32 = 4242;
    const QINQ_DEV: u32 = 4243;
    let vlan_ip = Ipv4Addr::new(203, 0, 113, 11);
    let qinq_ip = Ipv4Addr::new(203, 0, 113, 12);
    // 198.51.100.103: unknown, not on lo, but on the VLAN device.
    let unknown = Ipv4Addr::new(198, 51, 100, 103);
    let foreign = Ipv4Addr::new(198, 51, 100, 102);
    let mut dp = datapath(true);
    let mut view = test_run::view(true);
    view.vlan_uppers.insert((test_run::LO, 100), VLAN_DEV);
    view.vlan_uppers.insert((VLAN_DEV, 7), QINQ_DEV);
    view.if_addrs.insert((VLAN_DEV, unknown));
    view.if_addrs.insert((VLAN_DEV, vlan_ip));
    view.if_primary.insert(VLAN_DEV, vlan_ip);
    view.if_primary.insert(QINQ_DEV, qinq_ip);
    let r = dp.apply(&view, false);
    assert!(r.failed.is_empty(), "{:?}", r.failed);
    let reply = ArpSpec::reply(MAC, unknown, [2, 0, 0, 0, 0, 1], PEER);
    for (tags, want) in [
        (&[][..], DROP),
        (&[(0x8100, 100)][..], PASS),
        (&[(0x8100, 200)][..], DROP),
    ] {
        let (ret, _) = dp
            .test_run_from(&reply.clone().tagged(tags).to_bytes(), 0)
            .unwrap();
        assert_eq!(ret, want, "unknown kernel reply, tags {tags:?}");
    }
    let leak = ArpSpec::request(MAC, foreign, PEER);
    for (tags, want) in [
        (&[][..], PRIMARY),
        (&[(0x8100, 100)][..], vlan_ip),
        (&[(0x88a8, 100), (0x8100, 7)][..], qinq_ip),
        (&[(0x88a8, 100), (0x8100, 8)][..], vlan_ip),
        (&[(0x8100, 300)][..], PRIMARY),
    ] {
        let (ret, out) = dp
            .test_run_from(&leak.clone().tagged(tags).to_bytes(), 0)
            .unwrap();
        assert_eq!(ret, PASS, "a leak is rewritten, not dropped");
        let spa = 14 + 4 * tags.len() + 14;
        assert_eq!(
            out[spa..spa + 4],
            want.octets(),
            "rewrite address for tags {tags:?}"
        );
    }
}

#[test]
fn truncated_frames_pass_untouched_at_every_length() {
    testbed::require_root();
    let dp = datapath(true);
    let foreign = Ipv4Addr::new(198, 51, 100, 102);
    for tags in TAGS {
        let full = ArpSpec::reply(MAC, foreign, [2, 0, 0, 0, 0, 1], PEER)
            .tagged(tags)
            .to_bytes();
        let arp_end = 14 + 4 * tags.len() + 28;
        // BPF_PROG_TEST_RUN needs at least an Ethernet header.
        for len in 14..arp_end {
            let frame = &full[..len];
            let before = Snapshot::of_datapath(&dp).unwrap();
            let (ret, out) = dp.test_run(frame).unwrap();
            let after = Snapshot::of_datapath(&dp).unwrap();
            assert_eq!(ret, PASS, "len {len} tags {tags:?}");
            assert_eq!(out, frame, "len {len} tags {tags:?}");
            assert!(
                counter_delta(&before, &after).is_empty(),
                "len {len}: no decision may be counted"
            );
            // Once the ARP ethertype is visible, the frame counts as malformed.
            let ethertype_visible = len >= 14 + 4 * tags.len();
            let malformed = after.stats["malformed"] - before.stats["malformed"];
            assert_eq!(
                malformed,
                u64::from(ethertype_visible),
                "len {len} tags {tags:?}"
            );
        }
        // The full frame is dropped: the truncation, not the content, made them pass.
        assert_eq!(dp.test_run(&full).unwrap().0, DROP, "tags {tags:?}");
    }
}

#[test]
fn three_tags_and_foreign_protocols_are_not_parsed() {
    testbed::require_root();
    let dp = datapath(true);
    let foreign = Ipv4Addr::new(198, 51, 100, 102);
    let three = ArpSpec::reply(MAC, foreign, [2, 0, 0, 0, 0, 1], PEER)
        .tagged(&[(0x88a8, 1), (0x8100, 2), (0x8100, 3)])
        .to_bytes();
    let mut ipv4 = ArpSpec::reply(MAC, foreign, [2, 0, 0, 0, 0, 1], PEER).to_bytes();
    ipv4[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    for f in [three, ipv4] {
        let before = Snapshot::of_datapath(&dp).unwrap();
        assert_eq!(dp.test_run(&f).unwrap(), (PASS, f.clone()));
        let after = Snapshot::of_datapath(&dp).unwrap();
        assert_eq!(
            after.stats["arp"], before.stats["arp"],
            "not counted as ARP"
        );
        assert_eq!(after.stats["frames"], before.stats["frames"] + 1);
    }
}

/// The census only observes: whatever arrives, it returns "no opinion" and
/// leaves the frame as it was; claims of LB IPs are recorded, the rest not.
#[test]
fn the_census_never_changes_or_stops_a_frame() {
    testbed::require_root();
    let dp = datapath(true);
    let reader = dp.census_reader().unwrap();
    let lb = lb_ips();
    let mut frames: Vec<Vec<u8>> = Vec::new();
    for (ip, ..) in &lb {
        for (_, spec) in frames_for(*ip) {
            for tags in TAGS {
                frames.push(spec.clone().tagged(tags).to_bytes());
            }
        }
    }
    let claims = frames.len();
    // Not claims: another IP, a probe, truncations, another ethertype.
    frames.push(ArpSpec::reply(MAC, PEER, [2, 0, 0, 0, 0, 1], PEER).to_bytes());
    frames.push(ArpSpec::request(MAC, Ipv4Addr::UNSPECIFIED, lb[0].0).to_bytes());
    let full = ArpSpec::gratuitous(1, MAC, lb[0].0).to_bytes();
    // BPF_PROG_TEST_RUN needs at least an Ethernet header; the ARP payload
    // ends at 42 (the frame is padded to 60).
    for cut in 14..42 {
        frames.push(full[..cut].to_vec());
    }
    let mut ip_frame = full.clone();
    ip_frame[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    frames.push(ip_frame);
    for f in &frames {
        let (rc, out) = dp.census_test_run(f).unwrap();
        assert_eq!(rc, PASS, "census verdict on {f:02x?}");
        if f.len() >= 14 {
            assert_eq!(&out, f, "the census changed a frame");
        }
    }
    let table = reader.claims().unwrap();
    // One entry per LB IP (one MAC); every claim counted once.
    assert_eq!(table.len(), lb.len(), "{table:?}");
    assert_eq!(table.iter().map(|c| c.count).sum::<u64>(), claims as u64);
    assert!(table
        .iter()
        .all(|c| c.mac == MAC && c.ifindex == test_run::LO));
}

/// The map writer's per-event path writes the changed LB keys and nothing
/// else (counted in its report), deletes those gone, and keeps the full-map
/// behaviour: an IP that does not fit is reported and counted as not
/// enforced, and gets its entry once a key is freed.
#[test]
fn apply_changes_touches_only_the_changed_keys() {
    use guard::testing::{Datapath, DatapathConfig, LbIp, Provenance, View};
    use guard_common::{LeakAction, Mode, Ownership};
    use std::collections::BTreeSet;
    testbed::require_root();
    let ip =
        |i: u32| std::net::IpAddr::V4(Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 77, 0, 0)) + i));
    let entry = |state| LbIp {
        state,
        source: Provenance::Interface("test".into()),
    };
    let mut dp = Datapath::load(&DatapathConfig {
        mode: Mode::Enforce,
        leak_action: LeakAction::Rewrite,
        max_lb_ips: 1000,
        ..DatapathConfig::default()
    })
    .unwrap();
    let mut view = View::default();
    for i in 0..1000 {
        view.lb.insert(ip(i), entry(Ownership::Foreign));
    }
    let r = dp.apply(&view, false);
    assert_eq!((r.written, r.removed, r.failed.len()), (1000, 0, 0));
    // One changed, one gone, one unchanged named: one write, one delete.
    view.lb.insert(ip(1), entry(Ownership::Owned));
    view.lb.remove(&ip(2));
    let keys = BTreeSet::from([ip(1), ip(2), ip(3)]);
    let r = dp.apply_changes(&view, &keys, false);
    assert_eq!((r.written, r.removed, r.failed.len()), (1, 1, 0));
    assert_eq!(dp.map_state(ip(1)), Some(Ownership::Owned));
    assert_eq!(dp.map_state(ip(2)), None);
    assert_eq!(dp.lb_set().len(), 999);
    // Additive (feed not synced): nothing is deleted.
    view.lb.remove(&ip(4));
    let r = dp.apply_changes(&view, &BTreeSet::from([ip(4)]), true);
    assert_eq!((r.written, r.removed), (0, 0));
    assert_eq!(dp.map_state(ip(4)), Some(Ownership::Foreign));
    let r = dp.apply_changes(&view, &BTreeSet::from([ip(4)]), false);
    assert_eq!((r.written, r.removed), (0, 1));
    // The map is full (998 + 2 = 1000): the third new IP does not fit; it
    // is reported, counted, and passes (not in the LB set).
    for i in [1000, 1001, 1002] {
        view.lb.insert(ip(i), entry(Ownership::Foreign));
    }
    let keys = BTreeSet::from([ip(1000), ip(1001), ip(1002)]);
    let r = dp.apply_changes(&view, &keys, false);
    assert_eq!((r.written, r.full().count()), (2, 1), "{:?}", r.failed);
    assert_eq!(dp.not_enforced(), 1);
    assert_eq!(dp.map_state(ip(1002)), None);
    // One IP leaves in the same change: the one that did not fit gets in.
    view.lb.remove(&ip(5));
    let r = dp.apply_changes(&view, &BTreeSet::from([ip(5), ip(1002)]), false);
    assert_eq!((r.written, r.removed, r.failed.len()), (1, 1, 0));
    assert_eq!(dp.not_enforced(), 0);
    assert_eq!(dp.map_state(ip(1002)), Some(Ownership::Foreign));
    // The full apply of the same view has nothing left to do.
    let r = dp.apply(&view, false);
    assert_eq!((r.written, r.removed, r.failed.len()), (0, 0, 0));
}

/// Misdirected packets: an IPv4 or IPv6 packet addressed to this host for
/// a foreign LB IP is recorded by (LB IP, client MAC), each packet once;
/// one for an owned or unknown LB IP, another address or another host's
/// MAC is not; no frame is changed or stopped; and the census's foreign
/// filter follows a change of state.
#[test]
fn the_census_records_misdirected_packets_and_stops_none() {
    use guard::testing::{LbIp, Provenance};
    use guard_common::Ownership;
    use std::net::{IpAddr, Ipv6Addr};
    testbed::require_root();
    let mut dp = datapath(true);
    let reader = dp.clients_reader().unwrap();
    // lo's MAC (all zero) is this host's in a test run; another is not.
    const HOST: [u8; 6] = [0; 6];
    const OTHER: [u8; 6] = [2, 0, 0, 0, 0, 0x77];
    let peer6: IpAddr = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1).into();
    let lbs: Vec<(IpAddr, Ownership)> = (lb_ips().into_iter())
        .map(|(ip, s, _)| (IpAddr::from(ip), s))
        .chain(
            test_run::lb_ips6()
                .into_iter()
                .map(|(ip, s)| (ip.into(), s)),
        )
        .collect();
    let packet = |mac, dst: IpAddr, port| {
        let src = if dst.is_ipv4() { PEER.into() } else { peer6 };
        testbed::ip_bytes(MAC, mac, src, dst, port)
    };
    let run = |dp: &guard::testing::Datapath, frames: &[Vec<u8>]| {
        for f in frames {
            let (rc, out) = dp
                .census_test_run(f)
                .unwrap_or_else(|e| panic!("{} bytes {f:02x?}: {e}", f.len()));
            assert_eq!(rc, PASS, "census verdict on {f:02x?}");
            assert_eq!(&out, f, "the census changed a frame");
        }
    };
    let mut frames = Vec::new();
    let mut want: BTreeMap<IpAddr, u64> = BTreeMap::new();
    let mut other_host = 0;
    for (ip, state) in &lbs {
        for (mac, port) in [(HOST, Some(80)), (HOST, None), (OTHER, Some(80))] {
            frames.push(packet(mac, *ip, port));
            match (*state == Ownership::Foreign, mac == HOST) {
                (true, true) => *want.entry(*ip).or_default() += 1,
                (true, false) => other_host += 1,
                _ => {}
            }
        }
    }
    // Not LB IPs. (A packet cut before the end of its destination cannot
    // be run: the kernel's test run refuses an IP packet shorter than its
    // header; guard_common's unit tests read such cuts as no destination.)
    frames.push(packet(HOST, PEER.into(), Some(80)));
    frames.push(packet(HOST, PRIMARY.into(), None));
    frames.push(packet(HOST, peer6, Some(80)));
    run(&dp, &frames);
    let table = reader.entries().unwrap();
    let got: BTreeMap<IpAddr, u64> = table.iter().map(|e| (e.ip, e.packets)).collect();
    assert_eq!(got, want, "{table:?}");
    assert!(table
        .iter()
        .all(|e| e.mac == MAC && e.ifindex == test_run::LO));
    assert!(table.iter().all(|e| e.client_ip
        == if e.ip.is_ipv4() {
            IpAddr::from(PEER)
        } else {
            peer6
        }));
    let stats: BTreeMap<&str, u64> = reader.stats().unwrap().into_iter().collect();
    assert_eq!(stats["recorded"], want.values().sum::<u64>());
    assert_eq!(stats["new_client"], want.len() as u64);
    assert_eq!(stats["other_host"], other_host);

    // .102 becomes owned here, .103 foreign: the filter follows.
    let mut view = test_run::view(true);
    let (a, b) = (
        IpAddr::from(Ipv4Addr::new(198, 51, 100, 102)),
        IpAddr::from(Ipv4Addr::new(198, 51, 100, 103)),
    );
    for (ip, state) in [(a, Ownership::Owned), (b, Ownership::Foreign)] {
        let source = Provenance::Interface("test".into());
        view.lb.insert(ip, LbIp { state, source });
    }
    let r = dp.apply_changes(&view, &[a, b].into_iter().collect(), false);
    assert!(r.failed.is_empty(), "{:?}", r.failed);
    run(&dp, &[packet(HOST, a, Some(80)), packet(HOST, b, Some(80))]);
    let got: BTreeMap<IpAddr, u64> = (reader.entries().unwrap().iter())
        .map(|e| (e.ip, e.packets))
        .collect();
    assert_eq!(got.get(&a), want.get(&a), "owned now: not recorded");
    assert_eq!(got.get(&b), Some(&1), "foreign now: recorded");
}
