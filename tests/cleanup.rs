//! The clean-up path (`deploy/cleanup`): the command its DaemonSet runs,
//! with the privileges it declares, against what a guard with
//! `--on-exit keep` leaves behind. It waits for a guard that is still
//! stopping instead of pulling the pins from under it, then removes the
//! program, links and pins, and stays until deleted; if the guard never lets
//! go it fails, naming it, and removes nothing.

use std::time::Duration;

use testbed::{
    bed::{Bed, Bpffs, FOREIGN},
    wait_for, Daemon,
};

/// The clean-up container's arguments, with the pin directory moved to
/// `pin_dir`, and its capabilities.
fn cleanup_command(pin_dir: &str, wait: Option<&str>) -> (Vec<String>, Vec<String>) {
    let ds = testbed::deploy::documents("cleanup/uninstall-daemonset.yaml")
        .into_iter()
        .find(|v| v["kind"] == "DaemonSet")
        .expect("the clean-up DaemonSet");
    let c = &ds["spec"]["template"]["spec"]["containers"][0];
    let args = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .map(|a| match a.split_once('=') {
            Some(("--pin-dir", _)) => format!("--pin-dir={pin_dir}"),
            Some(("--wait", w)) => format!("--wait={}", wait.unwrap_or(w)),
            _ => a.to_owned(),
        })
        .collect();
    let caps = c["securityContext"]["capabilities"]["add"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_owned())
        .collect();
    (args, caps)
}

fn guarded(bed: &Bed) -> bool {
    let ip = FOREIGN.to_string();
    bed.peer.flush_neigh("eth0").unwrap();
    bed.peer.poke(&ip).unwrap();
    wait_for(Duration::from_secs(2), || {
        bed.peer.cached_mac("eth0", &ip).unwrap()
    })
    .is_none()
}

/// A guard as the DaemonSet runs it: pinned (on a private bpffs), left
/// attached when it exits.
fn pinned_guard(tag: &str) -> (Bed, Bpffs, std::path::PathBuf, Daemon) {
    testbed::require_root();
    let bed = Bed::new(tag).unwrap();
    let fs = Bpffs::new(tag).unwrap();
    let dir = fs.path().join("arp-guard");
    let guard = bed
        .start(&["--pin-dir", dir.to_str().unwrap(), "--on-exit", "keep"])
        .unwrap();
    (bed, fs, dir, guard)
}

#[test]
fn the_cleanup_waits_for_the_guard_then_removes_everything_and_stays() {
    let (bed, _fs, dir, mut guard) = pinned_guard("clean");
    let d = dir.to_str().unwrap();

    let (args, caps) = cleanup_command(d, None);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let wrapper = testbed::deploy::wrapper(&caps, true);
    let mut cleanup = Daemon::spawn_command(&bed.node, &wrapper, &args).unwrap();
    // The guard still runs: the clean-up waits and touches nothing.
    std::thread::sleep(Duration::from_millis(1500));
    assert!(dir.exists(), "{}", cleanup.log_text());
    assert!(guarded(&bed) && bed.guard_attached());
    assert_eq!(cleanup.count_log("removed"), 0, "{}", cleanup.log_text());

    // The guard's pod ends (rolling delete): it leaves everything behind...
    guard.stop(libc::SIGTERM, Duration::from_secs(10)).unwrap();
    // ...and the clean-up takes it away.
    cleanup.expect_log("waiting for SIGTERM", Duration::from_secs(10));
    let log = cleanup.log_text();
    // TCX links are pinned; without TCX the guard's netlink filter goes.
    let attachment = testbed::kernel::removed_attachment();
    assert!(
        log.contains(attachment) && log.contains("map_LB_IPS"),
        "{log}"
    );
    assert!(!dir.exists(), "{log}");
    assert!(!bed.guard_attached(), "{log}");
    assert!(!guarded(&bed), "nothing guards any more");
    // It stays (Ready) until the DaemonSet is deleted, then exits cleanly.
    assert!(
        cleanup.wait_exit(Duration::from_millis(500)).is_err(),
        "it stays"
    );
    let status = cleanup.stop(libc::SIGTERM, Duration::from_secs(5)).unwrap();
    assert!(status.success(), "{}", cleanup.log_text());
}

#[test]
fn the_cleanup_never_pulls_the_pins_from_a_running_guard() {
    let (bed, _fs, dir, guard) = pinned_guard("cleanrun");
    let d = dir.to_str().unwrap();
    let (args, caps) = cleanup_command(d, Some("1s"));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let wrapper = testbed::deploy::wrapper(&caps, true);
    let mut cleanup = Daemon::spawn_command(&bed.node, &wrapper, &args).unwrap();
    let status = cleanup.wait_exit(Duration::from_secs(10)).unwrap();
    let log = cleanup.log_text();
    assert!(!status.success(), "{log}");
    assert!(
        log.contains(&format!("arp-guard pid {} holds --pin-dir", guard.pid())),
        "names the guard: {log}"
    );
    assert!(dir.join("map_LB_IPS").exists() && bed.guard_attached());
    assert!(guarded(&bed), "the guard keeps guarding");
}
