//! `cargo xtask check-targets`: the plugin compiled (`cargo check`) for an
//! operator's laptop other than this machine. No rustup target can be
//! fetched here, so std is rebuilt from source with the pinned nightly
//! (its rust-src, `-Zbuild-std`), as the arm64 image is; ring's C code is
//! compiled by the target's C compiler in its build script.
//!
//! - Windows (`x86_64-pc-windows-gnu`): Debian's mingw-w64 cross compiler
//!   (`gcc-mingw-w64-x86-64`, installed by `cargo xtask setup`). 64 s from
//!   cold on 2 cores, a second or two warm.
//! - macOS: not here. ring's C code includes the macOS SDK's headers
//!   (`TargetConditionals.h`, then libc's `assert.h`...), which only Apple
//!   ships; clang alone compiles for the target but has no SDK to compile
//!   against. Its dependency tree is resolved for macOS instead
//!   (`kubectl-arp_guard/tests/portable.rs`).
//!
//! Not part of `cargo xtask test`: a cold check costs a minute of CI's 2
//! cores, which its 20-minute budget does not have.

use std::{process::Command, time::Instant};

use anyhow::{bail, Result};

use crate::{setup, target_dir, workspace_root};

/// The target checked, and its C compiler (Debian's package).
pub const WINDOWS: &str = "x86_64-pc-windows-gnu";
pub const MINGW_GCC: &str = "x86_64-w64-mingw32-gcc";
pub const MINGW_AR: &str = "x86_64-w64-mingw32-ar";

/// The `cargo check` of the plugin for `WINDOWS`, with the nightly
/// `channel`.
pub fn windows_check(channel: &str) -> Command {
    let env_triple = WINDOWS.replace('-', "_");
    let mut c = Command::new("rustup");
    c.args(["run", channel, "cargo", "check"])
        .args(["-Zbuild-std=std,panic_abort", "--target", WINDOWS])
        .args(["--locked", "-p", "kubectl-arp_guard", "--all-targets"])
        .env(format!("CC_{env_triple}"), MINGW_GCC)
        .env(format!("AR_{env_triple}"), MINGW_AR)
        .env("CARGO_TARGET_DIR", target_dir())
        .current_dir(workspace_root());
    c
}

/// Check the plugin for Windows; say why macOS is not.
pub fn check_targets() -> Result<()> {
    if Command::new(MINGW_GCC).arg("--version").output().is_err() {
        bail!("checking for {WINDOWS} needs {MINGW_GCC} (Debian gcc-mingw-w64-x86-64): run `cargo xtask setup` as root");
    }
    let t = Instant::now();
    crate::run(&mut windows_check(&setup::ebpf_channel()?))?;
    eprintln!(
        "xtask check-targets: kubectl-arp_guard compiles for {WINDOWS} ({:.0} s); macOS is not \
         checked here (ring needs the macOS SDK's headers), its dependency tree is \
         (kubectl-arp_guard/tests/portable.rs)",
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// std from source for the target, ring's C by mingw, the plugin only.
    #[test]
    fn the_windows_check_rebuilds_std_and_compiles_c_with_mingw() {
        let c = windows_check("nightly");
        let args: Vec<String> = c.get_args().map(|a| a.to_string_lossy().into()).collect();
        for want in [
            "nightly",
            "-Zbuild-std=std,panic_abort",
            WINDOWS,
            "kubectl-arp_guard",
        ] {
            assert!(args.iter().any(|a| a == want), "{want} in {args:?}");
        }
        let env: Vec<(String, String)> = (c.get_envs())
            .filter_map(|(k, v)| Some((k.to_string_lossy().into(), v?.to_string_lossy().into())))
            .collect();
        assert!(
            env.contains(&("CC_x86_64_pc_windows_gnu".into(), MINGW_GCC.into())),
            "{env:?}"
        );
    }
}
