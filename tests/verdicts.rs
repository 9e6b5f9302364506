//! Every row of the verdict table, against the real kernel: the real daemon
//! loads the real program on a node namespace's uplink, frames are produced
//! the way they are in the field (the node's kernel ARP stack, or a speaker's
//! AF_PACKET socket), and we assert what the neighbour receives and caches.
//!
//! Expected outcomes are written out by hand from the specification.

#[path = "fixture_responder.rs"]
mod fixture_responder;

use std::{net::Ipv4Addr, time::Duration};

use testbed::{
    bed::{
        Bed, FOREIGN, FOREIGN_ON_EGRESS, NODE_IP, OWNED, OWNED_ON_EGRESS, PEER_IP, UNKNOWN,
        UNKNOWN_ON_EGRESS,
    },
    wait_until, ArpSpec, Captured, Daemon, RawSocket,
};

/// How long a frame that should arrive may take.
const ARRIVE: Duration = Duration::from_secs(3);
/// How long frames that should arrive may take all together on a slow
/// machine (the VM lane's emulated CPUs): a deadline, not an expectation.
const SLOW_ARRIVE: Duration = Duration::from_secs(20);
/// How long we listen for a frame that must not arrive. The counters then
/// confirm that the guard saw and stopped it (not merely that it was late).
const QUIET: Duration = Duration::from_millis(400);

#[derive(Debug, Clone, Copy, PartialEq)]
enum Expect {
    Pass,
    Drop,
    /// Arrives with SPA replaced by the node's primary IPv4.
    Rewrite,
}
use Expect::*;

/// The set-up every case shares: the bed, its daemon guarding the node's
/// eth0 (the usual arguments, then `extra`).
fn guarded(tag: &str, extra: &[&str]) -> (Bed, Daemon) {
    testbed::require_root();
    let bed = Bed::new(tag).unwrap();
    let daemon = bed.start(extra).unwrap();
    (bed, daemon)
}

/// What the neighbour's eth0 receives.
fn capture(bed: &Bed) -> RawSocket {
    RawSocket::open(&bed.peer, "eth0").unwrap()
}

/// A speaker's socket on the node's eth0 (frames with a socket, as from
/// MetalLB or kube-vip), and the neighbour's capture.
fn speaker_and_capture(bed: &Bed) -> (RawSocket, RawSocket) {
    (RawSocket::open(&bed.node, "eth0").unwrap(), capture(bed))
}

/// The counters hold `n` packets of `origin` for each (LB IP, kind,
/// verdict, n) of `want`.
fn assert_counted(bed: &Bed, origin: &str, want: &[(Ipv4Addr, &str, &str, u64)]) {
    for &(ip, kind, verdict, n) in want {
        assert_eq!(
            bed.packets(ip, kind, origin, verdict).unwrap(),
            n,
            "{ip} {kind} {origin} {verdict}"
        );
    }
}

/// Send `spec` from the node's speaker socket; check what the peer gets.
fn speaker_case(speaker: &RawSocket, cap: &RawSocket, spec: &ArpSpec, expect: Expect) {
    cap.drain();
    let accepted = speaker.send(&spec.to_bytes()).unwrap();
    // A frame dropped at egress fails the speaker's sendto with ENOBUFS.
    assert_eq!(accepted, expect != Drop, "sendto result for {spec:?}");
    let want_spa = if expect == Rewrite { NODE_IP } else { spec.spa };
    let matches = |c: &Captured| {
        c.sha == spec.sha && c.op == spec.op && c.tpa == spec.tpa && c.tha == spec.tha
    };
    match expect {
        Pass | Rewrite => {
            let got = cap
                .wait_arp(ARRIVE, |c| matches(c) && c.spa == want_spa)
                .unwrap();
            assert!(
                got.is_some(),
                "expected {expect:?} for {spec:?}, nothing arrived"
            );
        }
        Drop => {
            let got: Vec<_> = cap
                .collect_arp(QUIET)
                .unwrap()
                .into_iter()
                .filter(|c| matches(c))
                .collect();
            assert!(
                got.is_empty(),
                "expected drop for {spec:?}, peer got {got:?}"
            );
        }
    }
}

