//! The kernels of the VM lane: Debian's packages, fetched through a private
//! apt state (the host's own sources and dpkg database are never touched),
//! unpacked into the cache and never installed.
//!
//! A lane names a Debian suite and the meta-package whose dependency is the
//! newest kernel of that line; the first run resolves and downloads it, a
//! later run finds it unpacked in the cache and starts without the network.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _, Result};

use crate::run;

/// A kernel line the project tests on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lane {
    /// What `--kernel` takes.
    pub name: &'static str,
    /// The Debian suite whose archive holds it.
    pub suite: &'static str,
    /// The meta-package that depends on the newest image of the line.
    pub meta: &'static str,
}

/// Oldest first. 5.10: Debian 11's kernel (the oldest the README claims);
/// 6.1: Debian 12's (no TCX: the netlink clsact fallback); 6.12: Debian 12's
/// backported line (TCX links).
pub const LANES: &[Lane] = &[
    Lane {
        name: "5.10",
        suite: "bullseye",
        meta: "linux-image-amd64",
    },
    Lane {
        name: "6.1",
        suite: "bookworm",
        meta: "linux-image-amd64",
    },
    Lane {
        name: "6.12",
        suite: "bookworm",
        meta: "linux-image-6.12-amd64",
    },
];

pub fn lane(name: &str) -> Result<Lane> {
    LANES
        .iter()
        .copied()
        .find(|l| l.name == name)
        .with_context(|| {
            let names: Vec<_> = LANES.iter().map(|l| l.name).collect();
            format!("no kernel lane {name:?}; the lanes are {names:?}")
        })
}

/// An unpacked kernel: its image and its module tree.
#[derive(Debug, Clone)]
pub struct Kernel {
    pub release: String,
    pub vmlinuz: PathBuf,
    /// `lib/modules/<release>`.
    pub modules: PathBuf,
}

/// A private apt state for one suite, under the cache.
pub struct Apt {
    root: PathBuf,
}

impl Apt {
    pub fn new(cache: &Path, suite: &str) -> Result<Apt> {
        let root = cache.join("apt").join(suite);
        for d in ["lists/partial", "cache/archives/partial", "etc"] {
            std::fs::create_dir_all(root.join(d))?;
        }
        let key = "/usr/share/keyrings/debian-archive-keyring.gpg";
        let mut sources = String::new();
        for (base, s) in [
            ("debian", suite.to_owned()),
            ("debian", format!("{suite}-updates")),
            ("debian-security", format!("{suite}-security")),
        ] {
            sources.push_str(&format!(
                "deb [signed-by={key}] http://deb.debian.org/{base} {s} main\n"
            ));
        }
        std::fs::write(root.join("etc/sources.list"), sources)?;
        Ok(Apt { root })
    }

    fn command(&self, tool: &str) -> Command {
        let r = &self.root;
        let mut c = Command::new(tool);
        for (k, v) in [
            ("Dir::Etc::SourceList", r.join("etc/sources.list")),
            ("Dir::Etc::SourceParts", PathBuf::from("/dev/null")),
            ("Dir::State::Lists", r.join("lists")),
            ("Dir::State::status", PathBuf::from("/dev/null")),
            ("Dir::Cache", r.join("cache")),
            ("APT::Sandbox::User", PathBuf::from("root")),
        ] {
            c.arg("-o").arg(format!("{k}={}", v.display()));
        }
        c
    }

    pub fn update(&self) -> Result<()> {
        run(self.command("apt-get").args(["update", "-qq"]))
    }

    /// The first `Depends:` of a package (a meta-package's kernel image).
    pub fn depends(&self, package: &str) -> Result<String> {
        let out = self
            .command("apt-cache")
            .args(["depends", package])
            .output()
            .context("apt-cache")?;
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .find_map(|l| l.trim().strip_prefix("Depends: "))
            .map(str::to_owned)
            .with_context(|| format!("apt-cache depends {package}: no dependency"))
    }

    /// Download one package's .deb into `dir`; its path.
    pub fn download(&self, package: &str, dir: &Path) -> Result<PathBuf> {
        std::fs::create_dir_all(dir)?;
        run(self
            .command("apt-get")
            .args(["download", "-qq", package])
            .current_dir(dir))?;
        find_deb(dir, package)
    }
}

