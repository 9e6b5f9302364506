//! A container runtime for the image tests: podman with its own storage
//! under a temporary directory, so a test never sees nor touches the host's
//! images and containers, and everything it made goes on drop, also when the
//! test panics.
//!
//! Why these flags: `vfs` storage needs no kernel overlay support and leaves
//! no mounts behind; `runc`, because crun fails on hosts with hybrid (v1 +
//! v2) cgroups; `cgroupfs`, no systemd; `file` events, no journald. Every
//! container gets explicit rlimits ([`Podman::ulimits`]).

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

use anyhow::{bail, Context as _, Result};

use crate::bed::TempDir;

/// podman with private storage; removes its containers, images and storage on drop.
pub struct Podman {
    dir: TempDir,
}

impl Podman {
    pub fn new(tag: &str) -> Result<Self> {
        sweep_stale();
        let p = Podman {
            dir: TempDir::new(&format!("podman-{tag}"))?,
        };
        std::fs::create_dir_all(p.dir.path().join("tmp"))?;
        let v = p.run(&["version", "--format", "{{.Client.Version}}"])?;
        eprintln!("podman {} in {}", v.trim(), p.dir.path().display());
        Ok(p)
    }

    /// `podman <global flags>`, ready for a subcommand.
    pub fn command(&self) -> Command {
        let d = self.dir.path();
        let mut c = Command::new("podman");
        c.arg("--root")
            .arg(d.join("root"))
            .arg("--runroot")
            .arg(d.join("run"))
            .arg("--tmpdir")
            .arg(d.join("tmp"))
            .args([
                "--storage-driver",
                "vfs",
                "--runtime",
                "runc",
                "--cgroup-manager",
                "cgroupfs",
                "--events-backend",
                "file",
            ]);
        c
    }

    /// `podman <args>`, whatever its exit status.
    pub fn output<S: AsRef<std::ffi::OsStr>>(&self, args: &[S]) -> Result<Output> {
        let mut c = self.command();
        c.args(args);
        c.output().with_context(|| format!("spawning {c:?}"))
    }

    /// `podman <args>`; its stdout, or an error with its stderr.
    pub fn run<S: AsRef<std::ffi::OsStr>>(&self, args: &[S]) -> Result<String> {
        let out = self.output(args)?;
        if !out.status.success() {
            let args: Vec<_> = args.iter().map(|a| a.as_ref().to_string_lossy()).collect();
            bail!(
                "podman {} failed ({}): {}{}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `podman load` an image archive; the loaded image's name.
    pub fn load(&self, archive: &Path) -> Result<String> {
        let out = self.run(&[
            "load".as_ref(),
            "--quiet".as_ref(),
            "-i".as_ref(),
            archive.as_os_str(),
        ])?;
        out.lines()
            .find_map(|l| l.strip_prefix("Loaded image: "))
            .or_else(|| {
                out.lines()
                    .find_map(|l| l.strip_prefix("Loaded image(s): "))
            })
            .map(|s| s.trim().to_owned())
            .with_context(|| format!("podman load printed {out:?}"))
    }

    /// The `arch` image of a (multi-arch) archive; its image ID, or None when
    /// the archive has no image for `arch`.
    pub fn pull_arch(&self, archive: &Path, arch: &str) -> Result<Option<String>> {
        let src = format!("oci-archive:{}", archive.display());
        let out = self.run(&["pull", "--quiet", "--arch", arch, &src])?;
        let id = out.lines().last().context("no image ID")?.trim().to_owned();
        let got = self.run(&["image", "inspect", "--format", "{{.Architecture}}", &id])?;
        Ok((got.trim() == arch).then_some(id))
    }

    /// `--ulimit` flags every host allows: podman's defaults (and `host`)
    /// ask for more than the hard limits of a runtime without
    /// CAP_SYS_RESOURCE (podman itself lowers its own: conmon runs with
    /// RLIMIT_NPROC 32768), and runc then fails with EPERM. Modest limits,
    /// never above the caller's hard ones; RLIMIT_NPROC counts every process
    /// of the uid on the host, so it stays generous.
    pub fn ulimits() -> Vec<String> {
        let hard = |res| {
            let mut r = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: getrlimit fills the struct we pass.
            unsafe { libc::getrlimit(res, &mut r) };
            r.rlim_max
        };
        let nofile = hard(libc::RLIMIT_NOFILE);
        let nproc = hard(libc::RLIMIT_NPROC).min(16_384);
        vec![
            format!("--ulimit=nofile={}:{}", nofile.min(1024), nofile.min(4096)),
            format!("--ulimit=nproc={nproc}:{nproc}"),
        ]
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        let _ = self.output(&["rm", "--all", "--force", "--time", "0"]);
        let _ = self.output(&["rmi", "--all", "--force"]);
        // Anything podman left mounted under its directories (shm of a
        // container it could not remove); the directory itself goes with
        // the TempDir.
        let prefix = self.dir.path().to_string_lossy().into_owned();
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut points: Vec<&str> = mounts
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|p| p.starts_with(&prefix))
            .collect();
        points.sort_by_key(|p| std::cmp::Reverse(p.len()));
        for p in points {
            let _ = Command::new("umount").args(["-l", p]).output();
        }
    }
}

/// Remove the stores (and their containers) of test processes that no longer
/// exist: a run killed with SIGKILL cannot clean up after itself.
fn sweep_stale() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix("arp-guard-test-") else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if name.contains("-podman-") && !Path::new(&format!("/proc/{pid}")).exists() {
            drop(Podman {
                dir: TempDir(e.path()),
            });
        }
    }
}