#[test]
fn speaker_frames_follow_the_table() {
    let (bed, _guard) = guarded("spk", &[]);
    let (speaker, cap) = speaker_and_capture(&bed);
    let mac = bed.node_mac;
    #[rustfmt::skip]
    let table = [
        // LB IP, reply, gratuitous op1, gratuitous op2, announce leak
        (OWNED,   [Pass, Pass, Pass, Pass]),
        (FOREIGN, [Drop, Drop, Drop, Rewrite]),
        (UNKNOWN, [Pass, Pass, Pass, Pass]),
        (UNKNOWN_ON_EGRESS, [Pass, Pass, Pass, Pass]),
        (FOREIGN_ON_EGRESS, [Drop, Drop, Drop, Rewrite]),
    ];
    for (ip, expects) in table {
        let frames = [
            ArpSpec::reply(mac, ip, bed.peer_mac, PEER_IP),
            ArpSpec::gratuitous(1, mac, ip),
            ArpSpec::gratuitous(2, mac, ip),
            ArpSpec::request(mac, ip, PEER_IP),
        ];
        for (spec, expect) in frames.iter().zip(expects) {
            speaker_case(&speaker, &cap, spec, expect);
        }
    }
    // The counters name each decision with origin "speaker".
    #[rustfmt::skip]
    let counted = [
        (FOREIGN, "reply", "dropped", 1),
        (FOREIGN, "gratuitous", "dropped", 2),
        (FOREIGN, "announce_leak", "rewritten", 1),
        (UNKNOWN, "reply", "passed", 1),
        (OWNED, "gratuitous", "passed", 2),
    ];
    assert_counted(&bed, "speaker", &counted);
}

#[test]
fn kernel_replies_follow_the_table() {
    let (bed, _guard) = guarded("krep", &[]);
    #[rustfmt::skip]
    let table = [
        (OWNED, Pass),
        (FOREIGN, Drop),
        (UNKNOWN, Drop),
        (UNKNOWN_ON_EGRESS, Pass),
        (FOREIGN_ON_EGRESS, Drop),
        (OWNED_ON_EGRESS, Pass),
    ];
    bed.peer.flush_neigh("eth0").unwrap();
    for (ip, _) in table {
        bed.peer.poke(&ip.to_string()).unwrap();
    }
    let node_mac = bed.node_mac;
    for (ip, expect) in table {
        let cached = testbed::wait_for(ARRIVE, || {
            bed.peer.cached_mac("eth0", &ip.to_string()).unwrap()
        });
        match expect {
            Pass => assert_eq!(
                cached,
                Some(node_mac),
                "{ip}: the neighbour should have learned the node's MAC"
            ),
            _ => assert_eq!(
                cached, None,
                "{ip}: the neighbour must not learn the node's MAC"
            ),
        }
        let verdict = if expect == Pass { "passed" } else { "dropped" };
        let n = bed.packets(ip, "reply", "kernel", verdict).unwrap();
        assert!(
            n >= 1,
            "{ip}: expected a kernel reply counted as {verdict}, got {n}"
        );
    }
}

