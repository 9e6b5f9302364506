//! `arp-guard doctor` run for real inside the test bed's node namespace
//! (its /proc/sys/net and /sys/class/net are the namespace's): each verdict
//! is read from `-o json` and, where the kernel can show it, checked against
//! what the kernel does (a neighbour resolving an LB IP on kube-ipvs0).

use std::{process::Output, time::Duration};

use serde_json::{json, Value};
use testbed::{
    bed::{Bed, Bpffs, TempDir, FOREIGN},
    fake_api::{FakeApi, Fault, Resource},
    guard_binary, netns, wait_for, Netns,
};

/// One doctor run: exit code, the JSON report, stderr.
struct Run {
    code: i32,
    report: Value,
    stderr: String,
}

impl Run {
    /// The check `name` (on `subject`), panicking with the whole report.
    #[track_caller]
    fn check(&self, name: &str, subject: Option<&str>) -> &Value {
        self.report["checks"]
            .as_array()
            .expect("checks")
            .iter()
            .find(|c| c["check"] == name && c["subject"].as_str() == subject)
            .unwrap_or_else(|| panic!("no check {name} {subject:?} in {:#}", self.report))
    }

    /// Assert the status of a check; returns it for more.
    #[track_caller]
    fn expect(&self, name: &str, subject: Option<&str>, status: &str) -> &Value {
        let c = self.check(name, subject);
        assert_eq!(c["status"], status, "{name} {subject:?}: {c:#}");
        c
    }
}

/// `arp-guard doctor -o json <args>` in `ns`, under `wrapper` (setpriv...).
fn doctor_as(ns: &Netns, wrapper: &[String], args: &[&str]) -> Run {
    let mut cmd: Vec<String> = wrapper.to_vec();
    cmd.push(guard_binary().to_string_lossy().into_owned());
    cmd.extend(["doctor", "-o", "json"].map(str::to_owned));
    cmd.extend(args.iter().map(|s| s.to_string()));
    let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
    let out: Output = ns.exec_output(&cmd).expect("running doctor");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "doctor {args:?}: not JSON ({e}); stdout:\n{}\nstderr:\n{stderr}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    Run {
        code: out.status.code().unwrap_or(-1),
        report,
        stderr,
    }
}

fn doctor(ns: &Netns, args: &[&str]) -> Run {
    doctor_as(ns, &[], args)
}

/// The kernel defaults that cause the incident, set explicitly (a new
/// namespace inherits the host's values).
fn incident_sysctls(ns: &Netns, ifaces: &[&str]) {
    ns.sysctl("net.ipv4.ip_forward", "1").unwrap();
    for iface in std::iter::once("all").chain(ifaces.iter().copied()) {
        for key in ["arp_ignore", "arp_announce", "rp_filter"] {
            ns.sysctl(&format!("net.ipv4.conf.{iface}.{key}"), "0")
                .unwrap();
        }
    }
}

/// Does the node's kernel answer ARP for `ip` (the peer resolves it)?
fn kernel_answers(bed: &Bed, ip: &str) -> bool {
    bed.peer.flush_neigh("eth0").unwrap();
    bed.peer.poke(ip).unwrap();
    wait_for(Duration::from_millis(1500), || {
        bed.peer.cached_mac("eth0", ip).unwrap()
    })
    .is_some()
}

const NO_GUARD: [&str; 4] = ["--no-cluster", "--pin-dir", "/nonexistent", "-i"];

#[test]
fn strict_arp_off_fails_where_the_kernel_answers() {
    testbed::require_root();
    let bed = Bed::new("doc-off").unwrap();
    incident_sysctls(&bed.node, &["eth0"]);
    let r = doctor(&bed.node, &[&NO_GUARD[..], &["eth0"]].concat());
    assert_eq!(r.code, 1, "a failed check exits 1: {}", r.stderr);
    let ai = r.expect("arp_ignore", Some("eth0"), "fail");
    assert_eq!(ai["value"], "0 (all 0, eth0 0)");
    assert!(ai["fix"].as_str().unwrap().contains("strictARP"), "{ai}");
    r.expect("arp_announce", Some("eth0"), "fail");
    let lb = r.expect("lb_addresses", Some("kube-ipvs0"), "fail");
    assert_eq!(
        lb["value"],
        "3 (198.51.100.101, 198.51.100.102, 198.51.100.103)"
    );
    r.expect("kube_proxy", None, "skip");
    r.expect("guard", None, "warn");
    r.expect("attached", Some("eth0"), "skip");
    r.expect("ip_forward", None, "pass");
    r.expect("lan_interface", None, "pass");
    r.expect("tcx", None, "pass");
    // No default route in the bed: off-subnet clients get no reply.
    r.expect("rp_filter", Some("eth0"), "warn");
    assert!(
        r.stderr.contains("arp_ignore eth0") && r.stderr.contains("lb_addresses kube-ipvs0"),
        "{}",
        r.stderr
    );
    // What the verdict says is what the kernel does.
    assert!(kernel_answers(&bed, &FOREIGN.to_string()));

    // The table: one line per check, the same verdicts.
    let out = bed
        .node
        .exec_output(&[
            guard_binary().to_str().unwrap(),
            "doctor",
            "--no-cluster",
            "-i",
            "eth0",
        ])
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("FAIL  arp_ignore eth0") && l.contains("Fix: ")),
        "{table}"
    );
    let checks = r.report["checks"].as_array().unwrap().len();
    assert_eq!(table.lines().count(), checks + 1, "{table}");
}

