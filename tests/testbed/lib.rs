//! Test bed for arp-guard: throwaway network namespaces joined by veth pairs,
//! raw Ethernet frames in and out, neighbour caches, and the daemon as a child
//! process. Used by the integration tests and by `cargo xtask lab` (the lab
//! itself is [`lab`]).
//!
//! Everything created here is removed on drop, also when a test panics:
//! namespaces (and with them every interface inside), and child processes.
//! Nothing is ever created in, or connected to, the root namespace.

pub mod alarm_rounds;
pub mod alerting;
pub mod bed;
pub mod bed6;
pub mod bench;
pub mod cluster_bed;
pub mod container;
pub mod daemon;
pub mod dashboard;
pub mod deploy;
pub mod fake_api;
pub mod frames;
pub mod go_peer;
pub mod http;
pub mod kernel;
pub mod kubelet;
pub mod lab;
pub mod laptop;
mod neigh;
pub mod netns;
pub mod packet;
pub mod promtool;
pub mod proxy;
pub mod quoted;
pub mod scrape;
pub mod segment;
pub mod stale_client;
pub mod takeover;
pub mod tc;

pub use daemon::{Daemon, EventTail};
pub use frames::{ip_bytes, nd_bytes, ArpSpec, Captured};
pub use http::get as http_get;
pub use netns::Netns;
pub use packet::RawSocket;

/// Where to find the `arp-guard` binary: `$ARP_GUARD_BIN`, else next to the
/// running test binary's target directory.
pub fn guard_binary() -> std::path::PathBuf {
    built_binary("ARP_GUARD_BIN", "arp-guard")
}

/// Where to find `kubectl-arp_guard`, the plugin's binary (a crate of its
/// own): `$ARP_GUARD_PLUGIN`, else next to the running test binary's
/// target directory (`cargo test --workspace` builds it there: its crate
/// has integration tests).
pub fn plugin_binary() -> std::path::PathBuf {
    built_binary("ARP_GUARD_PLUGIN", "kubectl-arp_guard")
}

/// `$var`, else `name` in the running test binary's target directory.
fn built_binary(var: &str, name: &str) -> std::path::PathBuf {
    if let Some(p) = std::env::var_os(var) {
        return p.into();
    }
    let exe = std::env::current_exe().expect("current_exe");
    // target/<profile>/deps/<test> or target/<profile>/<bin>
    let mut dir = exe.parent().expect("exe dir").to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir.join(name)
}

/// The integration tests create namespaces and load BPF programs.
/// A counter or gauge of the guard's `/metrics` in `ns` (its API on the
/// loopback), by its whole series (`name{labels}`); 0 when absent.
pub fn counter(ns: &Netns, series: &str) -> f64 {
    let (_, text) = ns
        .enter(|| Ok(http_get("127.0.0.1:9477", "/metrics")))
        .expect("entering the namespace");
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    assert_eq!(uid, 0, "this test needs root (network namespaces, BPF)");
}

/// Make `path` a FIFO (for tests where nobody ever writes it).
pub fn mkfifo(path: &std::path::Path) {
    let c = std::ffi::CString::new(path.to_str().expect("UTF-8 path")).expect("no NUL");
    // SAFETY: mkfifo with a valid NUL-terminated path.
    let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
    assert_eq!(rc, 0, "mkfifo {path:?}");
}

/// Replace `path` with `content` whole, atomically, as ConfigMap updates
/// and editors do: written beside it (`.NAME.tmp`), then renamed over it, so
/// that a reader never finds it missing or half written.
pub fn replace_file(path: &std::path::Path, content: &str) -> std::io::Result<()> {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    std::fs::write(&tmp, content)?;
    std::fs::rename(&tmp, path)
}

/// The `p` quantile (0.0..=1.0) of an ascending, non-empty sample.
pub fn percentile<T: Copy>(sorted: &[T], p: f64) -> T {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Poll `f` every 20 ms until it holds or `timeout` passes; whether it held.
pub fn wait_until(timeout: std::time::Duration, mut f: impl FnMut() -> bool) -> bool {
    wait_for(timeout, || f().then_some(())).is_some()
}

/// Poll `f` every 20 ms until it returns `Some` or `timeout` passes.
pub fn wait_for<T>(timeout: std::time::Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if std::time::Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
