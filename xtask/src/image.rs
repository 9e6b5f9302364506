//! `cargo xtask image`: static binaries and a reproducible OCI image archive
//! holding only them (see [`crate::oci`]), without a registry, a daemon or a
//! base image. The top-level `Dockerfile` builds the same image where a
//! registry is at hand; keep the two in step (path, user, labels, flags).
//!
//! Binaries: statically linked glibc (`-C target-feature=+crt-static`, a
//! static-pie). The musl rust-std cannot be installed offline; glibc's static
//! getaddrinfo still resolves through /etc/hosts and DNS (files and dns are
//! built into libc since 2.34), which is all a pod needs. The native
//! architecture builds on the stable toolchain; another one needs its
//! rust-std, and where rustup cannot fetch it, std is rebuilt from source with
//! the pinned nightly (`-Zbuild-std`) and linked with Debian's cross gcc. The
//! eBPF object inside is the same for every architecture (guard/build.rs).
//!
//! Every binary is checked before it goes into the image: an ELF of the right
//! machine, no program interpreter, and `--version` and `validate` run (under
//! qemu-user for a foreign architecture).

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{bail, ensure, Context as _, Result};

use crate::{cargo, oci, setup, target_dir, workspace_root};

/// Flags for every image binary: static, no symbols (RUSTFLAGS of the target
/// only, so build scripts and proc-macros stay dynamic). The Dockerfile uses
/// the same.
pub const RUSTFLAGS: &str = "-C target-feature=+crt-static -C strip=symbols";
/// Where the binary lives in the image (the Dockerfile's COPY and ENTRYPOINT).
pub const IMAGE_PATH: &str = "/usr/local/bin/arp-guard";
/// The image's default user: root. `run` needs CAP_BPF, CAP_PERFMON,
/// CAP_NET_ADMIN and CAP_NET_RAW, and a non-root process loses capabilities it does not get
/// from file capabilities at execve (Kubernetes sets no ambient set); file
/// capabilities with the effective bit make the binary refuse to start
/// (EPERM at execve) wherever the bounding set lacks one of them, even for
/// `--version`. The DaemonSet drops every other capability and sets
/// allowPrivilegeEscalation: false.
pub const DEFAULT_USER: &str = "0:0";
/// The CA bundle: Debian's ca-certificates, taken from the build machine
/// (the Dockerfile's build stage) into the same path of the image, where
/// the Kubernetes client looks for roots when a kubeconfig names no CA (an
/// API server with a publicly signed certificate).
pub const CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// An architecture the image can hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Arch {
    Amd64,
    Arm64,
}

impl Arch {
    pub fn oci(self) -> &'static str {
        match self {
            Arch::Amd64 => "amd64",
            Arch::Arm64 => "arm64",
        }
    }
    /// The GNU/Rust CPU name.
    pub fn cpu(self) -> &'static str {
        match self {
            Arch::Amd64 => "x86_64",
            Arch::Arm64 => "aarch64",
        }
    }
    pub fn triple(self) -> String {
        format!("{}-unknown-linux-gnu", self.cpu())
    }
    /// ELF e_machine.
    fn elf_machine(self) -> u16 {
        match self {
            Arch::Amd64 => 62,
            Arch::Arm64 => 183,
        }
    }
    fn is_native(self) -> bool {
        std::env::consts::ARCH == self.cpu()
    }
    /// Debian's cross tools for this architecture (gcc-<cpu>-linux-gnu).
    fn cross_gcc(self) -> String {
        format!("{}-linux-gnu-gcc", self.cpu())
    }
}

#[derive(Debug, clap::Args)]
pub struct ImageArgs {
    /// Architectures, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "amd64")]
    pub arch: Vec<Arch>,
    /// The archive to write (default: <target>/image/arp-guard-<version>.oci.tar).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Use this static binary for ARCH instead of building it: ARCH=PATH.
    #[arg(long, value_parser = parse_binary)]
    pub binary: Vec<(Arch, PathBuf)>,
    /// The image's user, uid:gid.
    #[arg(long, default_value = DEFAULT_USER)]
    pub user: String,
    /// Give the binary file capabilities (BPF, PERFMON, NET_ADMIN; effective),
    /// for a non-root `--user`. Such an image cannot start in a container
    /// whose bounding set lacks one of them.
    #[arg(long)]
    pub file_caps: bool,
}

