//! The plugin builds for every laptop: its dependency tree, resolved by
//! cargo for each target krew ships (and Linux's), holds no Linux-only
//! crate — no aya, no netlink, not the daemon's crate, no libbpf. `cargo
//! tree --target T` resolves a target's tree without its standard library
//! installed; the compile itself for another target is `cargo xtask
//! check-targets`' (docs/testing.md).
//!
//! (Also: its being an integration test makes `cargo test --workspace`
//! build the `kubectl-arp_guard` binary, which tests/kubectl_plugin.rs runs
//! through kubectl.)

use std::process::Command;

/// What the plugin ships for, and Linux.
const TARGETS: [&str; 5] = [
    "x86_64-unknown-linux-gnu",
    "x86_64-apple-darwin",
    "aarch64-apple-darwin",
    "x86_64-pc-windows-msvc",
    "aarch64-pc-windows-msvc",
];

/// A crate that builds on Linux only: the eBPF loader and its family,
/// netlink, libbpf, and arp-guard's own Linux crates.
fn linux_only(name: &str) -> bool {
    name.starts_with("aya")
        || name.starts_with("netlink-")
        || name == "rtnetlink"
        || name.starts_with("libbpf")
        || [
            "guard",
            "guard-ebpf",
            "arp-guard-tests",
            "arp-guard-test-run",
        ]
        .contains(&name)
}

/// The crates of a `cargo tree --prefix none --format {p}` listing that
/// are Linux-only.
fn linux_only_in(tree: &str) -> Vec<String> {
    let mut found: Vec<String> = (tree.lines())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| linux_only(n))
        .map(str::to_owned)
        .collect();
    found.sort();
    found.dedup();
    found
}

/// The plugin's normal dependencies for `target`, one package a line.
fn tree(target: &str) -> String {
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    let out = Command::new(env!("CARGO"))
        .args(["tree", "--locked", "--manifest-path", manifest])
        .args([
            "-p",
            "kubectl-arp_guard",
            "-e",
            "normal",
            "--target",
            target,
        ])
        .args(["--prefix", "none", "--format", "{p}"])
        .output()
        .expect("running cargo tree");
    assert!(
        out.status.success(),
        "cargo tree --target {target}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn no_linux_only_crate_for_any_target() {
    for target in TARGETS {
        let t = tree(target);
        // The tree is the plugin's, with its client: not an empty answer.
        for want in ["guard-wire ", "kube-client ", "rustls "] {
            assert!(t.contains(want), "{target}: no {want:?} in\n{t}");
        }
        let bad = linux_only_in(&t);
        assert!(bad.is_empty(), "{target}: Linux-only crates {bad:?}");
    }
    // What each OS brings of its own shows the target was resolved.
    assert!(tree("x86_64-pc-windows-msvc").contains("windows-sys "));
    assert!(tree("aarch64-apple-darwin").contains("security-framework "));
}

#[test]
fn a_linux_only_crate_is_named() {
    let tree = "kubectl-arp_guard v0.1.0 (/w)\naya v0.14.0\nguard v0.1.0 (/w/guard)\n\
                netlink-packet-route v0.34.0\nguard-wire v0.1.0 (/w/guard-wire)\n\
                guard-common v0.1.0 (/w/guard-common)\nkube-client v5.0.0\naya v0.14.0 (*)";
    assert_eq!(
        linux_only_in(tree),
        ["aya", "guard", "netlink-packet-route"]
    );
}
