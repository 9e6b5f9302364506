//! A guard that does not start. Each way the daemon exits at start
//! (CrashLoopBackOff), and each reason it runs but is not Ready, brought
//! about with the real daemon in a throwaway namespace, and what it prints
//! held word for word to what docs/troubleshooting.md quotes for it
//! (`testbed::quoted`: a change on either side fails here). The paths and
//! addresses the page gives are the DaemonSet's; each test puts them in
//! place of its own before comparing.

use std::time::Duration;

use testbed::{
    bed::{Bed, Bpffs, NODE},
    deploy, guard_binary,
    quoted::{self, assert_printed, daemonset_arg},
    Daemon, Netns,
};

/// Every message the page quotes, each held to the daemon by a test here
/// (`memlock`, `kernel-old` and `kernel-no-bpf` to the code's text, as no
/// lane here brings them about; tests/privileges.rs shows the daemon
/// printing `memlock` in the 5.10 lane).
const HELD: &[&str] = &[
    "capabilities",
    "net-raw",
    "memlock",
    "kernel-old",
    "kernel-no-bpf",
    "bpffs",
    "port",
    "pins-locked",
    "ownership-missing",
    "ownership-invalid",
    "setting",
    "same-device",
    "ipv6-metrics",
    "kube-config",
    "no-uplink",
    "not-matched",
    "not-synced",
];

/// The page quotes no message that no test holds, and each test's message
/// is on the page.
#[test]
fn every_message_the_page_quotes_is_held_by_a_test() {
    let on_page = quoted::ids();
    let mut sorted = on_page.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), on_page.len(), "an id twice: {on_page:?}");
    for id in &on_page {
        assert!(HELD.contains(&id.as_str()), "no test holds `{id}`");
    }
    for id in HELD {
        assert!(on_page.iter().any(|p| p == id), "the page lost `{id}`");
    }
}

/// `arp-guard run <args>` in `ns` under `wrapper`; it must exit non-zero
/// by itself. Its output (log and error).
fn exits(ns: &Netns, wrapper: &[String], args: &[String]) -> String {
    let run: Vec<&str> = std::iter::once("run")
        .chain(args.iter().map(String::as_str))
        .collect();
    let mut d = Daemon::spawn_command(ns, wrapper, &run).unwrap();
    // A deadline for "it exits", not a bound on how fast.
    let status = d.wait_exit(Duration::from_secs(120)).unwrap();
    assert!(!status.success(), "arp-guard {run:?} should fail");
    d.log_text()
}

/// The bed's usual arguments with the ownership file at `owners`, then `extra`.
fn args(owners: &std::path::Path, extra: &[&str]) -> Vec<String> {
    let owners = owners.to_str().unwrap();
    let mut a: Vec<String> = [
        "-i",
        "eth0",
        "--node-name",
        NODE,
        "--ownership-file",
        owners,
    ]
    .map(str::to_owned)
    .to_vec();
    a.extend(["--lb-ips-from", "kube-ipvs0"].map(str::to_owned));
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

/// The test's ownership file read as the DaemonSet's.
fn as_daemonset(path: &std::path::Path) -> [(String, String); 1] {
    let file = daemonset_arg("--ownership-file");
    [(path.to_str().unwrap().to_owned(), file)]
}

fn subs(pairs: &[(String, String)]) -> Vec<(&str, &str)> {
    pairs
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect()
}

#[test]
fn without_its_capabilities_it_names_them() {
    testbed::require_root();
    let bed = Bed::new("su-caps").unwrap();
    // Every capability dropped, none added back.
    let log = exits(&bed.node, &deploy::wrapper(&[], true), &bed.args(&[]));
    assert_printed("capabilities", &log, &[]);

    // Without NET_RAW, enforce mode cannot re-send held announcements.
    let caps: Vec<String> = (deploy::security().caps.into_iter())
        .filter(|c| c != "NET_RAW")
        .collect();
    let mut wrapper = Vec::new();
    if !testbed::kernel::bpf_memcg_accounting() {
        wrapper.extend(["prlimit", "--memlock=unlimited", "--"].map(str::to_owned));
    }
    wrapper.extend(deploy::wrapper(&caps, true));
    let log = exits(&bed.node, &wrapper, &bed.args(&["--mode", "enforce"]));
    assert_printed("net-raw", &log, &[]);
}

/// The kernel refusals no lane here can bring about (a kernel before 5.10,
/// one without BPF; RLIMIT_MEMLOCK only before 5.11): the page quotes the
/// code's own text. (tests/privileges.rs shows the daemon printing the
/// RLIMIT_MEMLOCK one on 5.10.)
#[test]
fn the_kernels_refusals_are_the_codes_text() {
    let code = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../guard/src/datapath/error.rs"),
    )
    .unwrap();
    for id in ["memlock", "kernel-old", "kernel-no-bpf"] {
        let lines = quoted::quote(id);
        let text = (lines[0].strip_prefix("arp-guard: error: "))
            .and_then(|l| l.strip_suffix(": …"))
            .unwrap_or_else(|| panic!("`{id}`: arp-guard: error: MESSAGE: …, not {lines:?}"));
        assert!(
            code.contains(&format!("#[error(\"{text}\")]")),
            "`{id}` quotes {text:?}, which guard/src/datapath/error.rs does not write"
        );
    }
}