fn parse_binary(s: &str) -> Result<(Arch, PathBuf), String> {
    let (arch, path) = s.split_once('=').ok_or("expected ARCH=PATH")?;
    let arch = <Arch as clap::ValueEnum>::from_str(arch, true)?;
    Ok((arch, PathBuf::from(path)))
}

/// Build (or take), check and package; print what was written.
pub fn image(args: &ImageArgs) -> Result<PathBuf> {
    let version = env!("CARGO_PKG_VERSION");
    let mut archs: Vec<Arch> = Vec::new();
    for a in &args.arch {
        if !archs.contains(a) {
            archs.push(*a);
        }
    }
    ensure!(!archs.is_empty(), "no architecture");
    let needs_build = archs
        .iter()
        .any(|a| !args.binary.iter().any(|(b, _)| b == a));
    if needs_build {
        setup::setup()?;
    }
    let owners = sample_owners()?;
    let mut platforms = Vec::new();
    for &arch in &archs {
        let started = Instant::now();
        let (path, how) = match args.binary.iter().find(|(a, _)| *a == arch) {
            Some((_, p)) => (p.clone(), "given"),
            None => (build(arch)?, "built"),
        };
        let binary = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        check_elf(arch, &binary).with_context(|| format!("{}", path.display()))?;
        smoke(arch, &path, &owners.0, version)?;
        eprintln!(
            "xtask image: {} binary {} ({} bytes, static) {how} and checked in {:.0?}",
            arch.oci(),
            path.display(),
            binary.len(),
            started.elapsed()
        );
        platforms.push(oci::Platform {
            arch: arch.oci().to_owned(),
            binary,
        });
    }
    let image = oci::Image {
        ref_name: format!("arp-guard:{version}"),
        title: "arp-guard".into(),
        version: version.into(),
        source: env!("CARGO_PKG_REPOSITORY").into(),
        licenses: env!("CARGO_PKG_LICENSE").into(),
        revision: git(&["rev-parse", "HEAD"]),
        created: source_date_epoch(),
        path: IMAGE_PATH.into(),
        user: args.user.clone(),
        file_caps: if args.file_caps {
            ["CAP_BPF", "CAP_PERFMON", "CAP_NET_ADMIN", "CAP_NET_RAW"]
                .map(String::from)
                .to_vec()
        } else {
            Vec::new()
        },
        files: vec![(CA_BUNDLE.into(), ca_bundle()?)],
    };
    let written = oci::write(&image, &platforms)?;
    let out = args.out.clone().unwrap_or_else(|| {
        target_dir()
            .join("image")
            .join(format!("arp-guard-{version}.oci.tar"))
    });
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&out, &written.archive).with_context(|| format!("writing {}", out.display()))?;
    println!("image:   {}", out.display());
    println!("ref:     {}", image.ref_name);
    println!("digest:  {}", written.digest);
    println!(
        "archive: {} bytes, {}",
        written.archive.len(),
        oci::sha256(&written.archive)
    );
    for (arch, digest, layer) in &written.platforms {
        println!("  {arch}: manifest {digest}, layer {layer} bytes (gzip)");
    }
    Ok(out)
}

/// The build machine's CA bundle (`cargo xtask setup` installs it).
fn ca_bundle() -> Result<Vec<u8>> {
    let pem = std::fs::read(CA_BUNDLE)
        .with_context(|| format!("reading {CA_BUNDLE}: run `cargo xtask setup` as root"))?;
    ensure!(
        String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----"),
        "{CA_BUNDLE} holds no certificate"
    );
    Ok(pem)
}

/// SOURCE_DATE_EPOCH, else the commit time of HEAD, else 0 (the image's
/// and the krew archives' mtimes).
pub fn source_date_epoch() -> i64 {
    std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .or_else(|| git(&["log", "-1", "--format=%ct"]))
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

fn git(args: &[&str]) -> Option<String> {
    Command::new("git")
        .args(args)
        .current_dir(workspace_root())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .filter(|s| !s.is_empty())
}

fn has_rust_std(toolchain: &str, triple: &str) -> bool {
    Command::new("rustup")
        .args(["target", "list", "--installed", "--toolchain", toolchain])
        .output()
        .is_ok_and(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .any(|l| l == triple)
        })
}