#[test]
fn strict_arp_like_sysctls_pass_and_the_kernel_keeps_quiet() {
    testbed::require_root();
    let bed = Bed::new("doc-on").unwrap();
    incident_sysctls(&bed.node, &["eth0"]);
    // What kube-proxy's strictARP writes: conf/all only.
    bed.node
        .sysctl("net.ipv4.conf.all.arp_ignore", "1")
        .unwrap();
    bed.node
        .sysctl("net.ipv4.conf.all.arp_announce", "2")
        .unwrap();
    let r = doctor(&bed.node, &[&NO_GUARD[..], &["eth0"]].concat());
    assert_eq!(r.code, 0, "warnings only: {:#}", r.report);
    let ai = r.expect("arp_ignore", Some("eth0"), "pass");
    assert_eq!(ai["value"], "1 (all 1, eth0 0)");
    assert_eq!(
        r.expect("arp_announce", Some("eth0"), "pass")["value"],
        "2 (all 2, eth0 0)"
    );
    r.expect("lb_addresses", Some("kube-ipvs0"), "pass");
    assert!(!kernel_answers(&bed, &FOREIGN.to_string()));

    // The interface's own value counts as much as all's (the maximum).
    bed.node
        .sysctl("net.ipv4.conf.all.arp_ignore", "0")
        .unwrap();
    bed.node
        .sysctl("net.ipv4.conf.eth0.arp_ignore", "1")
        .unwrap();
    let r = doctor(&bed.node, &[&NO_GUARD[..], &["eth0"]].concat());
    assert_eq!(
        r.expect("arp_ignore", Some("eth0"), "pass")["value"],
        "1 (all 0, eth0 1)"
    );
    assert!(!kernel_answers(&bed, &FOREIGN.to_string()));
}

#[test]
fn rp_filter_on_one_interface_against_the_route_back() {
    testbed::require_root();
    let bed = Bed::new("doc-rp").unwrap();
    // A second leg: eth1 on 203.0.113.0/25, clients behind 203.0.113.1.
    netns::veth(&bed.node, "eth1", &bed.peer, "eth1").unwrap();
    bed.node
        .ip(&["addr", "add", "203.0.113.11/25", "dev", "eth1"])
        .unwrap();
    bed.peer
        .ip(&["addr", "add", "203.0.113.1/25", "dev", "eth1"])
        .unwrap();
    bed.node
        .ip(&[
            "route",
            "add",
            "203.0.113.128/25",
            "via",
            "203.0.113.1",
            "dev",
            "eth1",
        ])
        .unwrap();
    incident_sysctls(&bed.node, &["eth0", "eth1"]);
    bed.node
        .sysctl("net.ipv4.conf.eth0.rp_filter", "1")
        .unwrap();
    let clients = ["--client", "203.0.113.200", "--client", "198.51.100.50"];

    let r = doctor(
        &bed.node,
        &[&NO_GUARD[..], &["eth0", "-i", "eth1"], &clients].concat(),
    );
    let rp = r.expect("rp_filter", Some("eth0"), "fail");
    let value = rp["value"].as_str().unwrap();
    assert!(value.starts_with("1, strict (all 0, eth0 1)"), "{value}");
    assert!(
        value.contains("route back to 203.0.113.200: 203.0.113.128/25 via 203.0.113.1 dev eth1"),
        "{value}"
    );
    assert!(
        value.contains("route back to 198.51.100.50: 198.51.100.0/24 dev eth0"),
        "{value}"
    );
    // eth1 filters nothing; its clients come and go by eth1 (the other is asymmetric).
    let r1 = doctor(
        &bed.node,
        &[&NO_GUARD[..], &["eth1", "--client", "203.0.113.200"]].concat(),
    );
    r1.expect("rp_filter", Some("eth1"), "pass");

    // The maximum: all=2 makes eth0 loose; asymmetric, accepted: warn.
    bed.node.sysctl("net.ipv4.conf.all.rp_filter", "2").unwrap();
    let r = doctor(
        &bed.node,
        &[&NO_GUARD[..], &["eth0", "--client", "203.0.113.200"]].concat(),
    );
    let rp = r.expect("rp_filter", Some("eth0"), "warn");
    assert!(
        rp["value"]
            .as_str()
            .unwrap()
            .starts_with("2, loose (all 2, eth0 1)"),
        "{rp}"
    );
}