/// The DaemonSet's pin directory where the node has no bpffs: the pod
/// cannot mount one (no CAP_SYS_ADMIN). A tmpfs stands in for /sys/fs/bpf,
/// in a mount namespace of the daemon's own.
#[test]
fn without_bpffs_it_says_to_mount_one() {
    testbed::require_root();
    let bed = Bed::new("su-bpffs").unwrap();
    let mut wrapper: Vec<String> = ["unshare", "--mount", "--propagation", "private", "--"]
        .map(str::to_owned)
        .to_vec();
    let script = "mount -t tmpfs tmpfs /sys/fs/bpf && exec \"$@\"";
    wrapper.extend(["sh", "-c", script, "sh"].map(str::to_owned));
    wrapper.extend(deploy::daemonset_wrapper());
    let pins = daemonset_arg("--pin-dir");
    assert!(pins.starts_with("/sys/fs/bpf/"), "{pins}");
    let log = exits(&bed.node, &wrapper, &bed.args(&["--pin-dir", &pins]));
    assert_printed("bpffs", &log, &[]);
}

#[test]
fn a_port_in_use_is_named() {
    testbed::require_root();
    let bed = Bed::new("su-port").unwrap();
    let listen = daemonset_arg("--listen");
    let addr = listen.clone();
    let _held = (bed.node)
        .enter(move || Ok(std::net::TcpListener::bind(addr.as_str())?))
        .unwrap();
    let log = exits(&bed.node, &[], &bed.args(&["--listen", &listen]));
    assert_printed("port", &log, &[]);
}

/// A second daemon on the pins, in a pid namespace of its own as another
/// pod's would be (so it cannot tell the first one's pid).
#[test]
fn a_second_daemon_on_the_pins_is_refused() {
    testbed::require_root();
    let fs = Bpffs::new("su-pins").unwrap();
    let bed = Bed::new("su-pins").unwrap();
    let pins = fs.path().join("arp-guard").to_str().unwrap().to_owned();
    let _first = bed.start(&["--pin-dir", &pins]).unwrap();
    let wrapper = ["unshare", "--pid", "--fork", "--mount-proc", "--"].map(str::to_owned);
    let second = bed.args(&["--pin-dir", &pins, "--listen", "none"]);
    let log = exits(&bed.node, &wrapper, &second);
    let ds = [(pins, daemonset_arg("--pin-dir"))];
    assert_printed("pins-locked", &log, &subs(&ds));
}

#[test]
fn a_missing_or_invalid_ownership_file_is_named() {
    testbed::require_root();
    let bed = Bed::new("su-file").unwrap();
    let absent = bed.dir.path().join("absent").join("owners.yaml");
    let log = exits(&bed.node, &[], &args(&absent, &[]));
    assert_printed("ownership-missing", &log, &subs(&as_daemonset(&absent)));

    let typo = "version: 1\nips:\n  - ip: 198.51.100.10\n    onwer: node-b\n";
    bed.replace_owners(typo).unwrap();
    let log = exits(&bed.node, &[], &bed.args(&[]));
    assert_printed("ownership-invalid", &log, &subs(&as_daemonset(&bed.owners)));
}

