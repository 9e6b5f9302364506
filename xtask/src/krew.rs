//! `cargo xtask krew`: the plugin's krew manifest, `plugins/arp-guard.yaml`
//! (what `kubectl krew install --manifest=... --archive=...` and the
//! krew-index read), from one release archive per platform. The
//! linux/amd64 archive is built and packed here; the others are built
//! where their toolchain is (a Mac, a Windows machine, CI) and given as
//! `--archive OS/ARCH=PATH`.
//!
//! An archive is a `.tar.gz` holding `kubectl-arp_guard` (`.exe` on
//! Windows) and the licence files, reproducible (every mtime the image's,
//! SOURCE_DATE_EPOCH or HEAD's commit time; owners 0:0; gzip without a
//! name or time), named
//! `kubectl-arp_guard-v<version>-<os>-<arch>.tar.gz`: the release uploads
//! it beside the manifest, whose `uri` points there.

use std::{
    io::{Read as _, Write as _},
    path::PathBuf,
};

use anyhow::{bail, ensure, Context as _, Result};
use sha2::{Digest as _, Sha256};

use crate::{cargo, image, target_dir, workspace_root};

/// The plugin's name in krew (`kubectl krew install arp-guard`).
pub const NAME: &str = "arp-guard";
/// kubectl runs `kubectl-arp_guard` for `kubectl arp-guard`.
pub const BIN: &str = "kubectl-arp_guard";
/// Where a release's archives are downloaded from; `{version}` is the
/// workspace's.
pub const DEFAULT_BASE: &str =
    "https://github.com/arp-guard/arp-guard/releases/download/v{version}";
pub const HOMEPAGE: &str = "https://github.com/arp-guard/arp-guard";
/// krew's one-line summary (krew-index asks for a short one).
pub const SHORT: &str = "Which nodes answer ARP/NDP for LoadBalancer IPs";
/// The licence files every archive carries.
pub const LICENSES: [&str; 2] = ["LICENSE-APACHE", "LICENSE-MIT"];
/// The platforms krew may select: (os, arch) as its selector's labels.
pub const OSES: [&str; 3] = ["linux", "darwin", "windows"];
pub const ARCHES: [&str; 2] = ["amd64", "arm64"];

#[derive(Debug, clap::Args)]
pub struct KrewArgs {
    /// Another platform's archive, built elsewhere: OS/ARCH=PATH
    /// (darwin/arm64=kubectl-arp_guard-v0.1.0-darwin-arm64.tar.gz).
    #[arg(long = "archive", value_name = "OS/ARCH=PATH", value_parser = parse_archive)]
    pub archives: Vec<(Platform, PathBuf)>,
    /// Only the archives given (linux/amd64 is not built).
    #[arg(long)]
    pub no_build: bool,
    /// Where the release serves the archives (`{version}`: the workspace's).
    #[arg(long, default_value = DEFAULT_BASE)]
    pub base_url: String,
    /// The manifest to write.
    #[arg(long, default_value = "plugins/arp-guard.yaml")]
    pub out: PathBuf,
}

/// A platform as krew's selector names it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Platform {
    pub os: String,
    pub arch: String,
}

impl Platform {
    /// The binary's name there.
    pub fn bin(&self) -> String {
        if self.os == "windows" {
            format!("{BIN}.exe")
        } else {
            BIN.to_owned()
        }
    }

    /// The release archive's file name.
    pub fn archive_name(&self, version: &str) -> String {
        format!("{BIN}-v{version}-{}-{}.tar.gz", self.os, self.arch)
    }
}

fn parse_archive(s: &str) -> Result<(Platform, PathBuf), String> {
    let (platform, path) = s.split_once('=').ok_or("expected OS/ARCH=PATH")?;
    let (os, arch) = platform.split_once('/').ok_or("expected OS/ARCH=PATH")?;
    if !OSES.contains(&os) || !ARCHES.contains(&arch) {
        return Err(format!(
            "{platform}: OS is one of {OSES:?}, ARCH one of {ARCHES:?}"
        ));
    }
    let p = Platform {
        os: os.into(),
        arch: arch.into(),
    };
    Ok((p, PathBuf::from(path)))
}

/// One platform of the manifest.
#[derive(Debug, Clone)]
pub struct Entry {
    pub platform: Platform,
    pub uri: String,
    /// Lowercase hex.
    pub sha256: String,
}