#[test]
fn a_running_guard_covers_kube_ipvs0() {
    testbed::require_root();
    let bed = Bed::new("doc-guard").unwrap();
    incident_sysctls(&bed.node, &["eth0"]);
    let fs = Bpffs::new("doc-guard").unwrap();
    let pins = fs.path().join("arp-guard");
    let pins = pins.to_str().unwrap();
    let _guard = bed.start(&["--pin-dir", pins]).unwrap();

    // No -i: the interfaces come from the running guard.
    let r = doctor(&bed.node, &["--no-cluster", "--pin-dir", pins]);
    assert_eq!(r.code, 0, "{:#}", r.report);
    assert_eq!(r.report["interfaces"], json!(["eth0"]));
    assert_eq!(
        r.report["interfaces_from"],
        "the running guard's interfaces"
    );
    let ai = r.expect("arp_ignore", Some("eth0"), "warn");
    assert!(
        ai["why"].as_str().unwrap().contains("arp-guard (enforce)"),
        "{ai}"
    );
    let lb = r.expect("lb_addresses", Some("kube-ipvs0"), "pass");
    assert!(
        lb["value"]
            .as_str()
            .unwrap()
            .contains("arp-guard covers all"),
        "{lb}"
    );
    r.expect("guard", None, "pass");
    let how = if testbed::kernel::has_tcx() {
        "yes (tcx)"
    } else {
        "yes (netlink-clsact)"
    };
    assert_eq!(r.expect("attached", Some("eth0"), "pass")["value"], how);
    let chain = if testbed::kernel::has_tcx() {
        "first of 1 TCX program(s)"
    } else {
        "netlink filter, first (no TCX programs)"
    };
    assert_eq!(r.expect("tc_chain", Some("eth0"), "pass")["value"], chain);
    r.expect("mode", None, "pass");
    r.expect("feed", None, "pass");
    r.expect("bpffs", None, "pass");
    // The kernel still answers; the guard drops the reply for the foreign IP.
    assert!(!kernel_answers(&bed, &FOREIGN.to_string()));

    // The API elsewhere: the pins still show the guard, its IPs and mode.
    let r = doctor(
        &bed.node,
        &["--no-cluster", "--api", "127.0.0.1:1", "--pin-dir", pins],
    );
    assert_eq!(r.code, 0, "{:#}", r.report);
    // Without TCX nothing is pinned per interface (a netlink filter has no
    // pin): the doctor falls back to the interfaces that have addresses.
    let from = if testbed::kernel::has_tcx() {
        "the guard's pinned links"
    } else {
        "interfaces with an IPv4 address"
    };
    assert_eq!(r.report["interfaces_from"], from);
    let g = r.expect("guard", None, "warn");
    assert!(g["value"].as_str().unwrap().contains("heartbeat"), "{g}");
    r.expect("lb_addresses", Some("kube-ipvs0"), "pass");
    r.expect("attached", Some("eth0"), "pass");
    r.expect("arp_ignore", Some("eth0"), "warn");
    r.expect("mode", None, "pass");
    r.expect("feed", None, "skip");

    // With the DaemonSet's capabilities: everything but the TCX chain's names
    // (where the kernel has TCX).
    let caps = testbed::deploy::security().caps;
    let r = doctor_as(
        &bed.node,
        &testbed::deploy::wrapper(&caps, false),
        &["--no-cluster", "--pin-dir", pins],
    );
    assert_eq!(r.code, 0, "{:#} {}", r.report, r.stderr);
    if testbed::kernel::has_tcx() {
        let tc = r.expect("tc_chain", Some("eth0"), "skip");
        assert!(
            tc["why"].as_str().unwrap().contains("CAP_SYS_ADMIN"),
            "{tc}"
        );
    } else {
        // No TCX program can exist; the netlink chain needs no privilege.
        r.expect("tc_chain", Some("eth0"), "pass");
    }
    r.expect("attached", Some("eth0"), "pass");
    r.expect("lb_addresses", Some("kube-ipvs0"), "pass");

    // Without any privilege: no crash, and it says what it could not see.
    let nobody: Vec<String> =
        "setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all --bounding-set=-all"
            .split(' ')
            .map(str::to_owned)
            .collect();
    let r = doctor_as(&bed.node, &nobody, &["--no-cluster", "--pin-dir", pins]);
    assert!(r.code == 0 || r.code == 1, "{} {}", r.code, r.stderr);
    r.expect("guard", None, "pass");
    r.expect("tc_chain", Some("eth0"), "skip");
    r.expect("arp_ignore", Some("eth0"), "warn");
    let r = doctor_as(
        &bed.node,
        &nobody,
        &[
            "--no-cluster",
            "--api",
            "127.0.0.1:1",
            "--pin-dir",
            pins,
            "-i",
            "eth0",
        ],
    );
    assert!(r.code == 0 || r.code == 1, "{} {}", r.code, r.stderr);
    let g = r.expect("guard", None, "warn");
    assert!(g["why"].as_str().unwrap().contains("pins"), "{g}");
}

