//! The daemon with exactly the privileges the DaemonSet grants: the
//! capabilities `deploy/daemonset.yaml` adds (after dropping ALL), as root in
//! the container, on a read-only root filesystem. Enforcement, `/metrics`,
//! `/readyz` and `arp-guard counters` must all work there, so that the
//! manifest and the code cannot drift apart.

use std::time::Duration;

use testbed::{
    bed::{Bed, Bpffs, FOREIGN, OWNED},
    guard_binary, wait_for, Daemon,
};

/// The capabilities the DaemonSet's container adds, and whether its root
/// filesystem is read-only, as the manifest says.
fn daemonset_privileges() -> (Vec<String>, bool) {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/daemonset.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    for v in serde_saphyr::from_str_multiple::<serde_json::Value, Vec<_>>(&text).unwrap() {
        if v["kind"] != "DaemonSet" {
            continue;
        }
        let sc = &v["spec"]["template"]["spec"]["containers"][0]["securityContext"];
        let drop: Vec<&str> = sc["capabilities"]["drop"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_str().unwrap())
            .collect();
        assert_eq!(drop, ["ALL"], "the DaemonSet drops every capability first");
        let add = sc["capabilities"]["add"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_str().unwrap().to_owned())
            .collect();
        return (add, sc["readOnlyRootFilesystem"].as_bool() == Some(true));
    }
    panic!("no DaemonSet in {path}");
}

/// A command prefix that runs its arguments like the container runtime
/// would: root, bounding (and so permitted and effective) set reduced to
/// `caps`, and, if asked, `/` remounted read-only in a private mount namespace.
fn wrapper(caps: &[String], read_only: bool) -> Vec<String> {
    let bounding = std::iter::once("-all".to_owned())
        .chain(caps.iter().map(|c| format!("+{}", c.to_ascii_lowercase())))
        .collect::<Vec<_>>()
        .join(",");
    let mut w: Vec<String> = Vec::new();
    if read_only {
        w.extend(
            [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "--",
                "sh",
                "-c",
                "mount -o remount,bind,ro / && exec \"$@\"",
                "sh",
            ]
            .map(str::to_owned),
        );
    }
    w.extend([
        "setpriv".to_owned(),
        format!("--bounding-set={bounding}"),
        "--inh-caps=-all".to_owned(),
        "--".to_owned(),
    ]);
    w
}

/// The bits of `CapEff` for capability names like "BPF".
fn cap_bits(caps: &[String]) -> u64 {
    caps.iter()
        .map(|c| match c.as_str() {
            "NET_ADMIN" => 1u64 << 12,
            "SYS_ADMIN" => 1 << 21,
            "PERFMON" => 1 << 38,
            "BPF" => 1 << 39,
            other => panic!("add {other} to the test's capability table"),
        })
        .fold(0, |a, b| a | b)
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
    let guard = Daemon::start_wrapped(&bed.node, &wrapper(&caps, read_only), &args).unwrap();
    // The test itself must be right: exactly the manifest's capabilities.
    assert_eq!(
        cap_eff(guard.pid()),
        cap_bits(&caps),
        "the daemon runs with exactly {caps:?}"
    );

    // Enforcement: the neighbour learns the owned IP, never the foreign one.
    bed.peer.flush_neigh("eth0").unwrap();
    for ip in [OWNED, FOREIGN] {
        bed.peer.poke(&ip.to_string()).unwrap();
    }
    let learned = wait_for(Duration::from_secs(3), || {
        bed.peer.cached_mac("eth0", &OWNED.to_string()).unwrap()
    });
    assert_eq!(learned, Some(bed.node_mac));
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        bed.peer.cached_mac("eth0", &FOREIGN.to_string()).unwrap(),
        None
    );

    // The API: /metrics reads the kernel counters, /readyz is ready.
    let get = |path: &'static str| {
        bed.node
            .enter(move || guard::testing::get("127.0.0.1:9477".parse().unwrap(), path))
            .unwrap()
    };
    let (code, metrics) = get("/metrics");
    assert_eq!(code, 200, "{metrics}");
    let series = format!(
        "arp_guard_arp_frames_total{{lb_ip=\"{FOREIGN}\",interface=\"eth0\",kind=\"reply\",origin=\"kernel\",state=\"foreign\",verdict=\"dropped\"}}"
    );
    assert!(metrics.contains(&series), "{metrics}");
    assert_eq!(get("/readyz"), (200, "ready\n".to_owned()));

    // `arp-guard counters` with the same privileges: through the API, then
    // (no daemon answering at that address) through the pins.
    let counters = |extra: &[&str]| {
        let mut cmd = wrapper(&caps, false);
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