/// Build linux/amd64 (unless told not to), check every archive, write the
/// manifest; returns its path.
pub fn krew(args: &KrewArgs) -> Result<PathBuf> {
    let version = env!("CARGO_PKG_VERSION");
    let mut archives = args.archives.clone();
    if !args.no_build {
        let linux = Platform {
            os: "linux".into(),
            arch: "amd64".into(),
        };
        ensure!(
            !archives.iter().any(|(p, _)| *p == linux),
            "linux/amd64 is built here: give --no-build to use another archive"
        );
        archives.push((linux.clone(), build_linux_amd64(&linux, version)?));
    }
    ensure!(
        !archives.is_empty(),
        "no archive: give --archive OS/ARCH=PATH"
    );
    archives.sort();
    let base = args.base_url.replace("{version}", version);
    let mut entries = Vec::new();
    for (p, path) in &archives {
        ensure!(
            !entries.iter().any(|e: &Entry| e.platform == *p),
            "{}/{} given twice",
            p.os,
            p.arch
        );
        let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        check_archive(&bytes, p).with_context(|| format!("{}", path.display()))?;
        entries.push(Entry {
            platform: p.clone(),
            uri: format!("{}/{}", base.trim_end_matches('/'), p.archive_name(version)),
            sha256: hex_sha256(&bytes),
        });
        eprintln!("xtask krew: {}/{}: {}", p.os, p.arch, path.display());
    }
    let text = manifest(version, &entries);
    let doc: serde_json::Value = serde_saphyr::from_str(&text).context("the manifest's YAML")?;
    validate(&doc, NAME)?;
    let out = workspace_root().join(&args.out);
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&out, text).with_context(|| format!("writing {}", out.display()))?;
    eprintln!("xtask krew: wrote {}", out.display());
    Ok(out)
}

/// The static linux/amd64 binary (as the image's: glibc, static, no
/// symbols), packed as the release archive under `target/krew/`.
fn build_linux_amd64(p: &Platform, version: &str) -> Result<PathBuf> {
    let triple = "x86_64-unknown-linux-gnu";
    let env_triple = triple.replace('-', "_").to_uppercase();
    let mut build = cargo();
    build
        .args(["build", "--release", "--locked", "-p", "kubectl-arp_guard"])
        .args(["--target", triple])
        .env(
            format!("CARGO_TARGET_{env_triple}_RUSTFLAGS"),
            image::RUSTFLAGS,
        );
    crate::run(&mut build)?;
    let bin = target_dir().join(triple).join("release").join(BIN);
    let binary = std::fs::read(&bin).with_context(|| format!("reading {}", bin.display()))?;
    image::check_elf(image::Arch::Amd64, &binary)?;
    let mtime = image::source_date_epoch().max(0) as u64;
    let archive = pack(&binary, p, &licenses()?, mtime)?;
    let dir = target_dir().join("krew");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(p.archive_name(version));
    std::fs::write(&path, archive)?;
    Ok(path)
}

fn licenses() -> Result<Vec<(&'static str, Vec<u8>)>> {
    LICENSES
        .iter()
        .map(|name| {
            let path = workspace_root().join(name);
            let data =
                std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
            Ok((*name, data))
        })
        .collect()
}

/// The archive of `binary` for `p`, with `licenses`: reproducible.
pub fn pack(
    binary: &[u8],
    p: &Platform,
    licenses: &[(&str, Vec<u8>)],
    mtime: u64,
) -> Result<Vec<u8>> {
    let mut tar = tar::Builder::new(Vec::new());
    let files = std::iter::once((p.bin(), binary, 0o755)).chain(
        licenses
            .iter()
            .map(|(n, d)| ((*n).to_owned(), d.as_slice(), 0o644)),
    );
    for (name, data, mode) in files {
        let mut h = tar::Header::new_ustar();
        h.set_path(&name)?;
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(mode);
        h.set_size(data.len() as u64);
        h.set_mtime(mtime);
        h.set_uid(0);
        h.set_gid(0);
        h.set_cksum();
        tar.append(&h, data)?;
    }
    let tar = tar.into_inner()?;
    let mut gz = flate2::GzBuilder::new()
        .mtime(0)
        .write(Vec::new(), flate2::Compression::best());
    gz.write_all(&tar)?;
    Ok(gz.finish()?)
}

