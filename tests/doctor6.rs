//! `arp-guard doctor`'s IPv6 checks run for real in the IPv6 bed's node
//! namespace, each verdict checked against what the node's kernel does with
//! a Neighbor Solicitation from the peer: a proxy entry for an LB IP is
//! answered only with proxy_ndp on and the uplink forwarding (fail, then a
//! dormant warning), and a VIP added while another node still holds it ends
//! dadfailed and unanswered (fail, its IPv6 LB IPs from the running guard).

use std::{net::Ipv6Addr, process::Output, time::Duration};

use serde_json::Value;
use testbed::{
    bed6::{wait_advert, Bed6, FOREIGN6, FOREIGN6_ON_EGRESS, UNKNOWN6_ON_EGRESS},
    guard_binary, wait_for, Netns, RawSocket,
};

/// One doctor run: exit code and the JSON report.
struct Run {
    code: i32,
    report: Value,
}

impl Run {
    #[track_caller]
    fn expect(&self, name: &str, subject: Option<&str>, status: &str) -> &Value {
        let c = self.report["checks"]
            .as_array()
            .expect("checks")
            .iter()
            .find(|c| c["check"] == name && c["subject"].as_str() == subject)
            .unwrap_or_else(|| panic!("no check {name} {subject:?} in {:#}", self.report));
        assert_eq!(c["status"], status, "{name} {subject:?}: {c:#}");
        c
    }
}

fn doctor(ns: &Netns, args: &[&str]) -> Run {
    let bin = guard_binary();
    let mut cmd = vec![
        bin.to_str().unwrap(),
        "doctor",
        "-o",
        "json",
        "--no-cluster",
    ];
    cmd.extend(args);
    let out: Output = ns.exec_output(&cmd).expect("running doctor");
    let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "doctor {args:?}: not JSON ({e}); stdout:\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    Run {
        code: out.status.code().unwrap_or(-1),
        report,
    }
}

/// Whether the node's kernel answers the peer's solicitation for `target`.
fn kernel_answers(bed: &Bed6, target: Ipv6Addr) -> bool {
    let tx = RawSocket::open(&bed.peer, "eth0").unwrap();
    let cap = RawSocket::open(&bed.peer, "eth0").unwrap();
    cap.drain();
    tx.send(&bed.solicit_from_peer(target)).unwrap();
    wait_advert(&cap, target, Duration::from_secs(2))
        .unwrap()
        .is_some()
}

/// The node routes IPv6; proxy_ndp off; DAD on (set, not inherited).
fn sysctls(node: &Netns) {
    for conf in ["all", "eth0"] {
        node.sysctl(&format!("net.ipv6.conf.{conf}.forwarding"), "1")
            .unwrap();
        node.sysctl(&format!("net.ipv6.conf.{conf}.proxy_ndp"), "0")
            .unwrap();
        node.sysctl(&format!("net.ipv6.conf.{conf}.accept_dad"), "1")
            .unwrap();
    }
}

const NO_GUARD: [&str; 4] = ["--pin-dir", "/nonexistent", "-i", "eth0"];

#[test]
fn a_proxy_entry_for_an_lb_ip_fails_where_the_kernel_answers_it() {
    testbed::require_root();
    let bed = Bed6::new("doc6p").unwrap();
    sysctls(&bed.node);
    let r = doctor(&bed.node, &NO_GUARD);
    let v6 = r.expect("ipv6", None, "pass");
    assert_eq!(
        v6["value"], "3 IPv6 LB IPs (fd00:1::101, fd00:1::102, fd00:1::103)",
        "kube-ipvs0's: {v6}"
    );
    let p = r.expect("proxy_ndp", Some("eth0"), "pass");
    assert_eq!(p["value"], "off (all 0, eth0 0; eth0 forwarding 1)");
    r.expect("ipv6_forwarding", None, "pass");
    r.expect("accept_dad", Some("eth0"), "pass");
    assert!(
        !kernel_answers(&bed, FOREIGN6),
        "kube-ipvs0's: not answered"
    );

    // What a speaker or an operator might configure: the kernel answers.
    bed.node
        .sysctl("net.ipv6.conf.eth0.proxy_ndp", "1")
        .unwrap();
    bed.node
        .ip(&[
            "-6",
            "neigh",
            "add",
            "proxy",
            &FOREIGN6.to_string(),
            "dev",
            "eth0",
        ])
        .unwrap();
    assert!(
        kernel_answers(&bed, FOREIGN6),
        "the proxy entry is answered"
    );
    let r = doctor(&bed.node, &NO_GUARD);
    assert_eq!(r.code, 1, "{:#}", r.report);
    let p = r.expect("proxy_ndp", Some("eth0"), "fail");
    assert_eq!(
        p["value"],
        "on (all 0, eth0 1; eth0 forwarding 1); proxy entries for LB IPs: fd00:1::102"
    );

    // eth0 no longer forwards: the kernel stops answering, the entry is dormant.
    bed.node
        .sysctl("net.ipv6.conf.eth0.forwarding", "0")
        .unwrap();
    assert!(
        !kernel_answers(&bed, FOREIGN6),
        "not a router on eth0: no proxy answer"
    );
    let r = doctor(&bed.node, &NO_GUARD);
    let p = r.expect("proxy_ndp", Some("eth0"), "warn");
    assert!(p["why"].as_str().unwrap().contains("dormant"), "{p}");
    // ... and answers as a host there while the node routes.
    r.expect("ipv6_forwarding", None, "warn");
}

