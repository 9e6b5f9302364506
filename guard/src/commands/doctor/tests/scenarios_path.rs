//! The path back: forwarding, rp_filter against routes, the LAN interface, the kernel; unknowns.

use super::*;

#[test]
fn rp_filter_against_the_route_back() {
    let t = tree();
    t.conf("eth0", "rp_filter", "1");
    let f = facts(&t, addrs(&[]), no_guard());
    // A client behind eth1's gateway: strict filtering on eth0 drops it.
    let c = run_checks(&f, &plan(&["eth0"], &["203.0.113.200"]));
    let rp = find(&c, "rp_filter", Some("eth0"));
    assert_eq!(rp.status, CheckStatus::Fail, "{rp:?}");
    assert!(
        rp.value.starts_with("1, strict (all 0, eth0 1)"),
        "{}",
        rp.value
    );
    assert!(
        rp.value
            .contains("203.0.113.128/25 via 203.0.113.1 dev eth1"),
        "{}",
        rp.value
    );
    assert!(rp.fix.as_deref().unwrap().contains("rp_filter=2"));
    // A client on eth0's own subnet comes and goes by eth0.
    let c = run_checks(&f, &plan(&["eth0"], &["198.51.100.50"]));
    assert_eq!(status(&c, "rp_filter", Some("eth0")), CheckStatus::Pass);
    // The worst of several clients counts.
    let c = run_checks(&f, &plan(&["eth0"], &["198.51.100.50", "203.0.113.200"]));
    assert_eq!(status(&c, "rp_filter", Some("eth0")), CheckStatus::Fail);
    // An IPv6 client: rp_filter is IPv4's, said, not a failed route.
    let c = run_checks(&f, &plan(&["eth0"], &["fd00::50"]));
    let rp = find(&c, "rp_filter", Some("eth0"));
    assert_eq!(rp.status, CheckStatus::Skip, "{rp:?}");
    assert!(rp.why.contains("not checked for fd00::50"), "{rp:?}");
    let c = run_checks(&f, &plan(&["eth0"], &["fd00::50", "203.0.113.200"]));
    assert_eq!(status(&c, "rp_filter", Some("eth0")), CheckStatus::Fail);
    // No default route: off-subnet clients get no reply at all.
    let c = run_checks(&f, &plan(&["eth0"], &[]));
    assert_eq!(status(&c, "rp_filter", Some("eth0")), CheckStatus::Warn);
    // all=1 makes it strict whatever eth0 says; loose only warns (asymmetric).
    let t = tree();
    t.conf("all", "rp_filter", "1")
        .conf("eth0", "rp_filter", "0");
    let c = run_checks(
        &facts(&t, addrs(&[]), no_guard()),
        &plan(&["eth0"], &["203.0.113.200"]),
    );
    assert_eq!(status(&c, "rp_filter", Some("eth0")), CheckStatus::Fail);
    t.conf("all", "rp_filter", "2");
    let c = run_checks(
        &facts(&t, addrs(&[]), no_guard()),
        &plan(&["eth0"], &["203.0.113.200"]),
    );
    assert_eq!(status(&c, "rp_filter", Some("eth0")), CheckStatus::Warn);
    // A default route through eth0: every client comes back through eth0.
    let t = tree();
    t.conf("all", "rp_filter", "1");
    t.routes(&[
        ("eth0", "198.51.100.0/24", None, 0),
        ("eth0", "0.0.0.0/0", Some("198.51.100.1"), 0),
    ]);
    let c = run_checks(&facts(&t, addrs(&[]), no_guard()), &plan(&[], &[]));
    let f = facts(&t, addrs(&[]), no_guard());
    let (ups, from) = default_uplinks(&f.node, &f.addrs, &f.guard, &["kube-ipvs0".into()]);
    assert_eq!(
        (ups, from.as_str()),
        (vec!["eth0".to_owned()], "the default route")
    );
    assert!(
        c.iter().all(|c| c.check != "rp_filter"),
        "no uplinks planned"
    );
    let c = run_checks(&f, &plan(&["eth0"], &[]));
    assert_eq!(status(&c, "rp_filter", Some("eth0")), CheckStatus::Pass);
}