/// The regular files of a `.tar.gz`: (path, mode).
fn entries(archive: &[u8]) -> Result<Vec<(String, u32)>> {
    let mut out = Vec::new();
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(archive));
    for e in tar.entries().context("not a .tar.gz")? {
        let mut e = e?;
        if e.header().entry_type() == tar::EntryType::Regular {
            let path = e.path()?.to_string_lossy().into_owned();
            let mode = e.header().mode()?;
            // Read through, so that a truncated archive is an error here.
            std::io::copy(&mut e.by_ref().take(u64::MAX), &mut std::io::sink())?;
            out.push((path, mode));
        }
    }
    Ok(out)
}

/// What krew will do with the archive works: the binary at its top, an
/// executable, and the licences beside it.
pub fn check_archive(archive: &[u8], p: &Platform) -> Result<()> {
    let files = entries(archive)?;
    let bin = p.bin();
    match files.iter().find(|(f, _)| *f == bin) {
        None => bail!("no {bin} at the archive's top (it holds {files:?})"),
        Some((_, mode)) if p.os != "windows" && mode & 0o111 == 0 => {
            bail!("{bin} is not executable (mode {mode:o})")
        }
        Some(_) => {}
    }
    for l in LICENSES {
        ensure!(files.iter().any(|(f, _)| f == l), "no {l} in the archive");
    }
    Ok(())
}

fn hex_sha256(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The manifest's text (YAML, written in a fixed order: the same archives
/// give the same bytes).
pub fn manifest(version: &str, entries: &[Entry]) -> String {
    let mut out = format!(
        "# Generated by `cargo xtask krew`: do not edit. Install with\n\
         #   kubectl krew install --manifest=plugins/arp-guard.yaml\n\
         # (add --archive=FILE to install from a downloaded archive).\n\
         apiVersion: krew.googlecontainertools.github.com/v1alpha2\n\
         kind: Plugin\n\
         metadata:\n  name: {NAME}\n\
         spec:\n  version: v{version}\n  homepage: {HOMEPAGE}\n  shortDescription: {SHORT}\n\
         {DESCRIPTION}{CAVEATS}  platforms:\n"
    );
    for e in entries {
        let bin = e.platform.bin();
        out.push_str(&format!(
            "  - selector:\n      matchLabels:\n        os: {}\n        arch: {}\n    \
             uri: {}\n    sha256: {}\n    files:\n    - from: {bin}\n      to: .\n    \
             - from: LICENSE-*\n      to: .\n    bin: {bin}\n",
            e.platform.os, e.platform.arch, e.uri, e.sha256
        ));
    }
    out
}

const DESCRIPTION: &str = "  description: |
    arp-guard keeps bare-metal nodes from answering ARP and NDP for
    LoadBalancer IPs they do not own (MetalLB L2, kube-vip, Cilium L2
    announcements, kube-proxy IPVS with strictARP off). This plugin shows
    the whole segment from a laptop, through the API server: one row per LB
    IP (its owner, who else claims it on the wire, the last takeover, the
    clients still sending to the wrong node, the Warning Events), and each
    node's own explanation (`status`, `clients`, `responders`, `explain`,
    `events`, `doctor`). It needs arp-guard's DaemonSet in the cluster.
";

const CAVEATS: &str = "  caveats: |
    The plugin needs the arp-guard DaemonSet in the cluster, and RBAC to
    read it: the roles arp-guard-operator of deploy/components/kubectl-plugin
    (exec into the guard Pods is not read-only: see
    docs/kubectl-arp-guard.md).
";

