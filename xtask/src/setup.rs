//! `cargo xtask setup`: install what building and testing arp-guard needs.
//! Idempotent: every step first checks whether it is already done.

use std::process::Command;

use anyhow::{bail, Context as _, Result};

use crate::run;

/// The bpf-linker release whose LLVM matches the pinned nightly's LLVM 22.
pub const BPF_LINKER_VERSION: &str = "0.13.0";
pub const LLVM_PREFIX: &str = "/usr/lib/llvm-22";
/// The commit date of the nightly the eBPF build was checked with.
pub const NIGHTLY_DATE: &str = "2026-05-19";

/// The channel pinned in guard-ebpf/rust-toolchain.toml (guard/build.rs
/// reads the same line).
pub fn ebpf_channel() -> Result<String> {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../guard-ebpf/rust-toolchain.toml");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .find_map(|l| l.trim().strip_prefix("channel"))
        .and_then(|rest| rest.trim().strip_prefix('='))
        .map(|v| v.trim().trim_matches('"').to_owned())
        .with_context(|| format!("no channel in {}", path.display()))
}

/// Debian packages and a file each one provides (checked before installing).
const PACKAGES: &[(&str, &str)] = &[
    ("llvm-22-dev", "/usr/lib/llvm-22/bin/llvm-config"),
    ("iproute2", "/usr/sbin/ip"),
    ("bpftool", "/usr/sbin/bpftool"),
    ("ethtool", "/usr/sbin/ethtool"),
    // nft: tests/alternatives.rs (the nftables `arp` table beside the guard).
    ("nftables", "/usr/sbin/nft"),
    // benches/alternatives.rs: throughput on the guarded veth.
    ("iperf3", "/usr/bin/iperf3"),
    ("util-linux", "/usr/bin/setpriv"),
    // scripts/shape.py: the layering check `cargo xtask test` runs first.
    ("python3", "/usr/bin/python3"),
    // tests/image.rs: the image in a container runtime. podman with runc
    // (crun fails on hosts with hybrid cgroups); containers-common's
    // seccomp.json is the base of the test's RuntimeDefault-like profile.
    ("podman", "/usr/bin/podman"),
    ("runc", "/usr/sbin/runc"),
    (
        "golang-github-containers-common",
        "/usr/share/containers/seccomp.json",
    ),
    // `cargo xtask image`: the CA bundle the image ships.
    ("ca-certificates", "/etc/ssl/certs/ca-certificates.crt"),
    // `cargo xtask image --arch arm64`: cross linker and C compiler (ring),
    // static glibc for arm64, and qemu-user to smoke-run the binary.
    ("gcc-aarch64-linux-gnu", "/usr/bin/aarch64-linux-gnu-gcc"),
    ("libc6-dev-arm64-cross", "/usr/aarch64-linux-gnu/lib/libc.a"),
    ("qemu-user-static", "/usr/bin/qemu-aarch64-static"),
    // `cargo xtask check-targets`: the C cross compiler for Windows (ring).
    ("gcc-mingw-w64-x86-64", "/usr/bin/x86_64-w64-mingw32-gcc"),
    // `cargo xtask vm-test`: the emulator, ipvsadm for the guest (copied in
    // with its libraries), objcopy and xz to strip binaries and unpack modules.
    ("qemu-system-x86", "/usr/bin/qemu-system-x86_64"),
    ("ipvsadm", "/usr/sbin/ipvsadm"),
    ("binutils", "/usr/bin/objcopy"),
    ("xz-utils", "/usr/bin/xz"),
    // tests/go_peer.rs: the Go peer (tests/go/apipeer), Go's own net/http
    // as kube-apiserver serves a watch, built from the standard library.
    ("golang-go", "/usr/bin/go"),
    // tests/proxy.rs: the API server reached through real proxies, HTTP
    // CONNECT with Basic credentials and SOCKS5 with a user and password.
    ("tinyproxy", "/usr/bin/tinyproxy"),
    ("microsocks", "/usr/bin/microsocks"),
];

