//! What the running kernel offers, for the tests that need a full kernel
//! (dummy, VLAN, bonding, IPVS, netem): the development machine's kernel
//! has none of them, the VM lane's Debian kernels have all of them
//! (`cargo xtask vm-test`). Outside the VM lane such a test says why it
//! did not run; inside it (`ARP_GUARD_VM` set) a missing feature fails the
//! test, so the lane cannot pass by skipping.

use crate::Netns;

/// The VM lane's kernel line ("6.1"), when the tests run inside it.
pub fn vm_lane() -> Option<String> {
    std::env::var("ARP_GUARD_VM").ok().filter(|s| !s.is_empty())
}

/// Whether a link of `kind` ("dummy", "vlan", "bond") can be created here.
pub fn has_link_kind(kind: &str) -> bool {
    let Ok(ns) = Netns::new("probe-kind") else {
        return false;
    };
    let args: Vec<&str> = match kind {
        "vlan" => {
            if ns
                .ip(&["link", "add", "p0", "type", "veth", "peer", "name", "p1"])
                .is_err()
            {
                return false;
            }
            vec![
                "link", "add", "link", "p0", "name", "p0.7", "type", "vlan", "id", "7",
            ]
        }
        other => vec!["link", "add", "probe0", "type", other],
    };
    ns.ip(&args).is_ok()
}

/// Whether IPVS is here (its netlink family answers `ipvsadm`).
pub fn has_ipvs() -> bool {
    let Ok(ns) = Netns::new("probe-ipvs") else {
        return false;
    };
    ns.exec(&["ipvsadm", "-L", "-n"]).is_ok()
}

/// Whether the netem qdisc is here.
pub fn has_netem() -> bool {
    let Ok(ns) = Netns::new("probe-netem") else {
        return false;
    };
    ns.exec(&[
        "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms",
    ])
    .is_ok()
}

/// Whether the test may go on: `ok`, else (outside the VM lane) a line
/// saying why it is skipped. Inside the VM lane a missing feature panics.
pub fn require(what: &str, ok: bool) -> bool {
    if ok {
        return true;
    }
    if let Some(lane) = vm_lane() {
        panic!("the VM lane ({lane}) must have {what}, and this kernel has not");
    }
    eprintln!("SKIPPED: this kernel has no {what}; the test runs in `cargo xtask vm-test`");
    false
}

/// Whether this kernel has TCX links (Linux 6.6): without them the guard
/// attaches as a netlink cls_bpf filter, which outlives its process and is
/// never pinned.
pub fn has_tcx() -> bool {
    at_least(6, 6)
}

/// Whether BPF memory is charged to the memory cgroup (Linux 5.11), not to
/// RLIMIT_MEMLOCK, which a process without CAP_SYS_RESOURCE cannot raise.
pub fn bpf_memcg_accounting() -> bool {
    at_least(5, 11)
}

fn at_least(major: u32, minor: u32) -> bool {
    let Ok(release) = std::fs::read_to_string("/proc/sys/kernel/osrelease") else {
        return false;
    };
    let mut parts = release.trim().split(['.', '-']);
    let ma: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let mi: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    (ma, mi) >= (major, minor)
}

/// What `arp-guard uninstall` reports for eth0's attachment: a TCX link's
/// pin, or (without TCX) the netlink filter, which has none.
pub fn removed_attachment() -> &'static str {
    if has_tcx() {
        "link_"
    } else {
        "removed the netlink filter from eth0"
    }
}