#[test]
fn forwarding_lan_and_kernel() {
    let t = tree();
    t.write("proc/sys/net/ipv4/ip_forward", "0\n");
    let c = run_checks(&facts(&t, addrs(&[]), no_guard()), &plan(&["eth0"], &[]));
    assert_eq!(status(&c, "ip_forward", None), CheckStatus::Fail);
    let t = tree();
    t.conf("eth0", "forwarding", "0");
    let c = run_checks(&facts(&t, addrs(&[]), no_guard()), &plan(&["eth0"], &[]));
    let fwd = find(&c, "ip_forward", None);
    assert_eq!(
        (fwd.status, fwd.value.as_str()),
        (CheckStatus::Fail, "1 (forwarding: eth0 0)")
    );

    // LB IPs from eth1's subnet announced on eth0; one in no subnet at all.
    let t = tree();
    let extra = [("kube-ipvs0", "203.0.113.50", 32), ("lo", "192.0.2.10", 32)];
    let c = run_checks(&facts(&t, addrs(&extra), no_guard()), &plan(&["eth0"], &[]));
    let lan = find(&c, "lan_interface", None);
    assert_eq!(lan.status, CheckStatus::Warn);
    assert!(
        lan.value.contains("1 in 203.0.113.0/25 dev eth1"),
        "{}",
        lan.value
    );
    assert!(
        lan.value.contains("1 in no connected subnet"),
        "{}",
        lan.value
    );
    // An address on lo is an LB IP the kernel answers for too.
    let lo = find(&c, "lb_addresses", Some("lo"));
    assert_eq!(
        (lo.status, lo.value.as_str()),
        (CheckStatus::Fail, "1 (192.0.2.10)")
    );

    for (release, want, value) in [
        ("5.4.0", CheckStatus::Fail, "no"),
        (
            "6.1.0-18-amd64",
            CheckStatus::Pass,
            "no (Linux 6.1.0-18-amd64 < 6.6)",
        ),
        ("6.6.1", CheckStatus::Pass, "yes"),
        ("banana", CheckStatus::Warn, "unknown"),
    ] {
        let t = tree();
        t.write("proc/sys/kernel/osrelease", release);
        let c = run_checks(&facts(&t, addrs(&[]), no_guard()), &plan(&["eth0"], &[]));
        let tcx = find(&c, "tcx", None);
        assert_eq!(tcx.status, want, "{release}");
        assert!(tcx.value.starts_with(value), "{release}: {}", tcx.value);
    }
    let t = tree();
    t.write("proc/mounts", "bpf /var/lib/bpf bpf rw 0 0\n");
    let c = run_checks(&facts(&t, addrs(&[]), no_guard()), &plan(&["eth0"], &[]));
    assert_eq!(status(&c, "bpffs", None), CheckStatus::Warn);
}

#[test]
fn unknowns_never_panic_and_say_why() {
    let t = tree();
    t.write(
        "proc/sys/net/ipv4/conf/eth0/arp_ignore",
        "\u{0}\u{ff}garbage",
    );
    std::fs::remove_file(t.path("proc/net/route")).unwrap();
    std::fs::remove_file(t.path("proc/sys/net/ipv4/ip_forward")).unwrap();
    let mut f = facts(&t, addrs(&[]), no_guard());
    f.addrs = Err("netlink: permission denied".into());
    let c = run_checks(&f, &plan(&["eth0", "eth9"], &[]));
    let ai = find(&c, "arp_ignore", Some("eth0"));
    assert_eq!(ai.status, CheckStatus::Warn);
    assert!(ai.why.contains("not a number"), "{}", ai.why);
    assert_eq!(status(&c, "arp_ignore", Some("eth9")), CheckStatus::Skip);
    assert_eq!(status(&c, "ip_forward", None), CheckStatus::Warn);
    assert_eq!(status(&c, "rp_filter", Some("eth0")), CheckStatus::Warn);
    assert_eq!(
        status(&c, "lb_addresses", Some("kube-ipvs0")),
        CheckStatus::Skip
    );
    // Every check has a value and a reason.
    for c in &c {
        assert!(!c.value.is_empty() && !c.why.is_empty(), "{c:?}");
    }
}
