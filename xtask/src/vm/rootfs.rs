//! The guest's root file system, one initramfs: busybox, the host's tools
//! the tests call (with the shared libraries `ldd` names), the kernel
//! modules they need (with their dependencies), the daemon and test
//! binaries at their host paths (tests find data through compile-time
//! paths), and `/init`, which runs the tests and reports their status.

use std::{
    collections::BTreeSet,
    io::BufWriter,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _, Result};

use super::{cpio::Cpio, kernel::Kernel};

/// Tools from the host that the tests and the guard call. Found on PATH.
pub const TOOLS: &[&str] = &[
    "ip", "tc", "bpftool", "ipvsadm", "ethtool", "setpriv", "nsenter", "prlimit", "unshare",
    "dash", "nft",
];

/// Modules loaded at boot, in this order (dependencies first, resolved
/// from each module's `.modinfo`). Missing ones are reported by `/init`.
pub const MODULES: &[&str] = &[
    // libcrc32c (nf_conntrack, ip_vs) asks the crypto API for crc32c at
    // load time; a soft dependency that .modinfo does not name.
    "crc32c_generic",
    "veth",
    "dummy",
    "8021q",
    "bonding",
    "bridge",
    "sch_ingress",
    "cls_bpf",
    "sch_netem",
    "ip_vs",
    "ip_vs_rr",
    // nft: the probe tests' "no endpoint here" rule.
    "nf_tables",
    // Two NICs on one qemu hub (kernel_uplinks: a real NIC named eno1).
    "virtio_pci",
    "virtio_net",
];

/// One test binary to run in the guest.
pub struct TestBinary {
    pub name: String,
    pub path: PathBuf,
}

pub struct Plan<'a> {
    pub busybox: &'a Path,
    pub kernel: &'a Kernel,
    pub guard: &'a Path,
    pub tests: &'a [TestBinary],
    /// Extra arguments for every test binary (a name filter, --exact, ...).
    pub test_args: &'a [String],
    /// Directories the tests read at run time (at their host paths).
    pub data: &'a [PathBuf],
    /// `NAME=value` for the tests' environment.
    pub env: &'a [(String, String)],
    pub lane: &'a str,
    /// How many test binaries run at once in the guest.
    pub jobs: u32,
    /// How long one test binary may run before it is killed.
    pub deadline: std::time::Duration,
}

pub fn build(plan: &Plan, out: &Path) -> Result<()> {
    let file = std::fs::File::create(out).with_context(|| format!("creating {}", out.display()))?;
    let mut c = Cpio::new(BufWriter::new(file));
    for d in [
        "/proc",
        "/sys",
        "/dev",
        "/tmp",
        "/run",
        "/root",
        "/var/run",
        "/etc/netns",
    ] {
        c.dir(d)?;
    }
    c.file("/bin/busybox", 0o755, &read(plan.busybox)?)?;
    // Debian's sh. busybox's would run its own applets (setpriv, unshare,
    // ip, ...) in place of the real tools a test's `sh -c` names; busybox
    // --install leaves an existing /bin/sh alone.
    c.symlink("/bin/sh", "/usr/bin/dash")?;
    c.file(
        "/etc/passwd",
        0o644,
        b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
    )?;
    c.file("/etc/group", 0o644, b"root:x:0:\nnogroup:x:65534:\n")?;
    c.file("/etc/hosts", 0o644, b"127.0.0.1 localhost\n::1 localhost\n")?;
    // A node's trust store: kube's client loads it when a kubeconfig names
    // no CA (the tests' plain-HTTP fake API), and fails without one.
    let ca = Path::new("/etc/ssl/certs/ca-certificates.crt");
    if ca.exists() {
        c.file(&ca.to_string_lossy(), 0o644, &read(ca)?)?;
    }
    let mut libs = BTreeSet::new();
    for tool in TOOLS {
        let path = which(tool)?;
        add_binary(&mut c, &path, &path, &mut libs)?;
    }
    add_binary(&mut c, plan.guard, plan.guard, &mut libs)?;
    for t in plan.tests {
        add_binary(&mut c, &t.path, &t.path, &mut libs)?;
    }
    for lib in &libs {
        c.file(&lib.to_string_lossy(), 0o755, &read(lib)?)?;
    }
    for dir in plan.data {
        add_tree(&mut c, dir)?;
    }
    let loaded = add_modules(&mut c, plan.kernel)?;
    c.file("/init", 0o755, init_script(plan, &loaded).as_bytes())?;
    c.finish()?;
    Ok(())
}