/// `cargo build --release -p guard` for `arch`, static; the binary's path.
pub fn build(arch: Arch) -> Result<PathBuf> {
    let triple = arch.triple();
    let env_triple = triple.replace('-', "_");
    let current = std::env::var("RUSTUP_TOOLCHAIN").unwrap_or_else(|_| "stable".into());
    let mut cmd = if arch.is_native() || has_rust_std(&current, &triple) {
        let mut c = cargo();
        c.arg("build");
        c
    } else {
        // No rust-std for the target: rebuild std with the pinned nightly.
        let gcc = arch.cross_gcc();
        if Command::new(&gcc).arg("--version").output().is_err() {
            bail!(
                "building for {} needs {gcc} (Debian gcc-{}-linux-gnu, libc6-dev-{}-cross): run `cargo xtask setup` as root",
                arch.oci(),
                arch.cpu().replace('_', "-"),
                arch.oci()
            );
        }
        let mut c = Command::new("rustup");
        c.args(["run", &setup::ebpf_channel()?, "cargo", "build"])
            .arg("-Zbuild-std=std,panic_abort")
            .env(format!("CC_{env_triple}"), &gcc)
            .env(
                format!("AR_{env_triple}"),
                format!("{}-linux-gnu-ar", arch.cpu()),
            )
            .env(
                format!("CARGO_TARGET_{}_LINKER", env_triple.to_uppercase()),
                &gcc,
            );
        c
    };
    cmd.args(build_args(&triple))
        .env(
            format!("CARGO_TARGET_{}_RUSTFLAGS", env_triple.to_uppercase()),
            RUSTFLAGS,
        )
        .env("CARGO_TARGET_DIR", target_dir())
        .current_dir(workspace_root());
    crate::run(&mut cmd)?;
    Ok(target_dir().join(built_binary(&triple)))
}

/// What follows `cargo build` for `triple`; the Dockerfile's build stage
/// runs the same (a unit test compares them).
pub fn build_args(triple: &str) -> [&str; 6] {
    ["--release", "--locked", "-p", "guard", "--target", triple]
}

/// Where [`build_args`] leave the binary, under the target directory.
pub fn built_binary(triple: &str) -> String {
    format!("{triple}/release/arp-guard")
}

/// An ELF for `arch` without a program interpreter (statically linked).
pub fn check_elf(arch: Arch, bin: &[u8]) -> Result<()> {
    ensure!(bin.len() > 64 && bin[..4] == *b"\x7fELF", "not an ELF file");
    ensure!(bin[4] == 2 && bin[5] == 1, "not a 64-bit little-endian ELF");
    let u16_at = |o: usize| u16::from_le_bytes([bin[o], bin[o + 1]]);
    let machine = u16_at(18);
    ensure!(
        machine == arch.elf_machine(),
        "ELF machine {machine}, expected {} for {}",
        arch.elf_machine(),
        arch.oci()
    );
    let phoff = u64::from_le_bytes(bin[32..40].try_into()?) as usize;
    let (phentsize, phnum) = (u16_at(54) as usize, u16_at(56) as usize);
    for i in 0..phnum {
        let at = phoff + i * phentsize;
        let p_type = u32::from_le_bytes(
            bin.get(at..at + 4)
                .context("program header out of range")?
                .try_into()?,
        );
        const PT_INTERP: u32 = 3;
        ensure!(
            p_type != PT_INTERP,
            "dynamically linked (has a program interpreter)"
        );
    }
    Ok(())
}

/// A temporary ownership file for the smoke runs.
struct Owners(PathBuf);

