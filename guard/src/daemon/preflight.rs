//! Checks made before touching the kernel, so that failures read as causes.

use anyhow::{bail, Result};

const CAP_NET_ADMIN: u32 = 12;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// The effective capability set of this process (bit n: capability n).
pub fn effective_caps() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("CapEff:"))?;
    u64::from_str_radix(line["CapEff:".len()..].trim(), 16).ok()
}

/// Loading and attaching needs CAP_NET_ADMIN plus CAP_BPF and CAP_PERFMON
/// (or CAP_SYS_ADMIN, which implies both on older kernels).
pub fn check_capabilities() -> Result<()> {
    let Some(caps) = effective_caps() else {
        // No /proc: let the kernel say no, with explain_load_error's help.
        return Ok(());
    };
    let has = |c: u32| caps & (1u64 << c) != 0;
    let mut missing = Vec::new();
    if !has(CAP_NET_ADMIN) {
        missing.push("CAP_NET_ADMIN");
    }
    if !has(CAP_SYS_ADMIN) {
        if !has(CAP_BPF) {
            missing.push("CAP_BPF");
        }
        if !has(CAP_PERFMON) {
            missing.push("CAP_PERFMON");
        }
    }
    if !missing.is_empty() {
        // SAFETY: geteuid has no preconditions.
        let uid = unsafe { libc::geteuid() };
        bail!(
            "arp-guard must run as root or with CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN \
             (uid {uid} lacks {}); in Kubernetes add them to the container's securityContext",
            missing.join(", ")
        );
    }
    Ok(())
}

/// This node's name: the flag or $NODE_NAME (clap fills both), else the hostname.
pub fn node_name(given: Option<String>) -> Result<String> {
    let name = match given.filter(|n| !n.trim().is_empty()) {
        Some(n) => n.trim().to_owned(),
        None => std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_default(),
    };
    if name.is_empty() {
        bail!("cannot tell this node's name: pass --node-name or set NODE_NAME");
    }
    // A name no owner can match would turn every owned IP into `foreign`.
    if let Err(why) = crate::model::ownership::check_node_name(&name) {
        bail!("node name {name:?} is not a valid Kubernetes node name ({why}); pass --node-name or set NODE_NAME");
    }
    Ok(name)
}