fn ok(cmd: &mut Command) -> bool {
    cmd.stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn output(cmd: &mut Command) -> Option<String> {
    cmd.output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
}

/// Every step in order; each is a no-op when already done.
pub fn setup() -> Result<()> {
    // LLVM first: bpf-linker builds against it. The other packages install
    // while bpf-linker compiles (dpkg waits on the disk, the compile uses
    // the CPU: on a fresh machine the two took 50 s and 65 s one after the
    // other).
    let (llvm_dev, others) = PACKAGES.split_at(1);
    install_packages(llvm_dev)?;
    let llvm = check_nightly()?;
    std::thread::scope(|s| {
        let others = s.spawn(|| install_packages(others));
        let linker = install_bpf_linker();
        let others = others
            .join()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("installing packages panicked")));
        linker.and(others)
    })?;
    // promtool (tests/manifests.rs checks the alerting rules with it).
    crate::promtool::install()?;
    eprintln!("xtask setup: toolchain ready (nightly LLVM {llvm}, bpf-linker {BPF_LINKER_VERSION}, rust-src)");
    Ok(())
}

/// Those of `packages` (of [`PACKAGES`]) that are missing (root only).
fn install_packages(packages: &[(&str, &str)]) -> Result<()> {
    let missing: Vec<&str> = packages
        .iter()
        .filter(|(_, file)| !std::path::Path::new(file).exists())
        .map(|(pkg, _)| *pkg)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!(
            "missing Debian packages {missing:?}; run `cargo xtask setup` as root to install them"
        );
    }
    // The package index is read once per run (setup installs in two steps).
    static UPDATED: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    if UPDATED.get().is_none() {
        run(Command::new("apt-get").args(["update", "-qq"]))?;
        let _ = UPDATED.set(());
    }
    // RUNLEVEL=1: invoke-rc.d starts no service a package ships (tinyproxy
    // would listen in the root namespace); the tests start their own.
    run(Command::new("apt-get")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .env("RUNLEVEL", "1"))
}

/// The nightly toolchain that builds the eBPF crate, as pinned in
/// guard-ebpf/rust-toolchain.toml, with rust-src. It is preinstalled and
/// must not float: bpf-linker's LLVM has to be at least its LLVM. Returns
/// that LLVM's version.
fn check_nightly() -> Result<String> {
    let channel = ebpf_channel()?;
    let nightly = output(Command::new("rustup").args(["run", &channel, "rustc", "-vV"]))
        .with_context(|| {
            format!("the `{channel}` toolchain is missing (rustup toolchain list); it builds the eBPF program")
        })?;
    let llvm = nightly
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version: "))
        .unwrap_or("?")
        .to_owned();
    if !llvm.starts_with("22.") {
        bail!("the {channel} toolchain uses LLVM {llvm}; bpf-linker {BPF_LINKER_VERSION} is built against LLVM 22 (see guard-ebpf/rust-toolchain.toml)");
    }
    let date = nightly
        .lines()
        .find_map(|l| l.strip_prefix("commit-date: "))
        .unwrap_or("?");
    if date != NIGHTLY_DATE {
        eprintln!("xtask setup: warning: the {channel} toolchain is from {date}; the eBPF build was checked with {NIGHTLY_DATE}");
    }
    let has_src = output(Command::new("rustup").args([
        "component",
        "list",
        "--toolchain",
        &channel,
        "--installed",
    ]))
    .is_some_and(|o| o.lines().any(|l| l.starts_with("rust-src")));
    if !has_src {
        run(Command::new("rustup").args([
            "component",
            "add",
            "rust-src",
            "--toolchain",
            &channel,
        ]))?;
    }
    Ok(llvm)
}

/// bpf-linker, built against the system's LLVM 22.
fn install_bpf_linker() -> Result<()> {
    let linker_ok = output(Command::new("bpf-linker").arg("--version"))
        .is_some_and(|v| v.contains(BPF_LINKER_VERSION));
    if !linker_ok {
        run(Command::new("cargo")
            .args([
                "install",
                "bpf-linker",
                "--version",
                BPF_LINKER_VERSION,
                "--locked",
                "--no-default-features",
                "--features",
                "llvm-22",
            ])
            .env("LLVM_PREFIX", LLVM_PREFIX))?;
    }
    if !ok(Command::new("bpf-linker").arg("--version")) {
        bail!("bpf-linker is installed but not on PATH; add ~/.cargo/bin to PATH");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    /// `setup` installs the first package alone, before bpf-linker builds
    /// against it, and the others beside that build.
    #[test]
    fn llvm_is_the_package_installed_first() {
        assert_eq!(super::PACKAGES[0].0, "llvm-22-dev");
        assert!(super::PACKAGES[1..]
            .iter()
            .all(|(p, _)| !p.starts_with("llvm")));
    }
}
