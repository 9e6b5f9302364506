//! IPv6: the LB IPs doctor knows of, proxy_ndp and proxy entries, DAD on
//! LB IPs held on the uplink, forwarding.

use std::net::Ipv6Addr;

use super::*;
use crate::commands::doctor::ipv6_view::{Addr6, Dad, Ipv6View, Proxy6};

/// IPv6 LB IPs on kube-ipvs0.
const LB6: [&str; 3] = ["fd00::101", "fd00::102", "fd00::103"];
/// A VIP on eth0 itself (kube-vip), known from the guard.
const VIP: &str = "fd00::104";

fn v6(s: &str) -> Ipv6Addr {
    s.parse().unwrap()
}

/// The base tree with IPv6 on: kernel defaults, and a node that routes.
fn tree6() -> Tree {
    let t = tree();
    for iface in ["all", "eth0", "eth1"] {
        for (key, v) in [
            ("disable_ipv6", "0"),
            ("forwarding", "1"),
            ("proxy_ndp", "0"),
            ("accept_dad", "1"),
            ("accept_ra", "1"),
        ] {
            t.conf6(iface, key, v);
        }
    }
    t
}

/// The base addresses plus fd00::11 on eth0 and LB6 on kube-ipvs0.
fn addrs6() -> AddrTable {
    let mut t = addrs(&[]);
    t.v6.insert(2, vec![v6("fd00::11")]);
    t.v6.insert(4, LB6.iter().map(|a| v6(a)).collect());
    t
}

/// What doctor gathered, with `view` as the IPv6 view.
fn facts6(t: &Tree, guard: GuardView, view: Ipv6View) -> Gathered {
    let mut f = facts(t, addrs6(), guard);
    f.ipv6 = Ok(view);
    f
}

fn view(addrs: &[(u32, &str, Dad)], proxies: &[(Option<u32>, &str)]) -> Ipv6View {
    Ipv6View {
        addrs: addrs
            .iter()
            .map(|(i, a, dad)| Addr6 {
                ifindex: *i,
                addr: v6(a),
                dad: *dad,
            })
            .collect(),
        proxies: Ok(proxies
            .iter()
            .map(|(i, a)| Proxy6 {
                ifindex: *i,
                addr: v6(a),
                router: false,
            })
            .collect()),
    }
}

fn empty() -> Ipv6View {
    view(&[], &[])
}

#[test]
fn without_ipv6_lb_ips_one_line_says_so() {
    let t = tree();
    let c = run_checks(&facts(&t, addrs(&[]), no_guard()), &plan(&["eth0"], &[]));
    let v6 = find(&c, "ipv6", None);
    assert_eq!(
        (v6.status, v6.value.as_str()),
        (CheckStatus::Pass, "no IPv6 LB IP")
    );
    assert!(v6.why.contains("kube-ipvs0"), "{}", v6.why);
    for name in ["proxy_ndp", "accept_dad", "ipv6_forwarding"] {
        assert!(!c.iter().any(|x| x.check == name), "{name} is not relevant");
    }
    // Addresses unknown: skipped, not passed.
    let mut f = facts(&t, addrs(&[]), no_guard());
    f.addrs = Err("netlink: EPERM".into());
    let c = run_checks(&f, &plan(&["eth0"], &[]));
    assert_eq!(status(&c, "ipv6", None), CheckStatus::Skip);
}

#[test]
fn kernel_defaults_pass_and_say_why() {
    let t = tree6();
    let c = run_checks(&facts6(&t, no_guard(), empty()), &plan(&["eth0"], &[]));
    let v6 = find(&c, "ipv6", None);
    assert_eq!(v6.status, CheckStatus::Pass);
    assert_eq!(v6.value, "3 IPv6 LB IPs (fd00::101, fd00::102, fd00::103)");
    assert!(v6.why.contains("never for kube-ipvs0's"), "{}", v6.why);
    let p = find(&c, "proxy_ndp", Some("eth0"));
    assert_eq!(
        (p.status, p.value.as_str()),
        (CheckStatus::Pass, "off (all 0, eth0 0; eth0 forwarding 1)")
    );
    assert!(
        p.why.contains("only for addresses configured on eth0"),
        "{}",
        p.why
    );
    let d = find(&c, "accept_dad", Some("eth0"));
    assert_eq!(
        (d.status, d.value.as_str()),
        (CheckStatus::Pass, "on (all 1, eth0 1)")
    );
    assert!(
        d.why.contains("no LB IP is an address of eth0"),
        "{}",
        d.why
    );
    let fw = find(&c, "ipv6_forwarding", None);
    assert_eq!(fw.status, CheckStatus::Pass);
    assert_eq!(fw.value, "1 (all; eth0 1, accept_ra 1)");
    assert!(
        fw.why.contains("Router flag") && fw.why.contains("accept_ra below 2"),
        "{}",
        fw.why
    );
}