/// What krew checks of a manifest (its index's validation, `pkg/index/
/// validation`), as far as it can be checked offline, on the parsed YAML:
/// its apiVersion and kind; a name that is the file's (`name`), of
/// lowercase letters, digits and dashes; a `vMAJOR.MINOR.PATCH` version; a
/// short description (krew-index: at most 50 characters); for every
/// platform a distinct os/arch selector, an https URI of an archive, a
/// sha256, and a `bin` that `files` brings to the top (with `.exe` on
/// Windows).
pub fn validate(doc: &serde_json::Value, name: &str) -> Result<()> {
    let s = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
    ensure!(
        s(&doc["apiVersion"]) == "krew.googlecontainertools.github.com/v1alpha2",
        "apiVersion {}",
        doc["apiVersion"]
    );
    ensure!(s(&doc["kind"]) == "Plugin", "kind {}", doc["kind"]);
    let meta_name = s(&doc["metadata"]["name"]);
    ensure!(
        meta_name == name,
        "metadata.name {meta_name:?} is not the file's {name:?}"
    );
    let name_ok = (name.chars()).all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    ensure!(
        name_ok && !name.is_empty() && !name.starts_with('-'),
        "name {name:?}"
    );
    let spec = &doc["spec"];
    let version = s(&spec["version"]);
    let parts: Vec<&str> = version
        .strip_prefix('v')
        .unwrap_or("x")
        .split('.')
        .collect();
    ensure!(
        parts.len() == 3 && parts.iter().all(|p| p.parse::<u64>().is_ok()),
        "spec.version {version:?} is not vMAJOR.MINOR.PATCH"
    );
    let short = s(&spec["shortDescription"]);
    ensure!(
        !short.is_empty() && short.chars().count() <= 50,
        "shortDescription {short:?}: 1 to 50 characters"
    );
    ensure!(s(&spec["homepage"]).starts_with("https://"), "homepage");
    let platforms = spec["platforms"].as_array().context("no spec.platforms")?;
    ensure!(!platforms.is_empty(), "no platform");
    let mut seen = Vec::new();
    for p in platforms {
        let labels = &p["selector"]["matchLabels"];
        let (os, arch) = (s(&labels["os"]), s(&labels["arch"]));
        ensure!(
            OSES.contains(&os.as_str()) && ARCHES.contains(&arch.as_str()),
            "selector {os}/{arch}"
        );
        ensure!(
            !seen.contains(&(os.clone(), arch.clone())),
            "two platforms select {os}/{arch}"
        );
        seen.push((os.clone(), arch.clone()));
        let uri = s(&p["uri"]);
        ensure!(
            uri.starts_with("https://") && uri.ends_with(".tar.gz"),
            "{os}/{arch}: uri {uri:?}"
        );
        let sha = s(&p["sha256"]);
        ensure!(
            sha.len() == 64 && sha.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f')),
            "{os}/{arch}: sha256 {sha:?}"
        );
        let want = Platform {
            os: os.clone(),
            arch: arch.clone(),
        }
        .bin();
        ensure!(
            s(&p["bin"]) == want,
            "{os}/{arch}: bin {} (want {want})",
            p["bin"]
        );
        let brought = (p["files"].as_array().into_iter().flatten())
            .any(|f| s(&f["from"]) == want && s(&f["to"]) == ".");
        ensure!(brought, "{os}/{arch}: files do not bring {want} to the top");
    }
    Ok(())
}