/// A detached container, force-removed on drop (before its Podman goes).
pub struct Container<'a> {
    pub podman: &'a Podman,
    pub name: String,
}

impl<'a> Container<'a> {
    /// `podman run -d --name <name> <args>`.
    pub fn start(podman: &'a Podman, name: &str, args: &[String]) -> Result<Self> {
        let mut all = vec!["run".to_owned(), "-d".into(), "--name".into(), name.into()];
        all.extend(args.iter().cloned());
        // Removed on drop even if `run` fails half-way (created, not started).
        let c = Container {
            podman,
            name: name.to_owned(),
        };
        podman.run(&all)?;
        Ok(c)
    }

    /// Stdout and stderr so far.
    pub fn logs(&self) -> String {
        match self.podman.output(&["logs", &self.name]) {
            Ok(o) => format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => format!("(podman logs: {e:#})"),
        }
    }

    /// The container's main process on the host, while it runs.
    pub fn pid(&self) -> Result<u32> {
        let pid = self
            .podman
            .run(&["inspect", "--format", "{{.State.Pid}}", &self.name])?;
        let pid: u32 = pid.trim().parse().context("pid")?;
        anyhow::ensure!(pid != 0, "the container is not running");
        Ok(pid)
    }

    /// Whether it still runs.
    pub fn running(&self) -> bool {
        self.podman
            .run(&["inspect", "--format", "{{.State.Running}}", &self.name])
            .is_ok_and(|s| s.trim() == "true")
    }

    /// Stop it (SIGTERM, then SIGKILL after `secs`); its exit code.
    pub fn stop(&self, secs: u32) -> Result<i32> {
        self.podman
            .run(&["stop", "--time", &secs.to_string(), &self.name])?;
        let code = self
            .podman
            .run(&["inspect", "--format", "{{.State.ExitCode}}", &self.name])?;
        code.trim().parse().context("exit code")
    }
}

impl Drop for Container<'_> {
    fn drop(&mut self) {
        let _ = self
            .podman
            .output(&["rm", "--force", "--time", "0", &self.name]);
    }
}