#[test]
fn a_proxy_entry_for_an_lb_ip_fails_unless_an_enforcing_guard_covers_it() {
    let t = tree6();
    t.conf6("eth0", "proxy_ndp", "1");
    let proxied = view(&[], &[(Some(2), "fd00::102"), (Some(2), "fd00::999")]);
    let c = run_checks(
        &facts6(&t, no_guard(), proxied.clone()),
        &plan(&["eth0"], &[]),
    );
    let p = find(&c, "proxy_ndp", Some("eth0"));
    assert_eq!(p.status, CheckStatus::Fail, "{p:?}");
    assert_eq!(
        p.value,
        "on (all 0, eth0 1; eth0 forwarding 1); proxy entries for LB IPs: fd00::102"
    );
    assert!(p.why.contains("no running arp-guard was seen"), "{}", p.why);
    assert!(
        p.fix
            .as_deref()
            .unwrap()
            .contains("ip -6 neigh del proxy fd00::102 dev eth0"),
        "{p:?}"
    );
    // proxy_ndp in `all` counts as much (either turns it on); an entry on
    // no particular interface applies to every one.
    let t2 = tree6();
    t2.conf6("all", "proxy_ndp", "1");
    let any = view(&[], &[(None, "fd00::102")]);
    let c = run_checks(&facts6(&t2, no_guard(), any), &plan(&["eth0"], &[]));
    assert_eq!(status(&c, "proxy_ndp", Some("eth0")), CheckStatus::Fail);
    // An entry on another interface, or for an address that is no LB IP: pass.
    let elsewhere = view(&[], &[(Some(3), "fd00::102"), (Some(2), "fd00::999")]);
    let c = run_checks(&facts6(&t, no_guard(), elsewhere), &plan(&["eth0"], &[]));
    let p = find(&c, "proxy_ndp", Some("eth0"));
    assert_eq!(p.status, CheckStatus::Pass, "{p:?}");
    assert!(p.why.contains("none is for an LB IP"), "{}", p.why);

    // The guard: foreign and enforcing drops them (warn); unknown passes
    // them (fail); owned is this node's to answer (pass); monitor counts.
    fn ips(state: &'static str) -> Vec<(&'static str, &'static str)> {
        LB6.iter()
            .map(|ip| (*ip, if *ip == "fd00::102" { state } else { "owned" }))
            .collect()
    }
    for (mode, state, want) in [
        ("enforce", "foreign", CheckStatus::Warn),
        ("enforce", "unknown", CheckStatus::Fail),
        ("enforce", "owned", CheckStatus::Pass),
        ("monitor", "foreign", CheckStatus::Fail),
    ] {
        let g = api_guard_states(mode, &["eth0"], &ips(state));
        let c = run_checks(&facts6(&t, g, proxied.clone()), &plan(&["eth0"], &[]));
        let p = find(&c, "proxy_ndp", Some("eth0"));
        assert_eq!(p.status, want, "{mode} {state}: {p:?}");
    }
    // The guard without fd00::102 in its set does not cover it.
    let g = api_guard_states("enforce", &["eth0"], &[("fd00::101", "owned")]);
    let c = run_checks(&facts6(&t, g, proxied), &plan(&["eth0"], &[]));
    let p = find(&c, "proxy_ndp", Some("eth0"));
    assert_eq!(p.status, CheckStatus::Fail);
    assert!(p.why.contains("not in the guard's LB IP set"), "{}", p.why);
}