fn read(p: &Path) -> Result<Vec<u8>> {
    std::fs::read(p).with_context(|| format!("reading {}", p.display()))
}

fn which(tool: &str) -> Result<PathBuf> {
    for dir in ["/usr/sbin", "/usr/bin", "/sbin", "/bin"] {
        let p = Path::new(dir).join(tool);
        if p.exists() {
            return Ok(p);
        }
    }
    bail!("{tool} is not installed on the host (cargo xtask setup installs it)")
}

/// A dynamically linked binary, stripped of debug info (test binaries are
/// hundreds of MB with it), and the libraries it needs.
fn add_binary(
    c: &mut Cpio<impl std::io::Write>,
    host: &Path,
    guest: &Path,
    libs: &mut BTreeSet<PathBuf>,
) -> Result<()> {
    let stripped = std::env::temp_dir().join(format!("xtask-vm-strip-{}", std::process::id()));
    let ok = Command::new("objcopy")
        .arg("--strip-debug")
        .arg(host)
        .arg(&stripped)
        .status()
        .is_ok_and(|s| s.success());
    let data = if ok { read(&stripped)? } else { read(host)? };
    let _ = std::fs::remove_file(&stripped);
    c.file(&guest.to_string_lossy(), 0o755, &data)?;
    let out = Command::new("ldd").arg(host).output().context("ldd")?;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        // "libz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x...)" or
        // "/lib64/ld-linux-x86-64.so.2 (0x...)"; vdso has no path.
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            libs.insert(PathBuf::from(p));
        }
    }
    Ok(())
}

fn add_tree(c: &mut Cpio<impl std::io::Write>, dir: &Path) -> Result<()> {
    for e in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let p = e?.path();
        if p.is_dir() {
            add_tree(c, &p)?;
        } else if p.is_file() {
            c.file(&p.to_string_lossy(), 0o644, &read(&p)?)?;
        }
    }
    Ok(())
}

/// Every module file under the tree, by its name with `-` as `_`.
fn module_index(root: &Path) -> Result<std::collections::BTreeMap<String, PathBuf>> {
    let mut index = std::collections::BTreeMap::new();
    let mut stack = vec![root.join("kernel")];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d)? {
            let p = e?.path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if let Some(stem) = name.split_once(".ko").map(|(s, _)| s) {
                index.insert(stem.replace('-', "_"), p.clone());
            }
        }
    }
    Ok(index)
}

/// A module's bytes, decompressed (busybox's insmod takes plain ELF).
fn module_bytes(p: &Path) -> Result<Vec<u8>> {
    let name = p.to_string_lossy();
    let tool = if name.ends_with(".xz") {
        Some("xz")
    } else if name.ends_with(".zst") {
        Some("zstd")
    } else {
        None
    };
    let Some(tool) = tool else {
        return read(p);
    };
    let out = Command::new(tool).arg("-dc").arg(p).output()?;
    if !out.status.success() {
        bail!("{tool} -dc {name} failed");
    }
    Ok(out.stdout)
}

/// The `depends=` of a module's `.modinfo` section.
fn depends(ko: &[u8]) -> Result<Vec<String>> {
    let tmp = std::env::temp_dir().join(format!("xtask-vm-mod-{}", std::process::id()));
    std::fs::write(&tmp, ko)?;
    let out = Command::new("objcopy")
        .args(["-O", "binary", "--only-section=.modinfo"])
        .arg(&tmp)
        .arg("/dev/stdout")
        .output();
    let _ = std::fs::remove_file(&tmp);
    let out = out.context("objcopy")?;
    Ok(out
        .stdout
        .split(|b| *b == 0)
        .filter_map(|f| f.strip_prefix(b"depends="))
        .flat_map(|d| d.split(|b| *b == b','))
        .filter(|d| !d.is_empty())
        .map(|d| String::from_utf8_lossy(d).replace('-', "_"))
        .collect())
}

