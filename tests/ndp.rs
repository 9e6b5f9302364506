//! IPv6 Neighbor Discovery against the real kernel: first what the kernel
//! itself does (the measurement the kernel-origin rule rests on), then the
//! guard, run with the DaemonSet's capabilities on a node namespace's
//! uplink, with advertisements from the node's kernel, from a speaker's
//! AF_PACKET socket and from a raw ICMPv6 socket (as mdlayher/ndp sends
//! them), asserting what the neighbour receives and caches.

use std::{net::Ipv6Addr, time::Duration};

use guard_common::ndp_build::NdSpec;
use testbed::{
    bed6::{
        adverts_for, wait_advert, Bed6, FOREIGN6, FOREIGN6_ON_EGRESS, OWNED6, OWNER_MAC, UNKNOWN6,
        UNKNOWN6_ON_EGRESS,
    },
    nd_bytes, Netns, RawSocket,
};

const ARRIVE: Duration = Duration::from_secs(2);
const QUIET: Duration = Duration::from_millis(600);

/// Proxy NDP for `ip` on the node's eth0 (what an operator or a speaker
/// configures to have the kernel answer for an address it does not hold there).
fn proxy(node: &Netns, ip: Ipv6Addr) {
    node.sysctl("net.ipv6.conf.eth0.forwarding", "1").unwrap();
    node.sysctl("net.ipv6.conf.eth0.proxy_ndp", "1").unwrap();
    let ip = ip.to_string();
    node.ip(&["-6", "neigh", "add", "proxy", &ip, "dev", "eth0"])
        .unwrap();
}

/// Whether the node's kernel answers the peer's solicitation for `target`.
fn kernel_answers(bed: &Bed6, target: Ipv6Addr) -> bool {
    let tx = RawSocket::open(&bed.peer, "eth0").unwrap();
    let cap = RawSocket::open(&bed.peer, "eth0").unwrap();
    cap.drain();
    tx.send(&bed.solicit_from_peer(target)).unwrap();
    wait_advert(&cap, target, ARRIVE).unwrap().is_some()
}

#[test]
fn the_kernel_answers_only_for_the_receiving_interface_or_a_proxy_entry() {
    testbed::require_root();
    let bed = Bed6::new("ndk").unwrap();
    assert!(
        kernel_answers(&bed, UNKNOWN6_ON_EGRESS),
        "an address on eth0 is answered (the test can see an answer)"
    );
    for ip in [FOREIGN6, UNKNOWN6] {
        assert!(
            !kernel_answers(&bed, ip),
            "{ip} on kube-ipvs0: the kernel does not answer on eth0 (ARP would)"
        );
    }
    proxy(&bed.node, UNKNOWN6);
    assert!(
        kernel_answers(&bed, UNKNOWN6),
        "a proxy entry makes the kernel answer for an address off eth0"
    );
}

#[test]
fn kernel_adverts_follow_the_measured_rule() {
    testbed::require_root();
    let bed = Bed6::new("ndr").unwrap();
    let _guard = bed.start(&[]).unwrap();
    assert!(
        kernel_answers(&bed, UNKNOWN6_ON_EGRESS),
        "unknown, on eth0: passes"
    );
    assert!(
        !kernel_answers(&bed, FOREIGN6_ON_EGRESS),
        "foreign, on eth0: dropped"
    );
    let dropped = bed
        .packets(FOREIGN6_ON_EGRESS, "na_solicited", "kernel", "dropped")
        .unwrap();
    assert!(dropped >= 1, "counted as the kernel's, dropped");
    // Off the egress interface the kernel answers only through a proxy
    // entry (measured above): a deliberate announcement, judged like a
    // speaker's: unknown passes, foreign is dropped.
    proxy(&bed.node, UNKNOWN6);
    proxy(&bed.node, FOREIGN6);
    assert!(kernel_answers(&bed, UNKNOWN6), "unknown, proxied: passes");
    assert!(!kernel_answers(&bed, FOREIGN6), "foreign, proxied: dropped");
    let dropped = bed
        .packets(FOREIGN6, "na_solicited", "kernel", "dropped")
        .unwrap();
    assert!(dropped >= 1, "the proxied answer was made, and dropped");
    let passed = bed
        .packets(UNKNOWN6, "na_solicited", "kernel", "passed")
        .unwrap();
    assert!(passed >= 1);
}

/// The speaker (the node's AF_PACKET socket) tells the segment `ip` is at
/// the node's MAC; returns whether the kernel let the frame out and what
/// the peer then caches for `ip` (it knew OWNER_MAC before).
fn speaker_override(bed: &Bed6, speaker: &RawSocket, ip: Ipv6Addr) -> (bool, Option<[u8; 6]>) {
    bed.peer_knows(ip, OWNER_MAC).unwrap();
    let sent = speaker
        .send(&nd_bytes(&NdSpec::unsolicited(bed.node_mac, ip.octets())))
        .unwrap();
    let want = Some(bed.node_mac);
    let learned = testbed::wait_for(ARRIVE, || {
        (bed.peer_entry(ip).unwrap() == want).then_some(())
    });
    if learned.is_none() {
        std::thread::sleep(QUIET);
    }
    (sent, bed.peer_entry(ip).unwrap())
}

