//! ARP: arp_ignore, arp_announce and the LB addresses, with and without a guard.

use super::*;

#[test]
fn the_incident_node_fails_where_it_answers() {
    let t = tree();
    let f = facts(&t, addrs(&[]), no_guard());
    let c = run_checks(&f, &plan(&["eth0"], &[]));
    let ai = find(&c, "arp_ignore", Some("eth0"));
    assert_eq!(ai.status, CheckStatus::Fail);
    assert_eq!(ai.value, "0 (all 0, eth0 0)");
    assert!(ai.why.contains("3 LB IPs on kube-ipvs0"), "{}", ai.why);
    assert!(
        ai.why.contains("externalTrafficPolicy: Local"),
        "{}",
        ai.why
    );
    assert!(ai.fix.as_deref().unwrap().contains("strictARP"));
    assert_eq!(status(&c, "arp_announce", Some("eth0")), CheckStatus::Fail);
    assert_eq!(
        status(&c, "lb_addresses", Some("kube-ipvs0")),
        CheckStatus::Fail
    );
    assert_eq!(status(&c, "kube_proxy", None), CheckStatus::Warn);
    assert_eq!(status(&c, "guard", None), CheckStatus::Warn);
    assert_eq!(status(&c, "attached", Some("eth0")), CheckStatus::Skip);
    assert_eq!(status(&c, "lan_interface", None), CheckStatus::Pass);
    assert_eq!(status(&c, "ip_forward", None), CheckStatus::Pass);
    assert_eq!(status(&c, "tcx", None), CheckStatus::Pass);
    assert_eq!(status(&c, "bpffs", None), CheckStatus::Pass);
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
        (CheckStatus::Pass, "1 (all 1, eth0 0)")
    );
    assert!(ai.why.contains("not answered"), "{}", ai.why);
    assert_eq!(status(&c, "arp_announce", Some("eth0")), CheckStatus::Pass);
    // No guard, but the kernel keeps quiet: fine.
    assert_eq!(
        status(&c, "lb_addresses", Some("kube-ipvs0")),
        CheckStatus::Pass
    );

    // The interface's own value counts as much as all's.
    let t = tree();
    t.conf("eth0", "arp_ignore", "2")
        .conf("eth0", "arp_announce", "2");
    let c = run_checks(&facts(&t, addrs(&[]), no_guard()), &plan(&["eth0"], &[]));
    assert_eq!(
        find(&c, "arp_ignore", Some("eth0")).value,
        "2 (all 0, eth0 2)"
    );
    assert_eq!(status(&c, "arp_ignore", Some("eth0")), CheckStatus::Pass);

    // 3 does not hide kube-ipvs0's scope-global addresses; 8 answers nothing.
    for (v, want) in [
        ("3", CheckStatus::Fail),
        ("5", CheckStatus::Fail),
        ("8", CheckStatus::Pass),
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
    assert_eq!(status(&c, "arp_announce", Some("eth0")), CheckStatus::Fail);
    // ...but not on eth1, whose subnet holds none.
    let c = run_checks(&facts(&t, addrs(&[]), no_guard()), &plan(&["eth1"], &[]));
    assert_eq!(status(&c, "arp_announce", Some("eth1")), CheckStatus::Pass);
}

#[test]
fn a_guard_that_covers_them_turns_fail_into_warn() {
    let t = tree();
    let g = api_guard("enforce", &["eth0"], &LB);
    let c = run_checks(&facts(&t, addrs(&[]), g), &plan(&["eth0"], &[]));
    let ai = find(&c, "arp_ignore", Some("eth0"));
    assert_eq!(ai.status, CheckStatus::Warn);
    assert!(ai.why.contains("arp-guard (enforce)"), "{}", ai.why);
    assert_eq!(status(&c, "arp_announce", Some("eth0")), CheckStatus::Warn);
    let lb = find(&c, "lb_addresses", Some("kube-ipvs0"));
    assert_eq!(lb.status, CheckStatus::Pass);
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
        assert_eq!(status(&c, name, subject), CheckStatus::Pass, "{name}");
    }

    // Monitor mode counts, stops nothing.
    let c = run_checks(
        &facts(&t, addrs(&[]), api_guard("monitor", &["eth0"], &LB)),
        &plan(&["eth0"], &[]),
    );
    assert_eq!(status(&c, "arp_ignore", Some("eth0")), CheckStatus::Fail);
    assert_eq!(status(&c, "mode", None), CheckStatus::Warn);

    // An IP the guard does not know, and a guard on the wrong interface.
    let g = api_guard("enforce", &["eth0"], &LB[..2]);
    let c = run_checks(&facts(&t, addrs(&[]), g), &plan(&["eth0"], &[]));
    let lb = find(&c, "lb_addresses", Some("kube-ipvs0"));
    assert_eq!(lb.status, CheckStatus::Fail);
    assert!(lb.why.contains("198.51.100.103"), "{}", lb.why);
    let g = api_guard("enforce", &["eth1"], &LB);
    let c = run_checks(&facts(&t, addrs(&[]), g), &plan(&["eth0"], &[]));
    assert_eq!(status(&c, "attached", Some("eth0")), CheckStatus::Fail);
    assert_eq!(status(&c, "arp_ignore", Some("eth0")), CheckStatus::Fail);
    // A guard that does not cover them, beside strictARP: warn.
    t.conf("all", "arp_ignore", "1");
    let g = api_guard("enforce", &["eth0"], &[]);
    let c = run_checks(&facts(&t, addrs(&[]), g), &plan(&["eth0"], &[]));
    assert_eq!(
        status(&c, "lb_addresses", Some("kube-ipvs0")),
        CheckStatus::Warn
    );
}