#[test]
fn proxy_entries_are_dormant_without_forwarding_or_proxy_ndp() {
    let t = tree6();
    let proxied = view(&[], &[(Some(2), "fd00::102")]);
    // proxy_ndp off: the entry is a sysctl away.
    let c = run_checks(
        &facts6(&t, no_guard(), proxied.clone()),
        &plan(&["eth0"], &[]),
    );
    let p = find(&c, "proxy_ndp", Some("eth0"));
    assert_eq!(p.status, CheckStatus::Warn, "{p:?}");
    assert!(p.why.contains("dormant"), "{}", p.why);
    // proxy_ndp on, eth0 not forwarding: the kernel answers no proxy entry.
    t.conf6("eth0", "proxy_ndp", "1")
        .conf6("eth0", "forwarding", "0");
    let c = run_checks(&facts6(&t, no_guard(), empty()), &plan(&["eth0"], &[]));
    let p = find(&c, "proxy_ndp", Some("eth0"));
    assert_eq!(
        (p.status, p.value.as_str()),
        (
            CheckStatus::Pass,
            "on, inactive (all 0, eth0 1; eth0 forwarding 0)"
        )
    );
    assert!(
        p.why.contains("only on a forwarding interface"),
        "{}",
        p.why
    );
    // Entries that cannot be listed: a warning when they would be answered.
    t.conf6("eth0", "forwarding", "1");
    let mut unreadable = empty();
    unreadable.proxies = Err("EPERM".into());
    let c = run_checks(&facts6(&t, no_guard(), unreadable), &plan(&["eth0"], &[]));
    let p = find(&c, "proxy_ndp", Some("eth0"));
    assert_eq!(p.status, CheckStatus::Warn, "{p:?}");
    assert!(p.why.contains("cannot be listed"), "{}", p.why);
}

#[test]
fn dad_failed_on_a_vip_held_on_the_uplink_fails() {
    let t = tree6();
    let g = |ips: &[(&str, &str)]| api_guard_states("enforce", &["eth0"], ips);
    let guard = || g(&[(VIP, "owned"), ("fd00::101", "foreign")]);
    let held = |dad: Dad| view(&[(2, "fd00::11", Dad::Done), (2, VIP, dad)], &[]);
    let c = run_checks(
        &facts6(&t, guard(), held(Dad::Failed)),
        &plan(&["eth0"], &[]),
    );
    let d = find(&c, "accept_dad", Some("eth0"));
    assert_eq!(d.status, CheckStatus::Fail, "{d:?}");
    assert_eq!(
        d.value,
        "on (all 1, eth0 1); LB IPs on eth0: fd00::104 dadfailed"
    );
    assert!(
        d.why.contains("kube-vip #523") && d.why.contains("delivers none of its traffic"),
        "{}",
        d.why
    );
    assert!(
        d.fix.as_deref().unwrap().contains("arp-guard probe"),
        "{d:?}"
    );
    let c = run_checks(
        &facts6(&t, guard(), held(Dad::Tentative)),
        &plan(&["eth0"], &[]),
    );
    assert_eq!(status(&c, "accept_dad", Some("eth0")), CheckStatus::Warn);
    let c = run_checks(&facts6(&t, guard(), held(Dad::Done)), &plan(&["eth0"], &[]));
    let d = find(&c, "accept_dad", Some("eth0"));
    assert_eq!(d.status, CheckStatus::Pass);
    assert!(d.why.contains("ends dadfailed"), "{}", d.why);
    // Without DAD (nodad, or accept_dad below 1 in both): nothing detected.
    let c = run_checks(
        &facts6(&t, guard(), held(Dad::Skipped)),
        &plan(&["eth0"], &[]),
    );
    let d = find(&c, "accept_dad", Some("eth0"));
    assert_eq!(d.status, CheckStatus::Pass);
    assert!(d.why.contains("both nodes answer"), "{}", d.why);
    t.conf6("all", "accept_dad", "0")
        .conf6("eth0", "accept_dad", "0");
    let c = run_checks(&facts6(&t, guard(), held(Dad::Done)), &plan(&["eth0"], &[]));
    let d = find(&c, "accept_dad", Some("eth0"));
    assert!(d.value.starts_with("off (all 0, eth0 0)"), "{}", d.value);
    assert!(d.why.contains("both nodes answer"), "{}", d.why);
    // The node's own address on eth0 is no LB IP: never judged.
    assert!(!d.value.contains("fd00::11 "), "{}", d.value);
}