#[test]
fn kernel_gratuitous_follows_the_table() {
    let (bed, _guard) = guarded("kgarp", &[]);
    let cap = capture(&bed);
    // arp_notify=1: the kernel announces every address on eth0 when its MAC changes.
    bed.node
        .sysctl("net.ipv4.conf.eth0.arp_notify", "1")
        .unwrap();
    cap.drain();
    bed.node
        .ip(&["link", "set", "eth0", "address", "02:00:5e:00:53:01"])
        .unwrap();
    let mut frames = cap.collect_arp(Duration::from_millis(1500)).unwrap();
    let in_frames = |frames: &[Captured], ip: Ipv4Addr| {
        frames
            .iter()
            .any(|c| c.spa == ip && c.tpa == ip && c.sha == [2, 0, 0x5e, 0, 0x53, 1])
    };
    // On a slow machine (the VM lane's emulated CPUs) the announcements may
    // take longer than that window: the ones that must pass are awaited.
    wait_until(SLOW_ARRIVE, || {
        let all = [NODE_IP, UNKNOWN_ON_EGRESS, OWNED_ON_EGRESS]
            .iter()
            .all(|ip| in_frames(&frames, *ip));
        if !all {
            frames.extend(cap.collect_arp(Duration::from_millis(100)).unwrap());
        }
        all
    });
    let announced = |ip: Ipv4Addr| in_frames(&frames, ip);
    assert!(
        announced(NODE_IP),
        "the node's own address is not an LB IP and must pass: {frames:?}"
    );
    assert!(
        announced(UNKNOWN_ON_EGRESS),
        "unknown but on the egress interface must pass"
    );
    assert!(announced(OWNED_ON_EGRESS), "owned must pass");
    assert!(
        !announced(FOREIGN_ON_EGRESS),
        "foreign must be dropped: {frames:?}"
    );
    assert!(
        bed.packets(FOREIGN_ON_EGRESS, "gratuitous", "kernel", "dropped")
            .unwrap()
            >= 1
    );
    assert!(
        bed.packets(UNKNOWN_ON_EGRESS, "gratuitous", "kernel", "passed")
            .unwrap()
            >= 1
    );
}

#[test]
fn kernel_announce_leaks_follow_the_table() {
    let (bed, _guard) = guarded("kleak", &[]);
    let cap = capture(&bed);
    #[rustfmt::skip]
    let table = [
        (OWNED, Pass),
        (FOREIGN, Rewrite),
        (UNKNOWN, Rewrite),
        (UNKNOWN_ON_EGRESS, Pass),
        (FOREIGN_ON_EGRESS, Rewrite),
    ];
    for (ip, expect) in table {
        bed.peer.flush_neigh("eth0").unwrap();
        cap.drain();
        // A packet from the LB IP to the neighbour: with arp_announce=0 the
        // kernel's ARP request for the neighbour carries the LB IP as SPA.
        // (Poked again while nothing comes, each time on a flushed entry: on
        // a slow machine, the VM lane's, a resolution of the node's own can
        // start first, take the pokes into its queue and resolve the
        // neighbour with its own request, after which no poke would send
        // one. The 6.1 lane saw only SPA 198.51.100.11 for a whole wait.)
        // The node's own requests (SPA its address, from a resolution of
        // its own) may come too: a pass is the LB IP's request arriving, a
        // rewrite is a request with the node's address that the guard
        // counts as rewritten, and the LB IP never arriving as SPA.
        let want_spa = if expect == Rewrite { NODE_IP } else { ip };
        let mut seen = Vec::new();
        let got = testbed::wait_for(SLOW_ARRIVE, || {
            bed.node.flush_neigh("eth0").unwrap();
            bed.node
                .poke_from(&ip.to_string(), &PEER_IP.to_string())
                .unwrap();
            let c = cap
                .wait_arp(ARRIVE, |c| {
                    c.op == 1 && c.tpa == PEER_IP && c.sha == bed.node_mac
                })
                .unwrap()?;
            seen.push(c.spa);
            let counted = expect != Rewrite
                || bed
                    .packets(ip, "announce_leak", "kernel", "rewritten")
                    .unwrap()
                    >= 1;
            (c.spa == want_spa && counted).then_some(c)
        });
        assert!(
            got.is_some(),
            "{ip}: no ARP request with SPA {want_spa} arrived (saw SPAs {seen:?})"
        );
        if expect == Rewrite {
            assert!(
                !seen.contains(&ip),
                "{ip}: the LB IP left as SPA (saw SPAs {seen:?})"
            );
        }
        // What the neighbour learned from it (give its kernel time to process).
        std::thread::sleep(QUIET);
        let learned = bed.peer.cached_mac("eth0", &ip.to_string()).unwrap();
        if expect == Rewrite {
            assert_eq!(
                learned, None,
                "{ip}: the neighbour must not learn the LB IP from a rewritten request"
            );
            assert!(
                bed.packets(ip, "announce_leak", "kernel", "rewritten")
                    .unwrap()
                    >= 1
            );
        } else {
            let learned = testbed::wait_for(ARRIVE, || {
                bed.peer.cached_mac("eth0", &ip.to_string()).unwrap()
            });
            assert_eq!(
                learned,
                Some(bed.node_mac),
                "{ip}: an allowed announcement teaches the neighbour"
            );
        }
    }
}

