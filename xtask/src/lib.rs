//! Project automation: tool-chain set-up, the container image, the
//! plugin's krew manifest (the incident lab lives in the test bed,
//! `testbed::lab`).

use std::{path::PathBuf, process::Command};

use anyhow::{bail, Context as _, Result};

pub mod bench;
pub mod image;
pub mod krew;
pub mod oci;
pub mod phases;
pub mod promtool;
pub mod setup;
pub mod slots;
pub mod suite;
pub mod targets;
pub mod vm;

/// The workspace's root directory.
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

/// `$CARGO_TARGET_DIR`, else the workspace's `target/`.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// The cargo that runs xtask, in the workspace root. Every build of guard
/// it starts shares one directory for the BPF object's nested build
/// (guard/build.rs): the release and the dev build compile it once.
pub fn cargo() -> Command {
    let mut c = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    c.current_dir(workspace_root())
        .env("ARP_GUARD_BPF_BUILD_DIR", target_dir().join("bpf"));
    c
}

/// Run a command, echoing it; fail with its status.
pub fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("xtask: running {cmd:?}");
    let status = cmd.status().with_context(|| format!("spawning {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed with {status}");
    }
    Ok(())
}