fn find_deb(dir: &Path, package: &str) -> Result<PathBuf> {
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with(&format!("{package}_")) && name.ends_with(".deb") {
            return Ok(p);
        }
    }
    bail!("no {package}_*.deb in {}", dir.display())
}

/// Unpack a .deb into `dest` (through a temporary directory, renamed when
/// complete, so an interrupted run never leaves a half tree that looks done).
pub fn unpack(deb: &Path, dest: &Path) -> Result<()> {
    let tmp = dest.with_extension("partial");
    let _ = std::fs::remove_dir_all(&tmp);
    run(Command::new("dpkg-deb").arg("-x").arg(deb).arg(&tmp))?;
    let _ = std::fs::remove_dir_all(dest);
    std::fs::rename(&tmp, dest)?;
    Ok(())
}

/// The lane's kernel, from the cache, else fetched. `refresh` resolves the
/// newest image again even when one is cached.
pub fn fetch(cache: &Path, lane: Lane, refresh: bool) -> Result<Kernel> {
    let dir = cache.join("kernels").join(lane.name);
    if !refresh {
        if let Ok(k) = unpacked(&dir.join("tree")) {
            return Ok(k);
        }
    }
    let apt = Apt::new(cache, lane.suite)?;
    apt.update()
        .with_context(|| format!("updating the {} package lists", lane.suite))?;
    let image = apt.depends(lane.meta)?;
    eprintln!("xtask vm: lane {}: {image}", lane.name);
    let debs = dir.join("debs");
    let _ = std::fs::remove_dir_all(&debs);
    let deb = apt.download(&image, &debs)?;
    unpack(&deb, &dir.join("tree"))?;
    let _ = std::fs::remove_dir_all(&debs);
    unpacked(&dir.join("tree"))
}

/// The kernel in an unpacked image package.
fn unpacked(tree: &Path) -> Result<Kernel> {
    let mods = tree.join("lib/modules");
    let release = std::fs::read_dir(&mods)
        .with_context(|| format!("no kernel unpacked at {}", tree.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .next()
        .with_context(|| format!("{} is empty", mods.display()))?;
    let vmlinuz = tree.join("boot").join(format!("vmlinuz-{release}"));
    if !vmlinuz.exists() {
        bail!("{} is missing", vmlinuz.display());
    }
    Ok(Kernel {
        modules: mods.join(&release),
        release,
        vmlinuz,
    })
}

/// busybox (static) from the bookworm archive, cached: the guest's shell
/// and small tools, without installing Debian's busybox-static on the host
/// (it would replace the host's busybox).
pub fn busybox(cache: &Path) -> Result<PathBuf> {
    let bin = cache.join("busybox/tree/bin/busybox");
    if bin.exists() {
        return Ok(bin);
    }
    let apt = Apt::new(cache, "bookworm")?;
    apt.update()?;
    let debs = cache.join("busybox/debs");
    let deb = apt.download("busybox-static", &debs)?;
    unpack(&deb, &cache.join("busybox/tree"))?;
    let _ = std::fs::remove_dir_all(&debs);
    if !bin.exists() {
        bail!("busybox-static did not hold bin/busybox");
    }
    Ok(bin)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lanes_are_named_by_kernel_line() {
        assert_eq!(lane("6.1").unwrap().suite, "bookworm");
        assert_eq!(lane("5.10").unwrap().suite, "bullseye");
        let e = lane("4.19").unwrap_err().to_string();
        assert!(e.contains("\"5.10\", \"6.1\", \"6.12\""), "{e}");
    }

    #[test]
    fn an_unpacked_tree_names_its_release() {
        let dir = std::env::temp_dir().join(format!("xtask-vm-tree-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        assert!(unpacked(&dir).is_err(), "nothing there");
        std::fs::create_dir_all(dir.join("lib/modules/6.1.0-9-amd64")).unwrap();
        assert!(unpacked(&dir).is_err(), "no vmlinuz");
        std::fs::create_dir_all(dir.join("boot")).unwrap();
        std::fs::write(dir.join("boot/vmlinuz-6.1.0-9-amd64"), b"").unwrap();
        let k = unpacked(&dir).unwrap();
        assert_eq!(k.release, "6.1.0-9-amd64");
        assert!(k.modules.ends_with("lib/modules/6.1.0-9-amd64"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