#[test]
fn leak_action_drop_drops_leaks() {
    let (bed, _guard) = guarded("ldrop", &["--leak-action", "drop"]);
    let cap = capture(&bed);
    cap.drain();
    bed.node
        .poke_from(&FOREIGN.to_string(), &PEER_IP.to_string())
        .unwrap();
    let got: Vec<_> = cap
        .collect_arp(Duration::from_millis(1200))
        .unwrap()
        .into_iter()
        .filter(|c| c.op == 1 && c.tpa == PEER_IP)
        .collect();
    assert!(
        got.is_empty(),
        "with --leak-action drop nothing may reach the neighbour: {got:?}"
    );
    assert!(
        bed.packets(FOREIGN, "announce_leak", "kernel", "dropped")
            .unwrap()
            >= 1
    );
}

#[test]
fn monitor_mode_counts_and_passes() {
    let (bed, _guard) = guarded("mon", &["--mode", "monitor"]);
    // A kernel reply that enforce would drop reaches the neighbour.
    bed.peer.flush_neigh("eth0").unwrap();
    bed.peer.poke(&FOREIGN.to_string()).unwrap();
    let cached = testbed::wait_for(ARRIVE, || {
        bed.peer.cached_mac("eth0", &FOREIGN.to_string()).unwrap()
    });
    assert_eq!(cached, Some(bed.node_mac));
    assert!(
        bed.packets(FOREIGN, "reply", "kernel", "would_drop")
            .unwrap()
            >= 1
    );
    assert_eq!(
        bed.packets(FOREIGN, "reply", "kernel", "dropped").unwrap(),
        0
    );
    // A speaker's leak is not rewritten, only counted.
    let (speaker, cap) = speaker_and_capture(&bed);
    speaker_case(
        &speaker,
        &cap,
        &ArpSpec::request(bed.node_mac, FOREIGN, PEER_IP),
        Pass,
    );
    speaker_case(
        &speaker,
        &cap,
        &ArpSpec::gratuitous(2, bed.node_mac, FOREIGN),
        Pass,
    );
    #[rustfmt::skip]
    let counted = [
        (FOREIGN, "announce_leak", "would_rewrite", 1),
        (FOREIGN, "gratuitous", "would_drop", 1),
    ];
    assert_counted(&bed, "speaker", &counted);
}

#[test]
fn tagged_frames_are_judged_like_untagged() {
    let (bed, _guard) = guarded("vlan", &[]);
    let (speaker, cap) = speaker_and_capture(&bed);
    let tags: [&[(u16, u16)]; 3] = [
        &[(0x8100, 7)],
        &[(0x88a8, 100)],
        &[(0x88a8, 100), (0x8100, 7)],
    ];
    for t in tags {
        speaker_case(
            &speaker,
            &cap,
            &ArpSpec::reply(bed.node_mac, FOREIGN, bed.peer_mac, PEER_IP).tagged(t),
            Drop,
        );
        speaker_case(
            &speaker,
            &cap,
            &ArpSpec::gratuitous(1, bed.node_mac, FOREIGN).tagged(t),
            Drop,
        );
        speaker_case(
            &speaker,
            &cap,
            &ArpSpec::reply(bed.node_mac, OWNED, bed.peer_mac, PEER_IP).tagged(t),
            Pass,
        );
        speaker_case(
            &speaker,
            &cap,
            &ArpSpec::request(bed.node_mac, FOREIGN, PEER_IP).tagged(t),
            Rewrite,
        );
    }
    #[rustfmt::skip]
    let counted = [
        (FOREIGN, "reply", "dropped", 3),
        (FOREIGN, "gratuitous", "dropped", 3),
        (FOREIGN, "announce_leak", "rewritten", 3),
        (OWNED, "reply", "passed", 3),
    ];
    assert_counted(&bed, "speaker", &counted);
}