#[test]
fn forwarding_all_decides_routing_and_each_uplink_the_router_flag() {
    let t = tree6();
    t.conf6("all", "forwarding", "0");
    let c = run_checks(&facts6(&t, no_guard(), empty()), &plan(&["eth0"], &[]));
    let fw = find(&c, "ipv6_forwarding", None);
    assert_eq!(fw.status, CheckStatus::Fail, "{fw:?}");
    assert!(fw
        .fix
        .as_deref()
        .unwrap()
        .contains("net.ipv6.conf.all.forwarding=1"));
    let t = tree6();
    t.conf6("eth0", "forwarding", "0")
        .conf6("eth0", "accept_ra", "2");
    let c = run_checks(&facts6(&t, no_guard(), empty()), &plan(&["eth0"], &[]));
    let fw = find(&c, "ipv6_forwarding", None);
    assert_eq!(fw.status, CheckStatus::Warn, "{fw:?}");
    assert_eq!(fw.value, "1 (all; eth0 0, accept_ra 2)");
    assert!(fw.why.contains("no Router flag"), "{}", fw.why);
    // accept_ra=2 on a router: no note about Router Advertisements.
    let t = tree6();
    t.conf6("eth0", "accept_ra", "2");
    let c = run_checks(&facts6(&t, no_guard(), empty()), &plan(&["eth0"], &[]));
    let fw = find(&c, "ipv6_forwarding", None);
    assert_eq!(fw.status, CheckStatus::Pass);
    assert!(!fw.why.contains("accept_ra"), "{}", fw.why);
    // A kernel without IPv6: skipped.
    let t = tree();
    let c = run_checks(&facts6(&t, no_guard(), empty()), &plan(&["eth0"], &[]));
    assert_eq!(status(&c, "ipv6_forwarding", None), CheckStatus::Skip);
    assert_eq!(status(&c, "proxy_ndp", Some("eth0")), CheckStatus::Pass);
    assert_eq!(status(&c, "accept_dad", Some("eth0")), CheckStatus::Skip);
}

#[test]
fn ipv6_off_on_the_uplink_answers_nothing() {
    let t = tree6();
    t.conf6("eth0", "disable_ipv6", "1")
        .conf6("eth0", "proxy_ndp", "1");
    let proxied = view(&[], &[(Some(2), "fd00::102")]);
    let c = run_checks(
        &facts6(&t, no_guard(), proxied),
        &plan(&["eth0", "eth9"], &[]),
    );
    let p = find(&c, "proxy_ndp", Some("eth0"));
    assert_eq!(
        (p.status, p.value.as_str()),
        (CheckStatus::Pass, "IPv6 off")
    );
    assert_eq!(status(&c, "accept_dad", Some("eth0")), CheckStatus::Skip);
    assert_eq!(status(&c, "proxy_ndp", Some("eth9")), CheckStatus::Skip);
    // Hostile values read as unknown: a warning, not a pass.
    let t = tree6();
    t.write("proc/sys/net/ipv6/conf/eth0/proxy_ndp", "yes\n");
    let c = run_checks(&facts6(&t, no_guard(), empty()), &plan(&["eth0"], &[]));
    let p = find(&c, "proxy_ndp", Some("eth0"));
    assert_eq!(p.status, CheckStatus::Warn, "{p:?}");
    assert!(p.why.contains("not a number"), "{}", p.why);
}

#[test]
fn the_guards_ipv6_set_comes_from_its_api_else_its_pins() {
    let t = tree6();
    // A guard with IPv6 LB IPs and nothing on kube-ipvs0: they are known.
    let g = api_guard_states("enforce", &["eth0"], &[(VIP, "foreign")]);
    let mut f = facts6(&t, g, empty());
    f.addrs = Ok(addrs(&[]));
    let c = run_checks(&f, &plan(&["eth0"], &[]));
    assert_eq!(find(&c, "ipv6", None).value, "1 IPv6 LB IPs (fd00::104)");
    // Seen through its pins only, without an IPv6 map pinned: the IPv6
    // set is unknown, and coverage too.
    let mut g = no_guard();
    g.pinned = Some(Pinned {
        config: Some(guard_common::Config::default()),
        heartbeat_ns: None,
        lb: Some(Default::default()),
        lb6: None,
        links: vec![2],
        problems: vec![],
    });
    t.conf6("eth0", "proxy_ndp", "1");
    let proxied = view(&[], &[(Some(2), "fd00::102")]);
    let c = run_checks(&facts6(&t, g, proxied), &plan(&["eth0"], &[]));
    let v6 = find(&c, "ipv6", None);
    assert!(v6.why.contains("guard's IPv6 set is unknown"), "{}", v6.why);
    let p = find(&c, "proxy_ndp", Some("eth0"));
    assert_eq!(p.status, CheckStatus::Fail);
    assert!(p.why.contains("pass --api"), "{}", p.why);
    // With its IPv6 map pinned, the pins say it, as for IPv4.
    let mut g = no_guard();
    g.pinned = Some(Pinned {
        config: Some(guard_common::Config::default()),
        heartbeat_ns: None,
        lb: Some(Default::default()),
        lb6: Some([(VIP.parse().unwrap(), guard_common::Ownership::Foreign)].into()),
        links: vec![2],
        problems: vec![],
    });
    let mut f = facts6(&t, g, empty());
    f.addrs = Ok(addrs(&[]));
    let c = run_checks(&f, &plan(&["eth0"], &[]));
    assert_eq!(find(&c, "ipv6", None).value, "1 IPv6 LB IPs (fd00::104)");
}