/// A seccomp profile like Kubernetes' `RuntimeDefault` on containerd, written
/// to `dir`; its path.
///
/// Podman's default (Debian's containers-common seccomp.json) allows bpf(2)
/// and perf_event_open(2) only to containers with CAP_SYS_ADMIN, so the
/// DaemonSet's capabilities (BPF, PERFMON, NET_ADMIN) would not be enough
/// under it. containerd's RuntimeDefault allows `bpf` with CAP_BPF and
/// `perf_event_open` with CAP_PERFMON (contrib/seccomp, the per-capability
/// rules). This is Debian's profile with exactly those rules added, so the
/// test runs under the same filter a `seccompProfile: RuntimeDefault` pod gets.
///
/// Rule semantics (containers/common): `includes.caps` needs every listed
/// capability in the bounding set, `excludes.caps` drops the rule if any is
/// there; hence one allow rule per capability.
pub fn runtime_default_seccomp(dir: &Path) -> Result<PathBuf> {
    const DEBIAN: &str = "/usr/share/containers/seccomp.json";
    let text = std::fs::read_to_string(DEBIAN)
        .with_context(|| format!("{DEBIAN} (Debian golang-github-containers-common)"))?;
    let mut profile: serde_json::Value = serde_json::from_str(&text)?;
    let syscalls = profile["syscalls"]
        .as_array_mut()
        .context("no syscalls in the profile")?;
    let gated = [("bpf", "CAP_BPF"), ("perf_event_open", "CAP_PERFMON")];
    // Take the two calls out of Debian's CAP_SYS_ADMIN rules...
    let mut found = 0;
    for rule in syscalls.iter_mut() {
        let mentions_sys_admin = rule["includes"]["caps"]
            .as_array()
            .into_iter()
            .chain(rule["excludes"]["caps"].as_array())
            .flatten()
            .any(|c| c == "CAP_SYS_ADMIN");
        if !mentions_sys_admin {
            continue;
        }
        if let Some(names) = rule["names"].as_array_mut() {
            let before = names.len();
            names.retain(|n| !gated.iter().any(|(call, _)| n == call));
            found += before - names.len();
        }
    }
    anyhow::ensure!(
        found > 0,
        "{DEBIAN} no longer gates bpf/perf_event_open on CAP_SYS_ADMIN: revisit this profile"
    );
    // ...and put them back: allowed with CAP_SYS_ADMIN (as before) or with
    // their own capability, EPERM otherwise (as before).
    for (call, cap) in gated {
        for allow in ["CAP_SYS_ADMIN", cap] {
            syscalls.push(serde_json::json!({
                "names": [call], "action": "SCMP_ACT_ALLOW", "args": [],
                "includes": {"caps": [allow]}, "excludes": {},
            }));
        }
        syscalls.push(serde_json::json!({
            "names": [call], "action": "SCMP_ACT_ERRNO", "errnoRet": 1, "args": [],
            "includes": {}, "excludes": {"caps": ["CAP_SYS_ADMIN", cap]},
        }));
    }
    let path = dir.join("seccomp-runtime-default.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&profile)?)?;
    Ok(path)
}

/// The image archive the tests run: `$ARP_GUARD_IMAGE`, else the one
/// `cargo xtask image` writes (with `--binary amd64=$ARP_GUARD_STATIC_BIN`
/// when that is set, else building the static binary), once per process.
pub fn image_archive() -> PathBuf {
    static ARCHIVE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    ARCHIVE
        .get_or_init(|| {
            if let Some(p) = std::env::var_os("ARP_GUARD_IMAGE") {
                return p.into();
            }
            let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
            let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
            cmd.current_dir(&root)
                .args(["run", "--quiet", "--package", "xtask", "--", "image"]);
            if let Some(bin) = std::env::var_os("ARP_GUARD_STATIC_BIN") {
                let mut arg = std::ffi::OsString::from("amd64=");
                arg.push(bin);
                cmd.arg("--binary").arg(arg);
            }
            eprintln!("building the image: {cmd:?}");
            let out = cmd
                .stderr(std::process::Stdio::inherit())
                .output()
                .expect("spawning cargo xtask image");
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "cargo xtask image failed: {stdout}");
            let path = stdout
                .lines()
                .find_map(|l| l.strip_prefix("image:"))
                .unwrap_or_else(|| panic!("no `image:` line in {stdout}"));
            PathBuf::from(path.trim())
        })
        .clone()
}