#[test]
fn a_vip_added_while_another_node_holds_it_ends_dadfailed() {
    testbed::require_root();
    let bed = Bed6::new("doc6d").unwrap();
    sysctls(&bed.node);
    // The VIP moves to the node while the peer still holds it (a kube-vip
    // leader change that left it behind).
    let vip = format!("{FOREIGN6_ON_EGRESS}/128");
    bed.node
        .ip(&["-6", "addr", "del", &vip, "dev", "eth0"])
        .unwrap();
    bed.peer
        .ip(&["-6", "addr", "add", &vip, "dev", "eth0", "nodad"])
        .unwrap();
    bed.node
        .ip(&["-6", "addr", "add", &vip, "dev", "eth0"])
        .unwrap();
    let failed = wait_for(Duration::from_secs(10), || {
        let a = bed.node.ip(&["-6", "addr", "show", "dev", "eth0"]).unwrap();
        a.contains("dadfailed").then_some(a)
    });
    assert!(failed.is_some(), "DAD did not fail");
    // The kernel answers for the VIP that passed (nodad), not this one.
    assert!(kernel_answers(&bed, UNKNOWN6_ON_EGRESS));
    assert!(
        !kernel_answers(&bed, FOREIGN6_ON_EGRESS),
        "dadfailed: unanswered"
    );

    // The VIPs are known to doctor from the running guard's API.
    let _guard = bed.start(&[]).unwrap();
    let r = doctor(&bed.node, &[]);
    assert_eq!(r.code, 1, "{:#}", r.report);
    let d = r.expect("accept_dad", Some("eth0"), "fail");
    assert_eq!(
        d["value"],
        "on (all 1, eth0 1); LB IPs on eth0: fd00:1::104 nodad, fd00:1::105 dadfailed"
    );
    assert!(d["why"].as_str().unwrap().contains("kube-vip #523"), "{d}");
    // Deleted and added again once the other holder let go: it passes.
    bed.peer
        .ip(&["-6", "addr", "del", &vip, "dev", "eth0"])
        .unwrap();
    bed.node
        .ip(&["-6", "addr", "del", &vip, "dev", "eth0"])
        .unwrap();
    bed.node
        .ip(&["-6", "addr", "add", &vip, "dev", "eth0"])
        .unwrap();
    let settled = wait_for(Duration::from_secs(10), || {
        let a = bed.node.ip(&["-6", "addr", "show", "dev", "eth0"]).unwrap();
        (!a.contains("tentative")).then_some(())
    });
    assert!(settled.is_some(), "DAD did not end");
    let r = doctor(&bed.node, &[]);
    let d = r.expect("accept_dad", Some("eth0"), "pass");
    assert_eq!(
        d["value"],
        "on (all 1, eth0 1); LB IPs on eth0: fd00:1::104 nodad, fd00:1::105 done"
    );
}

/// With the guard's API out of reach, doctor reads the guard's IPv6 LB IPs
/// from its pins, as it reads the IPv4 ones: the IPs the ownership file
/// gives it, none of them on an LB interface doctor is told to look at.
#[test]
fn the_guard_s_ipv6_lb_ips_are_read_from_its_pins() {
    testbed::require_root();
    let bed = Bed6::new("d6-pins").unwrap();
    let fs = testbed::bed::Bpffs::new("d6-pins").unwrap();
    let pins = fs.path().join("arp-guard");
    let pins = pins.to_str().unwrap();
    let _guard = bed.start(&["--pin-dir", pins]).unwrap();
    let r = doctor(
        &bed.node,
        &[
            "--api",
            "127.0.0.1:1",
            "--pin-dir",
            pins,
            "--lb-ips-from",
            "none0",
            "-i",
            "eth0",
        ],
    );
    let c = r.expect("ipv6", None, "pass");
    let value = c["value"].as_str().unwrap();
    // The file's five (the first four named).
    assert!(value.starts_with("5 IPv6 LB IPs"), "{c:#}");
    for ip in [FOREIGN6, UNKNOWN6_ON_EGRESS] {
        assert!(value.contains(&ip.to_string()), "{ip} in {c:#}");
    }
}
