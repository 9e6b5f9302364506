//! The guard: seen through its pins, its place in the TC chain, its feed.

use super::*;

#[test]
fn the_guard_seen_through_its_pins() {
    let t = tree();
    let pinned = |age_s: u64| {
        let mut g = no_guard();
        g.now_ns = 1_000_000_000_000;
        g.pinned = Some(Pinned {
            config: Some(guard_common::Config {
                mode: 0,
                stale_after_ns: 15_000_000_000,
                dead_after_ns: 300_000_000_000,
                ..Default::default()
            }),
            heartbeat_ns: Some(g.now_ns - age_s * 1_000_000_000),
            lb6: None,
            lb: Some(
                LB.iter()
                    .map(|ip| (ip.parse().unwrap(), guard_common::Ownership::Foreign))
                    .collect(),
            ),
            links: vec![2],
            problems: vec![],
        });
        g
    };
    let c = run_checks(&facts(&t, addrs(&[]), pinned(0)), &plan(&["eth0"], &[]));
    let g = find(&c, "guard", None);
    assert_eq!(g.status, CheckStatus::Warn, "{g:?}");
    assert!(g.value.contains("heartbeat 0.0s old"), "{}", g.value);
    assert_eq!(status(&c, "attached", Some("eth0")), CheckStatus::Pass);
    assert_eq!(
        status(&c, "lb_addresses", Some("kube-ipvs0")),
        CheckStatus::Pass
    );
    assert_eq!(status(&c, "arp_ignore", Some("eth0")), CheckStatus::Warn);
    assert_eq!(status(&c, "mode", None), CheckStatus::Pass);
    assert_eq!(status(&c, "feed", None), CheckStatus::Skip);
    // The interfaces default to the pinned links'.
    let f = facts(&t, addrs(&[]), pinned(0));
    let (ups, from) = default_uplinks(&f.node, &f.addrs, &f.guard, &["kube-ipvs0".into()]);
    assert_eq!(
        (ups, from.as_str()),
        (vec!["eth0".to_owned()], "the guard's pinned links")
    );
    // Stale: fail. Dead: fail, and it no longer covers anything.
    let c = run_checks(&facts(&t, addrs(&[]), pinned(20)), &plan(&["eth0"], &[]));
    assert_eq!(status(&c, "guard", None), CheckStatus::Fail);
    let c = run_checks(&facts(&t, addrs(&[]), pinned(400)), &plan(&["eth0"], &[]));
    assert_eq!(status(&c, "guard", None), CheckStatus::Fail);
    assert_eq!(status(&c, "arp_ignore", Some("eth0")), CheckStatus::Fail);
}

#[test]
fn tc_chain_position() {
    let t = tree();
    let chain = |tcx: Result<Vec<&str>, &str>, netlink: Vec<NetlinkFilter>| {
        let mut g = api_guard("enforce", &["eth0"], &LB);
        g.chains.insert(
            "eth0".into(),
            Chain {
                tcx: tcx
                    .map(|v| v.iter().map(|s| s.to_string()).collect())
                    .map_err(str::to_owned),
                netlink: Ok(netlink),
            },
        );
        let c = run_checks(&facts(&t, addrs(&[]), g), &plan(&["eth0"], &[]));
        find(&c, "tc_chain", Some("eth0")).clone()
    };
    let c = chain(Ok(vec!["cil_to_netdev", "arp_guard_egres"]), vec![]);
    assert_eq!(
        (c.status, c.value.as_str()),
        (
            CheckStatus::Warn,
            "2 of 2 TCX programs, after cil_to_netdev"
        )
    );
    assert_eq!(
        chain(Ok(vec!["arp_guard_egres", "x"]), vec![]).status,
        CheckStatus::Pass
    );
    let c = chain(Err("needs CAP_SYS_ADMIN"), vec![]);
    assert_eq!(
        (c.status, c.why.as_str()),
        (CheckStatus::Skip, "needs CAP_SYS_ADMIN")
    );
    // A netlink filter runs after every TCX program.
    let mut g = api_guard("enforce", &["eth0"], &LB);
    let st = g.status.as_mut().unwrap().status.as_mut().unwrap();
    st.interfaces[0].detail = "netlink-clsact".into();
    let guard_filter = NetlinkFilter {
        priority: 1,
        handle: 0xa6d0,
        program: "arp_guard_egres".into(),
        id: Some(42),
    };
    assert!(guard_filter.is_guard());
    g.chains.insert(
        "eth0".into(),
        Chain {
            tcx: Ok(vec!["cil_to_netdev".into()]),
            netlink: Ok(vec![guard_filter]),
        },
    );
    let c = run_checks(&facts(&t, addrs(&[]), g), &plan(&["eth0"], &[]));
    let tc = find(&c, "tc_chain", Some("eth0"));
    assert_eq!(
        (tc.status, tc.value.as_str()),
        (
            CheckStatus::Warn,
            "netlink filter after cil_to_netdev (tcx)"
        )
    );
}

#[test]
fn feed_health_and_readiness() {
    let t = tree();
    let with = |f: serde_json::Value, ready: bool| {
        let mut g = api_guard("enforce", &["eth0"], &LB);
        let doc = g.status.as_mut().unwrap();
        doc.ready = ready;
        doc.not_ready = if ready {
            vec![]
        } else {
            vec!["eth0 not attached".into()]
        };
        doc.status.as_mut().unwrap().feed = serde_json::from_value(f).unwrap();
        let c = run_checks(&facts(&t, addrs(&[]), g), &plan(&["eth0"], &[]));
        (status(&c, "feed", None), status(&c, "guard", None))
    };
    let feed = |synced: bool, blind: bool, degraded: bool, problem: Option<&str>| {
        json!({"announcers": ["cilium"], "synced": synced, "degraded": degraded, "blind": blind,
               "unconfirmed_leases": 0, "threshold_seconds": 15, "problem": problem,
               "streams": [{"name": "services", "synced": true, "healthy": !blind}]})
    };
    assert_eq!(
        with(feed(true, false, false, None), true),
        (CheckStatus::Pass, CheckStatus::Pass)
    );
    assert_eq!(
        with(feed(true, true, false, None), true).0,
        CheckStatus::Warn
    );
    assert_eq!(
        with(feed(true, true, true, None), true).0,
        CheckStatus::Warn
    );
    assert_eq!(
        with(feed(true, true, true, Some("403")), true).0,
        CheckStatus::Fail
    );
    assert_eq!(
        with(json!(null), false),
        (CheckStatus::Pass, CheckStatus::Fail)
    );
}
