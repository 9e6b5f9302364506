use anyhow::{anyhow, Context as _};
use aya_build::{Package, Toolchain};

fn main() -> anyhow::Result<()> {
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
    aya_build::build_ebpf([ebpf_package], Toolchain::Custom(&channel))
}