#[test]
fn a_foreign_speakers_advert_is_dropped_and_the_neighbour_keeps_the_owner() {
    testbed::require_root();
    let bed = Bed6::new("nds").unwrap();
    let speaker = RawSocket::open(&bed.node, "eth0").unwrap();
    // Without the guard the override advertisement takes the peer over.
    let (_, before) = speaker_override(&bed, &speaker, FOREIGN6);
    assert_eq!(
        before,
        Some(bed.node_mac),
        "unguarded, the neighbour is poisoned"
    );
    let guard = bed.start(&[]).unwrap();
    let (sent, after) = speaker_override(&bed, &speaker, FOREIGN6);
    assert!(!sent, "dropped at egress (ENOBUFS)");
    assert_eq!(
        after,
        Some(OWNER_MAC),
        "the neighbour keeps the owner's MAC"
    );
    assert!(
        bed.packets(FOREIGN6, "na_unsolicited", "speaker", "dropped")
            .unwrap()
            >= 1
    );
    let line = guard.expect_log("announcement stopped", ARRIVE);
    assert!(
        line.contains("ipv6") && line.contains(&FOREIGN6.to_string()),
        "{line}"
    );
    // The owner's, and an unknown IP's (a live speaker is the best
    // authority), pass and are learned.
    for ip in [OWNED6, UNKNOWN6] {
        let (sent, entry) = speaker_override(&bed, &speaker, ip);
        assert!(sent, "{ip}");
        assert_eq!(entry, Some(bed.node_mac), "{ip} learned");
    }
    // A raw ICMPv6 socket bound to the interface (mdlayher/ndp, used by
    // MetalLB and kube-vip) is a speaker too.
    let cap = RawSocket::open(&bed.peer, "eth0").unwrap();
    cap.drain();
    icmp6_override(&bed.node, "eth0", FOREIGN6, bed.node_mac);
    assert!(adverts_for(&cap, FOREIGN6, QUIET).unwrap().is_empty());
    assert!(
        testbed::wait_until(ARRIVE, || bed
            .packets(FOREIGN6, "na_unsolicited", "speaker", "dropped")
            .unwrap()
            >= 2),
        "the raw ICMPv6 speaker's advert is counted as a speaker's"
    );
}

#[test]
fn monitor_mode_changes_nothing_and_counts() {
    testbed::require_root();
    let bed = Bed6::new("ndm").unwrap();
    let speaker = RawSocket::open(&bed.node, "eth0").unwrap();
    let _guard = bed.start(&["--mode", "monitor"]).unwrap();
    let (sent, entry) = speaker_override(&bed, &speaker, FOREIGN6);
    assert!(sent);
    assert_eq!(entry, Some(bed.node_mac));
    let would = bed
        .packets(FOREIGN6, "na_unsolicited", "speaker", "would_drop")
        .unwrap();
    assert!(would >= 1);
    // An IPv6 address kube-proxy adds to kube-ipvs0 (--lb-ips-from) becomes
    // an LB IP with no owner known, in the map within moments.
    let added = "fd00:1::106";
    let dev = [
        "-6",
        "addr",
        "add",
        &format!("{added}/128"),
        "dev",
        "kube-ipvs0",
        "nodad",
    ];
    bed.node.ip(&dev).unwrap();
    let bin = testbed::guard_binary();
    let row = testbed::wait_for(ARRIVE, || {
        let out = bed
            .node
            .exec(&[bin.to_str().unwrap(), "status", "-o", "json"])
            .ok()?;
        let v: serde_json::Value = serde_json::from_str(&out).ok()?;
        v["ips"]
            .as_array()?
            .iter()
            .find(|r| r["ip"] == added)
            .cloned()
    })
    .expect("the address on kube-ipvs0 is an LB IP");
    assert_eq!(
        (&row["family"], &row["state"]),
        (&"ipv6".into(), &"unknown".into()),
        "{row}"
    );
    assert!(
        row["source"].as_str().unwrap().contains("kube-ipvs0"),
        "{row}"
    );
}

