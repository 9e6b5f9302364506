//! `cargo xtask vm-test`: the root-only integration tests on the kernels
//! the field runs (Debian 5.10, 6.1, 6.12), each booted under qemu with a
//! busybox initramfs that holds the test binaries, the daemon, the tools
//! they call and the modules the host kernel lacks (dummy, 8021q, bonding,
//! ip_vs, netem). Output is streamed; the exit status is the tests'.

use std::{path::PathBuf, time::Duration};

use anyhow::{bail, Context as _, Result};

use crate::{cargo, run, target_dir, workspace_root};

pub mod cpio;
pub mod kernel;
pub mod qemu;
pub mod rootfs;

/// The test binaries a lane runs unless `--tests` names others: the ones
/// that load the program and send frames. Not the container, manifest or
/// cluster-feed ones, whose subject is not the kernel (the cluster tests'
/// lease timings also assume a native CPU; `kernel_netem` takes the API
/// path into the lane).
pub const DEFAULT_TESTS: &[&str] = &[
    "kernel_ipvs",
    "kernel_vlan",
    "kernel_bond",
    "kernel_netem",
    "verdicts",
    "lifecycle",
    "ownership_file",
    "interfaces",
    "map_health",
    "prog_test_run",
    "ndp_test_run",
    "ndp",
    "lb_filter",
    "fuzz_differential",
    "census",
    "takeover",
    "clients",
    "privileges",
    "observability",
    "cli",
    "cleanup",
    "probe",
    "probe6",
    "doctor",
    "doctor6",
];

#[derive(Debug, clap::Args)]
pub struct VmArgs {
    /// Kernel lanes (comma-separated, or `all`): 5.10, 6.1, 6.12.
    #[arg(long, value_delimiter = ',', default_value = "6.1")]
    pub kernel: Vec<String>,
    /// Test binaries to run (comma-separated names of tests/*.rs).
    #[arg(long, value_delimiter = ',')]
    pub tests: Vec<String>,
    /// Resolve and fetch the newest kernel of each lane even when one is cached.
    #[arg(long)]
    pub refresh: bool,
    #[arg(long, default_value_t = 2)]
    pub cpus: u32,
    #[arg(long, default_value_t = 3072)]
    pub memory_mib: u32,
    /// Seconds before a lane's VM is killed.
    #[arg(long, default_value_t = 3600)]
    pub timeout: u64,
    /// Arguments for every test binary (a name filter, --exact, --test-threads=1).
    #[arg(last = true)]
    pub args: Vec<String>,
}

impl VmArgs {
    /// One lane with the default tests and settings.
    pub fn lane(kernel: &str) -> VmArgs {
        VmArgs {
            kernel: vec![kernel.to_owned()],
            tests: Vec::new(),
            refresh: false,
            cpus: 2,
            memory_mib: 3072,
            timeout: 3600,
            args: Vec::new(),
        }
    }
}

pub fn vm_test(args: &VmArgs) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!(
            "the VM lane fetches packages and builds as root like the other tests: run it as root"
        );
    }
    crate::setup::setup()?;
    let lanes = if args.kernel.iter().any(|k| k == "all") {
        kernel::LANES.to_vec()
    } else {
        args.kernel
            .iter()
            .map(|k| kernel::lane(k))
            .collect::<Result<_>>()?
    };
    let names: Vec<String> = if args.tests.is_empty() {
        DEFAULT_TESTS.iter().map(|s| s.to_string()).collect()
    } else {
        args.tests.clone()
    };
    let cache = target_dir().join("vm");
    let guard = build_guard()?;
    let tests = build_tests(&names)?;
    let busybox = kernel::busybox(&cache)?;
    let mut results = Vec::new();
    for lane in lanes {
        let k = kernel::fetch(&cache, lane, args.refresh)?;
        let initrd = cache.join(format!("initrd-{}.cpio", lane.name));
        let env = vec![
            ("ARP_GUARD_BIN".to_owned(), guard.display().to_string()),
            ("ARP_GUARD_VM".to_owned(), lane.name.to_owned()),
        ];
        let data = [
            workspace_root().join("tests/corpus"),
            workspace_root().join("deploy"),
        ];
        rootfs::build(
            &rootfs::Plan {
                busybox: &busybox,
                kernel: &k,
                guard: &guard,
                tests: &tests,
                test_args: &args.args,
                data: &data,
                env: &env,
                lane: lane.name,
            },
            &initrd,
        )?;
        let size = std::fs::metadata(&initrd)?.len() >> 20;
        eprintln!(
            "xtask vm: lane {} ({}), initramfs {size} MiB",
            lane.name, k.release
        );
        let started = std::time::Instant::now();
        let status = qemu::boot(&qemu::Machine {
            kernel: &k.vmlinuz,
            initrd: &initrd,
            cpus: args.cpus,
            memory_mib: args.memory_mib,
            timeout: Duration::from_secs(args.timeout),
        })
        .with_context(|| format!("lane {}", lane.name));
        let _ = std::fs::remove_file(&initrd);
        let status = status?;
        eprintln!(
            "xtask vm: lane {} ({}): status {status} after {:.0} s",
            lane.name,
            k.release,
            started.elapsed().as_secs_f64()
        );
        results.push((lane.name, status));
    }
    let failed: Vec<_> = results.iter().filter(|(_, s)| *s != 0).collect();
    if !failed.is_empty() {
        bail!("tests failed in the VM lanes {failed:?}");
    }
    Ok(())
}

fn build_guard() -> Result<PathBuf> {
    let mut build = cargo();
    build.args(["build", "-p", "guard"]);
    run(&mut build)?;
    Ok(target_dir().join("debug").join("arp-guard"))
}

/// Build the named integration tests; their executables.
fn build_tests(names: &[String]) -> Result<Vec<rootfs::TestBinary>> {
    let mut c = cargo();
    c.args([
        "test",
        "-p",
        "arp-guard-tests",
        "--no-run",
        "--message-format=json-render-diagnostics",
    ]);
    for n in names {
        c.args(["--test", n]);
    }
    c.stdout(std::process::Stdio::piped());
    eprintln!("xtask: running {c:?}");
    let out = c.output().context("cargo test --no-run")?;
    if !out.status.success() {
        bail!("building the tests failed");
    }
    let mut found = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let (Some(name), Some(exe)) = (v["target"]["name"].as_str(), v["executable"].as_str())
        else {
            continue;
        };
        if v["target"]["kind"][0] == "test" && names.iter().any(|n| n == name) {
            found.push(rootfs::TestBinary {
                name: name.to_owned(),
                path: PathBuf::from(exe),
            });
        }
    }
    // In the order asked for.
    found.sort_by_key(|t| names.iter().position(|n| *n == t.name));
    if found.len() != names.len() {
        bail!("built {} of the tests {names:?}", found.len());
    }
    Ok(found)
}
