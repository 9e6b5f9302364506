//! ARP: arp_ignore, arp_announce and the LB addresses, with and without a guard.

use super::*;

#[test]
fn the_incident_node_fails_where_it_answers() {
    let t = tree();
    let f = facts(&t, addrs(&[]), no_guard());
    let c = run_checks(&f, &plan(&["eth0"], &[]));
    let ai = find(&c, "arp_ignore", Some("eth0"));
    assert_eq!(ai.status, Status::Fail);
    assert_eq!(ai.value, "0 (all 0, eth0 0)");
    assert!(ai.why.contains("3 LB IPs on kube-ipvs0"), "{}", ai.why);
    assert!(
        ai.why.contains("externalTrafficPolicy: Local"),
        "{}",
        ai.why
    );
    assert!(ai.fix.as_deref().unwrap().contains("strictARP"));
    assert_eq!(status(&c, "arp_announce", Some("eth0")), Status::Fail);
    assert_eq!(status(&c, "lb_addresses", Some("kube-ipvs0")), Status::Fail);
    assert_eq!(status(&c, "kube_proxy", None), Status::Warn);
    assert_eq!(status(&c, "guard", None), Status::Warn);
    assert_eq!(status(&c, "attached", Some("eth0")), Status::Skip);
    assert_eq!(status(&c, "lan_interface", None), Status::Pass);
    assert_eq!(status(&c, "ip_forward", None), Status::Pass);
    assert_eq!(status(&c, "tcx", None), Status::Pass);
    assert_eq!(status(&c, "bpffs", None), Status::Pass);
    // The order starts with kube-proxy's strictARP.
    assert_eq!(c[0].check, "kube_proxy");
}

#[test]
fn strict_arp_like_sysctls_pass_and_the_maximum_counts() {
    let t = tree();
    // What kube-proxy's strictARP sets: conf/all only.
    t.conf("all", "arp_ignore", "1")
        .conf("all", "arp_announce", "2");
    let c = run_checks(&facts(&t, addrs(&[]), no_guard()), &plan(&["eth0"], &[]));
    let ai = find(&c, "arp_ignore", Some("eth0"));
    assert_eq!(
        (ai.status, ai.value.as_str()),
        (Status::Pass, "1 (all 1, eth0 0)")
    );
    assert!(ai.why.contains("not answered"), "{}", ai.why);
    assert_eq!(status(&c, "arp_announce", Some("eth0")), Status::Pass);
    // No guard, but the kernel keeps quiet: fine.
    assert_eq!(status(&c, "lb_addresses", Some("kube-ipvs0")), Status::Pass);

    // The interface's own value counts as much as all's.
    let t = tree();
    t.conf("eth0", "arp_ignore", "2")
        .conf("eth0", "arp_announce", "2");
    let c = run_checks(&facts(&t, addrs(&[]), no_guard()), &plan(&["eth0"], &[]));
    assert_eq!(
        find(&c, "arp_ignore", Some("eth0")).value,
        "2 (all 0, eth0 2)"
    );
    assert_eq!(status(&c, "arp_ignore", Some("eth0")), Status::Pass);

    // 3 does not hide kube-ipvs0's scope-global addresses; 8 answers nothing.
    for (v, want) in [
        ("3", Status::Fail),
        ("5", Status::Fail),
        ("8", Status::Pass),
    ] {
        let t = tree();
        t.conf("all", "arp_ignore", v);
        let c = run_checks(&facts(&t, addrs(&[]), no_guard()), &plan(&["eth0"], &[]));
        assert_eq!(
            status(&c, "arp_ignore", Some("eth0")),
            want,
            "arp_ignore={v}"
        );
    }
    // arp_announce=1 still leaks LB IPs in eth0's own subnet.
    let t = tree();
    t.conf("all", "arp_ignore", "1")
        .conf("all", "arp_announce", "1");
    let c = run_checks(&facts(&t, addrs(&[]), no_guard()), &plan(&["eth0"], &[]));
    assert_eq!(status(&c, "arp_announce", Some("eth0")), Status::Fail);
    // ...but not on eth1, whose subnet holds none.
    let c = run_checks(&facts(&t, addrs(&[]), no_guard()), &plan(&["eth1"], &[]));
    assert_eq!(status(&c, "arp_announce", Some("eth1")), Status::Pass);
}

#[test]
fn a_guard_that_covers_them_turns_fail_into_warn() {
    let t = tree();
    let g = api_guard("enforce", &["eth0"], &LB);
    let c = run_checks(&facts(&t, addrs(&[]), g), &plan(&["eth0"], &[]));
    let ai = find(&c, "arp_ignore", Some("eth0"));
    assert_eq!(ai.status, Status::Warn);
    assert!(ai.why.contains("arp-guard (enforce)"), "{}", ai.why);
    assert_eq!(status(&c, "arp_announce", Some("eth0")), Status::Warn);
    let lb = find(&c, "lb_addresses", Some("kube-ipvs0"));
    assert_eq!(lb.status, Status::Pass);
    assert!(
        lb.value.contains("covers all (foreign 2, owned 1)"),
        "{}",
        lb.value
    );
    for (name, subject) in [
        ("guard", None),
        ("attached", Some("eth0")),
        ("tc_chain", Some("eth0")),
        ("mode", None),
        ("feed", None),
    ] {
        assert_eq!(status(&c, name, subject), Status::Pass, "{name}");
    }

    // Monitor mode counts, stops nothing.
    let c = run_checks(
        &facts(&t, addrs(&[]), api_guard("monitor", &["eth0"], &LB)),
        &plan(&["eth0"], &[]),
    );
    assert_eq!(status(&c, "arp_ignore", Some("eth0")), Status::Fail);
    assert_eq!(status(&c, "mode", None), Status::Warn);

    // An IP the guard does not know, and a guard on the wrong interface.
    let g = api_guard("enforce", &["eth0"], &LB[..2]);
    let c = run_checks(&facts(&t, addrs(&[]), g), &plan(&["eth0"], &[]));
    let lb = find(&c, "lb_addresses", Some("kube-ipvs0"));
    assert_eq!(lb.status, Status::Fail);
    assert!(lb.why.contains("198.51.100.103"), "{}", lb.why);
    let g = api_guard("enforce", &["eth1"], &LB);
    let c = run_checks(&facts(&t, addrs(&[]), g), &plan(&["eth0"], &[]));
    assert_eq!(status(&c, "attached", Some("eth0")), Status::Fail);
    assert_eq!(status(&c, "arp_ignore", Some("eth0")), Status::Fail);
    // A guard that does not cover them, beside strictARP: warn.
    t.conf("all", "arp_ignore", "1");
    let g = api_guard("enforce", &["eth0"], &[]);
    let c = run_checks(&facts(&t, addrs(&[]), g), &plan(&["eth0"], &[]));
    assert_eq!(status(&c, "lb_addresses", Some("kube-ipvs0")), Status::Warn);
}