#[test]
fn tagged_adverts_are_judged_and_malformed_icmpv6_passes_byte_for_byte() {
    testbed::require_root();
    let bed = Bed6::new("ndt").unwrap();
    let speaker = RawSocket::open(&bed.node, "eth0").unwrap();
    let cap = RawSocket::open(&bed.peer, "eth0").unwrap();
    let _guard = bed.start(&[]).unwrap();
    let tagged = |ip: Ipv6Addr| NdSpec {
        tags: [Some((0x8100, 100)), None],
        ..NdSpec::unsolicited(bed.node_mac, ip.octets())
    };
    cap.drain();
    assert!(!speaker.send(&nd_bytes(&tagged(FOREIGN6))).unwrap());
    assert!(adverts_for(&cap, FOREIGN6, QUIET).unwrap().is_empty());
    let owned = nd_bytes(&tagged(OWNED6));
    assert!(speaker.send(&owned).unwrap());
    let got = wait_advert(&cap, OWNED6, ARRIVE).unwrap();
    // The peer's veth takes the tag into the skb's metadata on receipt.
    let untagged: Vec<u8> = [&owned[..12], &owned[16..]].concat();
    assert_eq!(got, Some(untagged), "the owner's tagged advert, unchanged");
    // Broken the ways a receiver would notice: each passes, unchanged, and
    // is counted as malformed.
    let unsolicited = NdSpec::unsolicited(bed.node_mac, FOREIGN6.octets());
    let mut zero_option = nd_bytes(&NdSpec::solicit(
        bed.node_mac,
        FOREIGN6.octets(),
        OWNED6.octets(),
    ));
    zero_option[14 + 40 + 25] = 0;
    let mut cut = nd_bytes(&unsolicited);
    cut.truncate(14 + 40 + 12);
    let broken = [
        nd_bytes(&NdSpec {
            hop_limit: 64,
            ..unsolicited
        }),
        zero_option,
        cut,
    ];
    let before = bed.total("ndp_malformed").unwrap();
    for f in &broken {
        cap.drain();
        assert!(speaker.send(f).unwrap(), "{f:02x?}");
        let same = testbed::wait_for(ARRIVE, || {
            cap.recv_raw(ARRIVE).ok().flatten().filter(|g| g == f)
        });
        assert!(same.is_some(), "arrived byte for byte: {f:02x?}");
    }
    assert_eq!(
        bed.total("ndp_malformed").unwrap() - before,
        broken.len() as u64
    );
    // More extension headers than the parser follows: a receiver may still
    // accept it, so this is the fail-open limit, passed and counted apart.
    let deep = nd_bytes(&NdSpec {
        ext_headers: 5,
        ..unsolicited
    });
    let before = bed.total("ipv6_unfollowed").unwrap();
    cap.drain();
    assert!(speaker.send(&deep).unwrap());
    let same = testbed::wait_for(ARRIVE, || {
        cap.recv_raw(ARRIVE).ok().flatten().filter(|g| *g == deep)
    });
    assert!(same.is_some(), "arrived byte for byte");
    assert_eq!(bed.total("ipv6_unfollowed").unwrap() - before, 1);
}

/// An unsolicited override advertisement for `target` from a raw ICMPv6
/// socket bound to `iface` in `ns` (the kernel fills in the checksum).
fn icmp6_override(ns: &Netns, iface: &str, target: Ipv6Addr, mac: [u8; 6]) {
    let iface = iface.to_owned();
    ns.enter(move || {
        let mut msg = vec![136u8, 0, 0, 0, 0x20, 0, 0, 0];
        msg.extend_from_slice(&target.octets());
        msg.extend_from_slice(&[2, 1]);
        msg.extend_from_slice(&mac);
        let name = std::ffi::CString::new(iface)?;
        // SAFETY: plain socket syscalls on a socket this closure owns, with
        // buffers that outlive each call; every result is checked.
        unsafe {
            let fd = libc::socket(libc::AF_INET6, libc::SOCK_RAW, libc::IPPROTO_ICMPV6);
            anyhow::ensure!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
            let fd = std::os::fd::OwnedFd::from_raw_fd(fd);
            use std::os::fd::{AsRawFd as _, FromRawFd as _};
            let bytes = name.as_bytes_with_nul();
            let r = libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_BINDTODEVICE,
                bytes.as_ptr().cast(),
                bytes.len() as u32,
            );
            anyhow::ensure!(
                r == 0,
                "SO_BINDTODEVICE: {}",
                std::io::Error::last_os_error()
            );
            let hops: libc::c_int = 255;
            let r = libc::setsockopt(
                fd.as_raw_fd(),
                libc::IPPROTO_IPV6,
                libc::IPV6_MULTICAST_HOPS,
                (&hops as *const libc::c_int).cast(),
                4,
            );
            anyhow::ensure!(
                r == 0,
                "IPV6_MULTICAST_HOPS: {}",
                std::io::Error::last_os_error()
            );
            let mut sa: libc::sockaddr_in6 = std::mem::zeroed();
            sa.sin6_family = libc::AF_INET6 as u16;
            sa.sin6_addr.s6_addr = guard_common::ndp_build::ALL_NODES;
            sa.sin6_scope_id = libc::if_nametoindex(name.as_ptr());
            let n = libc::sendto(
                fd.as_raw_fd(),
                msg.as_ptr().cast(),
                msg.len(),
                0,
                (&sa as *const libc::sockaddr_in6).cast(),
                std::mem::size_of::<libc::sockaddr_in6>() as u32,
            );
            // A drop at egress may or may not reach sendto's result.
            let _ = n;
        }
        Ok(())
    })
    .unwrap();
}