#[test]
fn malformed_and_other_frames_pass_untouched() {
    let (bed, _guard) = guarded("malf", &[]);
    let (speaker, cap) = speaker_and_capture(&bed);
    let good = ArpSpec::reply(bed.node_mac, FOREIGN, bed.peer_mac, PEER_IP).to_bytes();
    let mut cases: Vec<(&str, Vec<u8>)> = vec![];
    cases.push(("truncated ARP", good[..34].to_vec()));
    let mut htype = good.clone();
    htype[15] = 6; // IEEE 802 hardware type
    cases.push(("htype 6", htype));
    let mut op = good.clone();
    op[21] = 3; // RARP request
    cases.push(("opcode 3", op));
    let mut plen = good.clone();
    plen[19] = 16;
    cases.push(("plen 16", plen));
    let mut other = good.clone();
    other[12..14].copy_from_slice(&0x88b5u16.to_be_bytes()); // local experimental ethertype
    cases.push(("non-ARP", other));
    let malformed_before = bed.total("malformed").unwrap();
    cap.drain();
    for (name, f) in &cases {
        assert!(speaker.send(f).unwrap(), "{name}: sendto must succeed");
    }
    // Every case is awaited (not assumed to be in after a fixed window, which an
    // emulated CPU may not meet); then each must be there byte for byte.
    let mut got = cap.collect(Duration::from_millis(800)).unwrap();
    wait_until(SLOW_ARRIVE, || {
        let all = cases.iter().all(|(_, f)| got.iter().any(|g| g == f));
        if !all {
            got.extend(cap.collect(Duration::from_millis(100)).unwrap());
        }
        all
    });
    for (name, f) in &cases {
        assert!(
            got.iter().any(|g| g == f),
            "{name}: must reach the neighbour byte for byte"
        );
    }
    assert_eq!(bed.total("malformed").unwrap() - malformed_before, 4);
    assert_eq!(
        bed.packets(FOREIGN, "reply", "speaker", "dropped").unwrap(),
        0
    );
    // And the intact frame is still dropped.
    speaker_case(
        &speaker,
        &cap,
        &ArpSpec::reply(bed.node_mac, FOREIGN, bed.peer_mac, PEER_IP),
        Drop,
    );
}

