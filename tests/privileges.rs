//! The daemon with exactly the privileges the DaemonSet grants: the
//! capabilities `deploy/base/daemonset.yaml` adds (after dropping ALL), as root in
//! the container, on a read-only root filesystem. Enforcement, `/metrics`,
//! `/readyz` and `arp-guard counters` must all work there, so that the
//! manifest and the code cannot drift apart.

use testbed::{
    bed::{Bed, Bpffs, FOREIGN, OWNED},
    guard_binary, Daemon,
};

/// The capabilities the DaemonSet's container adds, and whether its root
/// filesystem is read-only, as the manifest says.
fn daemonset_privileges() -> (Vec<String>, bool) {
    let s = testbed::deploy::security();
    (s.caps, s.read_only_root)
}

fn cap_eff(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("CapEff:")).unwrap();
    u64::from_str_radix(line["CapEff:".len()..].trim(), 16).unwrap()
}

#[test]
fn daemonset_privileges_enforce_and_serve_metrics_and_counters() {
    testbed::require_root();
    let (caps, read_only) = daemonset_privileges();
    assert!(
        read_only,
        "the DaemonSet runs with a read-only root filesystem"
    );
    let bed = Bed::new("priv").unwrap();
    let fs = Bpffs::new("priv").unwrap();
    let pins = fs.path().join("arp-guard");
    let pins_arg = pins.to_str().unwrap().to_owned();
    let args = bed.args(&["--pin-dir", &pins_arg]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut wrapper = testbed::deploy::wrapper(&caps, read_only);
    if !testbed::kernel::bpf_memcg_accounting() {
        // Before 5.11 (the VM lane's 5.10) BPF maps count against
        // RLIMIT_MEMLOCK, and these capabilities cannot raise it: the
        // daemon says so and names the fix...
        let run: Vec<&str> = std::iter::once("run").chain(args.iter().copied()).collect();
        let mut refused = Daemon::spawn_command(&bed.node, &wrapper, &run).unwrap();
        refused
            .wait_exit(std::time::Duration::from_secs(20))
            .unwrap();
        // Word for word what docs/troubleshooting.md quotes.
        testbed::quoted::assert_printed("memlock", &refused.log_text(), &[]);
        // ...which is what a container runtime with LimitMEMLOCK=infinity gives.
        let mut raised = vec![
            "prlimit".to_owned(),
            "--memlock=unlimited".to_owned(),
            "--".to_owned(),
        ];
        raised.append(&mut wrapper);
        wrapper = raised;
    }
    let guard = Daemon::start_wrapped(&bed.node, &wrapper, &args).unwrap();
    // The test itself must be right: exactly the manifest's capabilities.
    assert_eq!(
        cap_eff(guard.pid()),
        testbed::deploy::cap_bits(&caps),
        "the daemon runs with exactly {caps:?}"
    );

    // Enforcement: the neighbour learns the owned IP, never the foreign one.
    assert_eq!(
        bed.peer_learns(&[OWNED, FOREIGN]).unwrap(),
        [Some(bed.node_mac), None]
    );

    // The API: /metrics reads the kernel counters, /readyz is ready.
    testbed::deploy::assert_api_shows_the_foreign_drop(&bed.node);

    // `arp-guard counters` with the same privileges: through the API, then
    // (no daemon answering at that address) through the pins.
    let counters = |extra: &[&str]| {
        let mut cmd = testbed::deploy::wrapper(&caps, false);
        cmd.push(guard_binary().to_string_lossy().into_owned());
        cmd.extend(["counters", "-i", "eth0", "-o", "json"].map(str::to_owned));
        cmd.extend(extra.iter().map(|s| s.to_string()));
        let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
        bed.node.exec_output(&cmd).unwrap()
    };
    let dropped = |out: &std::process::Output| -> u64 {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["counters"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["lb_ip"] == FOREIGN.to_string() && r["verdict"] == "dropped")
            .map(|r| r["packets"].as_u64().unwrap())
            .sum()
    };
    assert!(dropped(&counters(&[])) >= 1, "through the API");
    assert!(
        dropped(&counters(&["--api", "127.0.0.1:1", "--pin-dir", &pins_arg])) >= 1,
        "through the pins"
    );
    // Neither: the error says what was tried and what the last way needs.
    let out = counters(&["--api", "127.0.0.1:1", "--pin-dir", "/nonexistent"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("127.0.0.1:1")
            && err.contains("/nonexistent")
            && err.contains("CAP_SYS_ADMIN"),
        "{err}"
    );
}