/// Add the wanted modules and their dependencies; the load order.
fn add_modules(c: &mut Cpio<impl std::io::Write>, k: &Kernel) -> Result<Vec<String>> {
    let index = module_index(&k.modules)?;
    let mut order: Vec<String> = Vec::new();
    fn visit(
        name: &str,
        index: &std::collections::BTreeMap<String, PathBuf>,
        order: &mut Vec<String>,
        bytes: &mut Vec<(String, Vec<u8>)>,
        depth: usize,
    ) -> Result<()> {
        if order.iter().any(|o| o == name) || depth > 32 {
            return Ok(());
        }
        // Built into this kernel: nothing to load.
        let Some(path) = index.get(name) else {
            return Ok(());
        };
        let data = module_bytes(path)?;
        for d in depends(&data)? {
            visit(&d, index, order, bytes, depth + 1)?;
        }
        order.push(name.to_owned());
        bytes.push((name.to_owned(), data));
        Ok(())
    }
    let mut bytes = Vec::new();
    for m in MODULES {
        visit(m, &index, &mut order, &mut bytes, 0)?;
    }
    for (name, data) in bytes {
        c.file(&format!("/modules/{name}.ko"), 0o644, &data)?;
    }
    Ok(order)
}

fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

fn init_script(plan: &Plan, modules: &[String]) -> String {
    let mut s = include_str!("init.sh").replace("@LANE@", plan.lane);
    s = s.replace("@MODULES@", &modules.join(" "));
    let mut env = String::new();
    for (k, v) in plan.env {
        env.push_str(&format!("export {k}={}\n", sh_quote(v)));
    }
    s = s.replace("@ENV@", &env);
    let args: Vec<String> = plan.test_args.iter().map(|a| sh_quote(a)).collect();
    let mut tests = String::new();
    let mut names = Vec::new();
    for t in plan.tests {
        // A test target's name is an identifier: fit for a case label and a path.
        tests.push_str(&format!(
            "    {}) run_test {} {} {} ;;\n",
            t.name,
            sh_quote(&t.name),
            sh_quote(&t.path.to_string_lossy()),
            args.join(" ")
        ));
        names.push(t.name.as_str());
    }
    s.replace("@TESTS@", &tests)
        .replace("@NAMES@", &names.join(" "))
        .replace("@JOBS@", &plan.jobs.max(1).to_string())
        .replace("@DEADLINE@", &plan.deadline.as_secs().max(1).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_reach_the_guest_shell_quoted() {
        assert_eq!(sh_quote("plain"), "'plain'");
        assert_eq!(sh_quote("it's"), "'it'\\''s'");
        let kernel = Kernel {
            release: "6.1.0-1-amd64".into(),
            vmlinuz: "/k".into(),
            modules: "/m".into(),
        };
        let tests = [TestBinary {
            name: "verdicts".into(),
            path: "/t/verdicts-1".into(),
        }];
        let plan = Plan {
            busybox: Path::new("/bb"),
            kernel: &kernel,
            guard: Path::new("/g"),
            tests: &tests,
            test_args: &["--exact".into(), "a test; rm -rf /".into()],
            data: &[],
            env: &[("ARP_GUARD_VM".into(), "6.1".into())],
            lane: "6.1",
            jobs: 2,
            deadline: std::time::Duration::from_secs(900),
        };
        let init = init_script(&plan, &["veth".into(), "dummy".into()]);
        assert!(init.contains("for m in veth dummy; do"), "{init}");
        assert!(init.contains("export ARP_GUARD_VM='6.1'"), "{init}");
        assert!(
            init.contains(
                "verdicts) run_test 'verdicts' '/t/verdicts-1' '--exact' 'a test; rm -rf /' ;;"
            ),
            "{init}"
        );
        assert!(init.contains("for t in verdicts; do"), "{init}");
        assert!(init.contains("for w in $(seq 2); do"), "{init}");
        assert!(init.contains("timeout -s KILL 900 \"$@\""), "{init}");
        for placeholder in [
            "@MODULES@",
            "@ENV@",
            "@LANE@",
            "@TESTS@",
            "@NAMES@",
            "@JOBS@",
            "@DEADLINE@",
        ] {
            assert!(!init.contains(placeholder), "{placeholder} filled: {init}");
        }
    }
}