/// Settings of `arp-guard-config` the daemon does not take, and the
/// metrics address an IPv6 node's POD_IP makes.
#[test]
fn a_setting_it_does_not_take_is_named() {
    testbed::require_root();
    let bed = Bed::new("su-set").unwrap();
    let log = exits(&bed.node, &[], &bed.args(&["--mode=enforcing"]));
    assert_printed("setting", &log, &[]);
    let same = args(&bed.owners, &[]);
    let same: Vec<String> = (same.iter())
        .map(|a| {
            if a == "kube-ipvs0" {
                "eth0".into()
            } else {
                a.clone()
            }
        })
        .collect();
    let log = exits(&bed.node, &[], &same);
    assert_printed("same-device", &log, &[]);
    let log = exits(
        &bed.node,
        &[],
        &bed.args(&["--metrics-listen=fd00::11:9478"]),
    );
    assert_printed("ipv6-metrics", &log, &[]);
}

/// In a Pod without its service account token: the in-cluster variables
/// are there (the kubelet sets them), the token's directory is not.
#[test]
fn without_a_service_account_token_it_says_so() {
    testbed::require_root();
    let bed = Bed::new("su-token").unwrap();
    let home = format!("HOME={}", bed.dir.path().join("home").display());
    let wrapper = [
        "env",
        "-u",
        "KUBECONFIG",
        &home,
        "KUBERNETES_SERVICE_HOST=10.96.0.1",
        "KUBERNETES_SERVICE_PORT=443",
    ]
    .map(str::to_owned);
    let log = exits(&bed.node, &wrapper, &bed.args(&["--announcer", "metallb"]));
    assert_printed("kube-config", &log, &[]);
}

/// `arp-guard status` in `ns`, as the page has the operator run it.
fn status(ns: &Netns) -> String {
    ns.exec(&[guard_binary().to_str().unwrap(), "status"])
        .unwrap()
}

/// Running, not Ready: an uplink named that is not there; the feed not
/// synced (its API unreachable).
#[test]
fn not_ready_says_why() {
    testbed::require_root();
    let bed = Bed::new("su-ready").unwrap();
    let eno1: Vec<String> = (bed.args(&[]).into_iter())
        .map(|a| if a == "eth0" { "eno1".into() } else { a })
        .collect();
    let eno1: Vec<&str> = eno1.iter().map(String::as_str).collect();
    let guard = Daemon::start(&bed.node, &eno1).unwrap();
    assert_printed("not-matched", &status(&bed.node), &[]);
    drop(guard);

    let kubeconfig = bed.dir.path().join("unreachable.kubeconfig");
    std::fs::write(&kubeconfig, unreachable_kubeconfig()).unwrap();
    let k = kubeconfig.to_str().unwrap();
    let _guard = bed
        .start(&["--announcer", "metallb", "--kubeconfig", k])
        .unwrap();
    assert_printed("not-synced", &status(&bed.node), &[]);
}

/// `--interface auto` on a node where nothing qualifies: loopback and
/// kube-ipvs0 only, no default route, no Node object to read.
#[test]
fn no_uplink_found_says_what_was_looked_at() {
    testbed::require_root();
    let ns = Netns::new("su-auto").unwrap();
    testbed::netns::kube_ipvs0(&ns, &[]).unwrap();
    let dir = testbed::bed::TempDir::new("su-auto").unwrap();
    let owners = dir.path().join("owners.yaml");
    std::fs::write(&owners, testbed::bed::default_owners()).unwrap();
    let a: Vec<String> = (args(&owners, &[]).into_iter())
        .map(|a| if a == "eth0" { "auto".into() } else { a })
        .collect();
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    let _guard = Daemon::start(&ns, &a).unwrap();
    assert_printed("no-uplink", &status(&ns), &[]);
}

/// A kubeconfig whose server nothing answers (a closed port on the
/// namespace's own loopback).
fn unreachable_kubeconfig() -> &'static str {
    "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:1\n\
     contexts:\n- name: c\n  context: {cluster: c, user: u}\ncurrent-context: c\n\
     users:\n- name: u\n  user: {}\n"
}