impl Drop for Owners {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn sample_owners() -> Result<Owners> {
    let path = std::env::temp_dir().join(format!("xtask-image-owners-{}.yaml", std::process::id()));
    std::fs::write(
        &path,
        "ips:\n  - ip: 198.51.100.101\n    owner: node-a\n  - ip: 198.51.100.102\n    owner: node-b\n",
    )?;
    Ok(Owners(path))
}

/// `--version` and `validate` of `bin`, natively or under qemu-user.
fn smoke(arch: Arch, bin: &Path, owners: &Path, version: &str) -> Result<()> {
    let cmd = |args: &[&str]| -> Result<String> {
        let mut c = if arch.is_native() {
            Command::new(bin)
        } else {
            let qemu = format!("qemu-{}-static", arch.cpu());
            let mut c = Command::new(qemu);
            c.arg(bin);
            c
        };
        c.args(args);
        let out = c
            .output()
            .with_context(|| format!("spawning {c:?} (qemu-user-static: `cargo xtask setup`)"))?;
        ensure!(
            out.status.success(),
            "{c:?} failed with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let v = cmd(&["--version"])?;
    ensure!(
        v.trim() == format!("arp-guard {version}"),
        "{} --version printed {v:?}",
        arch.oci()
    );
    let owners = owners.to_str().context("temp path is not UTF-8")?;
    let view = cmd(&["validate", "--node-name", "node-a", owners])?;
    ensure!(
        view.contains("valid, 2 IPs") && view.contains("owned") && view.contains("foreign"),
        "{} validate printed {view:?}",
        arch.oci()
    );
    let how = if arch.is_native() {
        "natively"
    } else {
        "under qemu-user"
    };
    eprintln!(
        "xtask image: {} binary runs {how}: `--version` and `validate` ok",
        arch.oci()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Dockerfile builds the image `cargo xtask image` writes: the same
    /// flags, file, user, entrypoint, labels and tool versions.
    #[test]
    fn dockerfile_builds_the_same_image() {
        let path = workspace_root().join("Dockerfile");
        let text = std::fs::read_to_string(&path).unwrap();
        let has = |s: &str| assert!(text.contains(s), "{} lacks {s:?}", path.display());
        has(RUSTFLAGS);
        has(&format!("COPY --from=build /out/arp-guard {IMAGE_PATH}"));
        has(&format!("ENTRYPOINT [\"{IMAGE_PATH}\"]"));
        has("CMD [\"--help\"]");
        has(&format!("USER {DEFAULT_USER}"));
        has(&format!("COPY --from=build {CA_BUNDLE} {CA_BUNDLE}"));
        has("ENV PATH=/usr/local/bin");
        has(&format!("ARG VERSION={}", env!("CARGO_PKG_VERSION")));
        has(&format!(
            "ARG BPF_LINKER_VERSION={}",
            setup::BPF_LINKER_VERSION
        ));
        has(&format!(
            "org.opencontainers.image.source=\"{}\"",
            env!("CARGO_PKG_REPOSITORY")
        ));
        has(&format!(
            "org.opencontainers.image.licenses=\"{}\"",
            env!("CARGO_PKG_LICENSE")
        ));
        for key in ["title", "version", "revision", "created"] {
            has(&format!("org.opencontainers.image.{key}="));
        }
        let last_from = text.lines().rfind(|l| l.starts_with("FROM "));
        assert_eq!(last_from, Some("FROM scratch"));
    }

    /// The instructions of the Dockerfile's stage `name` (`FROM ... AS
    /// name`), continuation lines joined, comments dropped.
    fn stage(text: &str, name: &str) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        let mut inside = false;
        let mut open = false;
        for line in text.lines().map(str::trim).filter(|l| !l.starts_with('#')) {
            if line.starts_with("FROM ") {
                inside = line.ends_with(&format!(" AS {name}"));
                continue;
            }
            if !inside || line.is_empty() {
                continue;
            }
            let (body, more) = match line.strip_suffix('\\') {
                Some(b) => (b.trim(), true),
                None => (line, false),
            };
            match out.last_mut() {
                Some(last) if open => {
                    last.push(' ');
                    last.push_str(body);
                }
                _ => out.push(body.to_owned()),
            }
            open = more;
        }
        out
    }

    /// Days since the epoch of a `YYYY-MM-DD` date (days-from-civil, H. Hinnant).
    fn days(date: &str) -> i64 {
        let n: Vec<i64> = date.split('-').map(|p| p.parse().unwrap()).collect();
        let (y, m, d) = (n[0] - i64::from(n[1] <= 2), n[1], n[2]);
        let era = y.div_euclid(400);
        let yoe = y - era * 400;
        let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        era * 146_097 + doe - 719_468
    }

    /// The Dockerfile's build stage runs the build `cargo xtask image` runs:
    /// the same `cargo build` arguments, flags for the target only, the
    /// binary taken from where that build leaves it, and the tool chain
    /// `cargo xtask setup` installs (nightly, LLVM, bpf-linker).
    #[test]
    fn dockerfile_build_stage_runs_the_image_build() {
        let text = std::fs::read_to_string(workspace_root().join("Dockerfile")).unwrap();
        let build = stage(&text, "build");
        let run = build
            .iter()
            .find(|i| i.starts_with("RUN ") && i.contains("cargo build"))
            .unwrap_or_else(|| panic!("no `cargo build` in the build stage: {build:#?}"));
        let (_, after) = run.split_once("cargo build").unwrap();
        let words: Vec<&str> = after
            .split("&&")
            .next()
            .unwrap()
            .split_whitespace()
            .map(|w| w.trim_matches('"'))
            .collect();
        let triple = "${triple}";
        assert_eq!(words, build_args(triple), "{run}");
        let native = Arch::Amd64
            .triple()
            .replace(Arch::Amd64.cpu(), "$(uname -m)");
        assert!(run.contains(&format!("triple=\"{native}\"")), "{run}");
        assert!(run.contains(&format!("_RUSTFLAGS={RUSTFLAGS}\"")), "{run}");
        assert!(
            run.contains(&format!(
                "\"target/{}\" /out/arp-guard",
                built_binary(triple)
            )),
            "{run}"
        );
        let all = build.join("\n");
        let has = |s: &str| assert!(all.contains(s), "the build stage lacks {s:?}:\n{all}");
        let llvm = setup::LLVM_PREFIX.rsplit('-').next().unwrap();
        has(&format!("llvm-{llvm}-dev"));
        has(&format!("LLVM_PREFIX={}", setup::LLVM_PREFIX));
        has(&format!("--features llvm-{llvm}"));
        has("cargo install bpf-linker --version \"${BPF_LINKER_VERSION}\"");
        has("--component rust-src");
        has("guard-ebpf/rust-toolchain.toml");
        // A nightly is named for the day after its commit date.
        let nightly = all
            .lines()
            .find_map(|l| l.strip_prefix("ARG NIGHTLY=nightly-"))
            .expect("ARG NIGHTLY=nightly-<date>");
        assert_eq!(days(nightly), days(setup::NIGHTLY_DATE) + 1, "{nightly}");
    }

    #[test]
    fn days_from_civil() {
        assert_eq!(days("1970-01-01"), 0);
        assert_eq!(days("2000-03-01"), 11_017);
        assert_eq!(
            oci::rfc3339(days("2026-05-20") * 86_400),
            "2026-05-20T00:00:00Z"
        );
    }

    #[test]
    fn check_elf_wants_a_static_binary_of_the_arch() {
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let native = if cfg!(target_arch = "x86_64") {
            Arch::Amd64
        } else {
            Arch::Arm64
        };
        let other = if native == Arch::Amd64 {
            Arch::Arm64
        } else {
            Arch::Amd64
        };
        // The test binary is dynamically linked.
        let err = check_elf(native, &me).unwrap_err().to_string();
        assert!(err.contains("dynamically linked"), "{err}");
        let err = check_elf(other, &me).unwrap_err().to_string();
        assert!(err.contains("ELF machine"), "{err}");
        assert!(check_elf(native, b"#!/bin/sh\n").is_err());
    }

    #[test]
    fn binary_argument() {
        assert_eq!(
            parse_binary("arm64=/x/arp-guard").unwrap(),
            (Arch::Arm64, PathBuf::from("/x/arp-guard"))
        );
        assert!(parse_binary("/x/arp-guard").is_err());
        assert!(parse_binary("s390x=/x").is_err());
    }
}