#[test]
fn monitor_mode_does_not_cover() {
    testbed::require_root();
    let bed = Bed::new("doc-mon").unwrap();
    incident_sysctls(&bed.node, &["eth0"]);
    let _guard = bed.start(&["--mode", "monitor"]).unwrap();
    let r = doctor(&bed.node, &["--no-cluster", "--pin-dir", "/nonexistent"]);
    assert_eq!(r.code, 1, "{:#}", r.report);
    let ai = r.expect("arp_ignore", Some("eth0"), "fail");
    assert!(ai["why"].as_str().unwrap().contains("monitor mode"), "{ai}");
    r.expect("mode", None, "warn");
    r.expect("attached", Some("eth0"), "pass");
    // Monitor only counts: the neighbour learns the foreign IP.
    assert!(kernel_answers(&bed, &FOREIGN.to_string()));
}

#[test]
fn kube_proxy_configmap_from_the_api() {
    testbed::require_root();
    let bed = Bed::new("doc-kp").unwrap();
    incident_sysctls(&bed.node, &["eth0"]);
    let api = FakeApi::start(&bed.node, "127.0.0.1:0".parse().unwrap()).unwrap();
    let dir = TempDir::new("doc-kp").unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, api.kubeconfig()).unwrap();
    let kc = kubeconfig.to_str().unwrap();
    let configmap = |strict: bool| {
        json!({
            "metadata": {"name": "kube-proxy", "namespace": "kube-system"},
            "data": {"config.conf": format!(
                "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n\
                 ipvs:\n  strictARP: {strict}\n  scheduler: \"\"\nmode: ipvs\n"
            )}
        })
    };
    let args = [
        "--kubeconfig",
        kc,
        "--pin-dir",
        "/nonexistent",
        "-i",
        "eth0",
    ];
    api.apply(Resource::ConfigMaps, configmap(false));
    let r = doctor(&bed.node, &args);
    let kp = r.expect("kube_proxy", None, "warn");
    assert_eq!(kp["value"], "mode ipvs, strictARP false");
    assert_eq!(r.report["checks"][0]["check"], "kube_proxy", "first");

    api.apply(Resource::ConfigMaps, configmap(true));
    r_expect(&bed.node, &args, "pass", "mode ipvs, strictARP true");
    api.delete(Resource::ConfigMaps, "kube-system", "kube-proxy");
    let r = doctor(&bed.node, &args);
    let kp = r.expect("kube_proxy", None, "skip");
    assert!(kp["why"].as_str().unwrap().contains("no ConfigMap"), "{kp}");

    api.apply(Resource::ConfigMaps, configmap(true));
    api.set_fault(Resource::ConfigMaps, Some(Fault::Status(403)));
    let answered = std::time::Instant::now();
    let r = doctor(&bed.node, &args);
    // What a run costs on this machine when the API answers at once.
    let answered = answered.elapsed();
    let kp = r.expect("kube_proxy", None, "skip");
    assert!(
        kp["why"].as_str().unwrap().contains("403 Forbidden"),
        "{kp}"
    );
    assert!(
        kp["fix"]
            .as_str()
            .unwrap()
            .contains("configmaps/kube-proxy"),
        "{kp}"
    );
    api.set_fault(Resource::ConfigMaps, None);

    // An API that never answers costs at most the timeout: measured against
    // the run above on the same machine (the VM lane's emulated CPUs make
    // every run slower), at most 4 s more (the 1 s timeout and slack).
    api.set_blackhole(true);
    let started = std::time::Instant::now();
    let r = doctor(&bed.node, &[&args[..], &["--kube-timeout", "1s"]].concat());
    let blind = started.elapsed();
    assert!(
        blind < answered + Duration::from_secs(4),
        "{blind:?} with the API silent, {answered:?} with it answering"
    );
    let kp = r.expect("kube_proxy", None, "skip");
    assert!(
        kp["why"]
            .as_str()
            .unwrap()
            .contains("not answering in time"),
        "{kp}"
    );
    api.set_blackhole(false);
}

#[track_caller]
fn r_expect(ns: &Netns, args: &[&str], status: &str, value: &str) {
    let r = doctor(ns, args);
    assert_eq!(r.expect("kube_proxy", None, status)["value"], value);
}