/// The manifest `cargo xtask krew` writes by default.
pub fn default_manifest() -> PathBuf {
    workspace_root()
        .join("plugins")
        .join(format!("{NAME}.yaml"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn platform(os: &str, arch: &str) -> Platform {
        Platform {
            os: os.into(),
            arch: arch.into(),
        }
    }

    fn lic() -> Vec<(&'static str, Vec<u8>)> {
        LICENSES.iter().map(|l| (*l, b"licence".to_vec())).collect()
    }

    /// Three platforms' archives, packed here from a stand-in binary.
    fn three() -> Vec<Entry> {
        ["linux/amd64", "darwin/arm64", "windows/amd64"]
            .iter()
            .map(|p| {
                let (os, arch) = p.split_once('/').unwrap();
                let p = platform(os, arch);
                let a = pack(b"binary", &p, &lic(), 0).unwrap();
                check_archive(&a, &p).unwrap();
                Entry {
                    uri: format!("https://example.org/{}", p.archive_name("0.1.0")),
                    sha256: hex_sha256(&a),
                    platform: p,
                }
            })
            .collect()
    }

    fn parsed(text: &str) -> serde_json::Value {
        serde_saphyr::from_str(text).unwrap()
    }

    /// The same binary packs to the same bytes; the archive holds what
    /// krew's `files` and `bin` name, executable, with `.exe` on Windows.
    #[test]
    fn archives_are_reproducible_and_hold_what_krew_installs() {
        let linux = platform("linux", "amd64");
        let a = pack(b"binary", &linux, &lic(), 1_700_000_000).unwrap();
        assert_eq!(a, pack(b"binary", &linux, &lic(), 1_700_000_000).unwrap());
        let files = entries_of(&a);
        assert_eq!(
            files,
            [
                ("kubectl-arp_guard".into(), 0o755),
                ("LICENSE-APACHE".into(), 0o644),
                ("LICENSE-MIT".into(), 0o644)
            ]
        );
        let win = platform("windows", "amd64");
        let w = pack(b"binary", &win, &lic(), 0).unwrap();
        assert_eq!(entries_of(&w)[0].0, "kubectl-arp_guard.exe");
        let e = check_archive(&a, &win).unwrap_err().to_string();
        assert!(e.contains("no kubectl-arp_guard.exe"), "{e}");
        let e = check_archive(&pack(b"x", &linux, &[], 0).unwrap(), &linux).unwrap_err();
        assert!(e.to_string().contains("no LICENSE-APACHE"), "{e}");
        assert!(check_archive(b"not gzip", &linux).is_err());
    }

    fn entries_of(a: &[u8]) -> Vec<(String, u32)> {
        entries(a).unwrap()
    }

    /// The manifest krew reads: every platform with its selector, URI,
    /// sha256, files and bin, and what krew's validation asks of it; each
    /// planted fault is named.
    #[test]
    fn the_manifest_is_what_krew_accepts() {
        let e = three();
        let text = manifest("0.1.0", &e);
        let doc = parsed(&text);
        validate(&doc, NAME).unwrap();
        assert_eq!(doc["spec"]["version"], "v0.1.0");
        let ps = doc["spec"]["platforms"].as_array().unwrap();
        assert_eq!(ps.len(), 3);
        assert_eq!(ps[2]["selector"]["matchLabels"]["os"], "windows");
        assert_eq!(ps[2]["bin"], "kubectl-arp_guard.exe");
        assert_eq!(ps[0]["sha256"], e[0].sha256.as_str());
        assert!(doc["spec"]["caveats"]
            .as_str()
            .unwrap()
            .contains("kubectl-plugin"));
        let planted = [
            ("version: v0.1.0", "version: 0.1.0", "spec.version"),
            (
                "bin: kubectl-arp_guard.exe",
                "bin: kubectl-arp_guard",
                "bin",
            ),
            (
                "os: windows",
                "os: linux",
                "two platforms select linux/amd64",
            ),
            ("name: arp-guard", "name: arp_guard", "metadata.name"),
            (
                "- from: kubectl-arp_guard.exe",
                "- from: kubectl",
                "files do not bring",
            ),
        ];
        for (from, to, named) in planted {
            let bad = parsed(&text.replacen(from, to, 1));
            let err = validate(&bad, NAME).unwrap_err().to_string();
            assert!(err.contains(named), "{from} -> {to}: {err}");
        }
        let bad = parsed(&text.replace(&e[1].sha256, "abc"));
        assert!(validate(&bad, NAME).is_err());
    }

    /// The committed manifest passes the same checks, at the workspace's
    /// version, and names the linux/amd64 archive of this release.
    #[test]
    fn the_committed_manifest_is_valid_for_this_version() {
        let path = default_manifest();
        let text = std::fs::read_to_string(&path).unwrap();
        let doc = parsed(&text);
        validate(&doc, NAME).unwrap();
        let version = env!("CARGO_PKG_VERSION");
        assert_eq!(doc["spec"]["version"], format!("v{version}"));
        let linux = platform("linux", "amd64");
        let uri = format!(
            "{}/{}",
            DEFAULT_BASE.replace("{version}", version),
            linux.archive_name(version)
        );
        let uris: Vec<&str> = (doc["spec"]["platforms"].as_array().unwrap().iter())
            .filter_map(|p| p["uri"].as_str())
            .collect();
        assert!(uris.contains(&uri.as_str()), "{uris:?}");
    }

    #[test]
    fn archive_arguments_name_a_platform_krew_selects() {
        let (p, path) = parse_archive("darwin/arm64=dist/a.tar.gz").unwrap();
        assert_eq!(
            (p, path),
            (platform("darwin", "arm64"), "dist/a.tar.gz".into())
        );
        assert!(parse_archive("macos/arm64=a").is_err());
        assert!(parse_archive("darwin=a").is_err());
    }
}
