//! Builds guard-ebpf for the BPF target (aya-build: the pinned nightly and
//! bpf-linker) and leaves the object in OUT_DIR.
//!
//! aya-build passes every line of the nested cargo's output up as
//! `cargo:warning=`, so a good build would print some sixty "warnings" that
//! are not. The build therefore runs in a second process of this build
//! script, whose output is read here: cargo's instructions
//! (`rerun-if-changed` and the like) go through unchanged; the nested build's
//! lines are printed only when it fails (all of them, on stderr, which cargo
//! shows under the failed build script) or when
//! `ARP_GUARD_BUILD_VERBOSE=1` asks for them (as warnings, as before).

use std::process::{Command, ExitCode};

use anyhow::{anyhow, Context as _};
use aya_build::{Package, Toolchain};

/// Set in the second process: it runs the build itself.
const INNER: &str = "ARP_GUARD_BUILD_INNER";
/// Print the nested build's output also when it succeeds.
const VERBOSE: &str = "ARP_GUARD_BUILD_VERBOSE";
/// A directory for the nested build to keep its target directory in,
/// shared by every build of guard that names it (`cargo xtask` names one:
/// its release and dev builds then build the BPF object, always `--release`
/// for bpfel, once; each build compiled `core` for bpfel again, half a
/// minute before guard itself could start to compile). Unset: OUT_DIR.
const SHARED: &str = "ARP_GUARD_BPF_BUILD_DIR";

fn main() -> ExitCode {
    if std::env::var_os(INNER).is_some() {
        return match build_ebpf() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                // aya-build relays the nested cargo's stderr from a thread
                // it does not join when the build fails: give it a moment
                // to pass on the last lines (cargo's own error among them).
                std::thread::sleep(std::time::Duration::from_millis(200));
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    println!("cargo:rerun-if-env-changed={VERBOSE}");
    println!("cargo:rerun-if-env-changed={SHARED}");
    let verbose = std::env::var(VERBOSE).is_ok_and(|v| v == "1" || v == "true");
    match relay(verbose) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Run the build in a second process and pass its output on as described
/// at the top of this file.
fn relay(verbose: bool) -> anyhow::Result<()> {
    let me = std::env::current_exe().context("the build script's own path")?;
    let out = Command::new(&me)
        .env(INNER, "1")
        .output()
        .with_context(|| format!("running {}", me.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut said = Vec::new();
    for line in stdout.lines() {
        match line.strip_prefix("cargo:warning=") {
            Some(text) => said.push(text),
            None => println!("{line}"),
        }
    }
    if !out.status.success() {
        for line in &said {
            eprintln!("{line}");
        }
        eprint!("{}", String::from_utf8_lossy(&out.stderr));
        return Err(anyhow!(
            "building guard-ebpf for BPF failed ({}); its output is above",
            out.status
        ));
    }
    if verbose {
        for line in &said {
            println!("cargo:warning={line}");
        }
    }
    Ok(())
}

fn build_ebpf() -> anyhow::Result<()> {
    let cargo_metadata::Metadata { packages, .. } = cargo_metadata::MetadataCommand::new()
        .no_deps()
        .exec()
        .context("MetadataCommand::exec")?;
    let ebpf_package = packages
        .into_iter()
        .find(|cargo_metadata::Package { name, .. }| name.as_str() == "guard-ebpf")
        .ok_or_else(|| anyhow!("guard-ebpf package not found"))?;
    let cargo_metadata::Package {
        name,
        manifest_path,
        ..
    } = ebpf_package;
    let root_dir = manifest_path
        .parent()
        .ok_or_else(|| anyhow!("no parent for {manifest_path}"))?
        .as_str();
    let ebpf_package = Package {
        name: name.as_str(),
        root_dir,
        ..Default::default()
    };
    // The channel is pinned in one place: guard-ebpf/rust-toolchain.toml.
    let toolchain_file = std::path::Path::new(root_dir).join("rust-toolchain.toml");
    println!("cargo:rerun-if-changed={}", toolchain_file.display());
    let text = std::fs::read_to_string(&toolchain_file)
        .with_context(|| format!("reading {}", toolchain_file.display()))?;
    let channel = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("channel"))
        .and_then(|rest| rest.trim().strip_prefix('='))
        .map(|v| v.trim().trim_matches('"').to_owned())
        .ok_or_else(|| anyhow!("no channel in {}", toolchain_file.display()))?;
    let Some(shared) = std::env::var_os(SHARED).map(std::path::PathBuf::from) else {
        return aya_build::build_ebpf([ebpf_package], Toolchain::Custom(&channel));
    };
    // aya-build puts its target directory and the objects under OUT_DIR:
    // point it at the shared directory, then copy the objects into ours.
    // The lock keeps a second build from rewriting an object while this
    // one copies it.
    let out = std::env::var_os("OUT_DIR").ok_or_else(|| anyhow!("OUT_DIR not set"))?;
    std::fs::create_dir_all(&shared).with_context(|| format!("creating {}", shared.display()))?;
    let lock = std::fs::File::create(shared.join(".lock"))?;
    lock.lock().context("locking the shared BPF build")?;
    // Single-threaded here (set_var is sound); aya-build reads OUT_DIR.
    std::env::set_var("OUT_DIR", &shared);
    aya_build::build_ebpf([ebpf_package], Toolchain::Custom(&channel))?;
    for entry in std::fs::read_dir(&shared)? {
        let path = entry?.path();
        if path.is_file() && path.file_name() != Some(".lock".as_ref()) {
            let to = std::path::Path::new(&out).join(path.file_name().unwrap_or_default());
            std::fs::copy(&path, &to)
                .with_context(|| format!("copying {} to {}", path.display(), to.display()))?;
        }
    }
    Ok(())
}