/// A VLAN device or VLAN-filtering bridge above the uplink hands frames to
/// eth0 with the tag in skb metadata (vlan_present) and the data untagged.
/// This kernel has neither, so a fixture program placed first in eth0's TCX
/// chain pushes the tag into metadata; the guard (last in the chain) must
/// judge those frames exactly like untagged ones.
#[test]
fn vlan_tag_in_metadata_is_judged_like_untagged() {
    use aya::programs::{SchedClassifier, TcAttachType};
    let (bed, _guard) = guarded("vmeta", &[]);
    // Attach the fixture from a thread inside the node's namespace; the link
    // lives as long as the returned object.
    let _fixture = bed
        .node
        .enter(|| {
            let mut ebpf = aya::Ebpf::load(guard::testing::FIXTURES)?;
            let prog: &mut SchedClassifier =
                ebpf.program_mut("fixture_vlan_meta").unwrap().try_into()?;
            prog.load()?;
            testbed::tc::attach_fixture(
                prog,
                "eth0",
                TcAttachType::Egress,
                testbed::tc::Position::First,
            )?;
            Ok(ebpf)
        })
        .unwrap();
    let peer = capture(&bed);
    let before = bed.total("arp_vlan_in_metadata").unwrap();
    for (ip, expect) in [
        (FOREIGN, Drop),
        (OWNED, Pass),
        (UNKNOWN, Drop),
        (UNKNOWN_ON_EGRESS, Pass),
    ] {
        peer.drain();
        // The neighbour asks; the node's kernel answers through eth0.
        assert!(peer
            .send(&ArpSpec::request(bed.peer_mac, PEER_IP, ip).to_bytes())
            .unwrap());
        let answer = |c: &Captured| c.op == 2 && c.spa == ip && c.tpa == PEER_IP;
        match expect {
            Pass => assert!(
                peer.wait_arp(ARRIVE, answer).unwrap().is_some(),
                "{ip}: the reply must arrive"
            ),
            _ => assert!(
                peer.collect_arp(QUIET).unwrap().iter().all(|c| !answer(c)),
                "{ip}: the reply must be dropped"
            ),
        }
    }
    assert!(bed.packets(FOREIGN, "reply", "kernel", "dropped").unwrap() >= 1);
    assert!(bed.packets(UNKNOWN, "reply", "kernel", "dropped").unwrap() >= 1);
    assert!(bed.packets(OWNED, "reply", "kernel", "passed").unwrap() >= 1);
    let tagged = bed.total("arp_vlan_in_metadata").unwrap() - before;
    assert!(
        tagged >= 4,
        "the replies reached the guard with their tag in metadata ({tagged} counted)"
    );
}

/// Cilium's L2 responder answers ARP from its TC ingress program: it turns
/// the request into a reply in place and redirects it out of the same
/// device. Such a reply reaches egress with no socket but with the device it
/// came in on (`ingress_ifindex`): origin `redirect`, judged like a speaker
/// (it gates itself), so `unknown` passes where a kernel reply would not.
#[test]
fn datapath_responder_replies_are_judged_like_speakers() {
    let (bed, _guard) = guarded("redir", &[]);
    const RESPONDER_MAC: [u8; 6] = [0x02, 0, 0x5e, 0, 0x53, 0xaa];
    let _fixture = fixture_responder::attach(
        &bed.node,
        "eth0",
        vec![OWNED, FOREIGN, UNKNOWN],
        RESPONDER_MAC,
        true,
    );
    // The neighbour's kernel asks (a request with no socket, as from a real host).
    bed.peer.flush_neigh("eth0").unwrap();
    for ip in [OWNED, FOREIGN, UNKNOWN] {
        bed.peer.poke(&ip.to_string()).unwrap();
    }
    for (ip, expect) in [(OWNED, Pass), (FOREIGN, Drop), (UNKNOWN, Pass)] {
        let cached = testbed::wait_for(ARRIVE, || {
            bed.peer.cached_mac("eth0", &ip.to_string()).unwrap()
        });
        let want = (expect == Pass).then_some(RESPONDER_MAC);
        assert_eq!(cached, want, "{ip}: what the neighbour learned");
    }
    // (The neighbour's kernel may ask more than once.)
    assert!(bed.packets(OWNED, "reply", "redirect", "passed").unwrap() >= 1);
    assert!(
        bed.packets(FOREIGN, "reply", "redirect", "dropped")
            .unwrap()
            >= 1
    );
    assert!(bed.packets(UNKNOWN, "reply", "redirect", "passed").unwrap() >= 1);
    // None of them was taken for the kernel's own reply.
    for ip in [OWNED, FOREIGN, UNKNOWN] {
        for v in ["passed", "dropped"] {
            assert_eq!(
                bed.packets(ip, "reply", "kernel", v).unwrap(),
                0,
                "{ip} {v}"
            );
        }
    }
}
