//! `cargo xtask vm-test`: the root-only integration tests on the kernels
//! the field runs (Debian 5.10, 6.1, 6.12), each booted under qemu with a
//! busybox initramfs that holds the test binaries, the daemon, the tools
//! they call and the modules the host kernel lacks (dummy, 8021q, bonding,
//! ip_vs, netem). Output is streamed; the exit status is the tests'.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{bail, Context as _, Result};

use crate::{cargo, run, suite, target_dir, workspace_root};

pub mod cpio;
pub mod kernel;
pub mod qemu;
pub mod rootfs;

/// The test binaries a lane runs unless `--tests` names others: the ones
/// that load the program and send frames. Not the container, manifest or
/// cluster-feed ones, whose subject is not the kernel (the cluster tests'
/// lease timings also assume a native CPU; `kernel_netem` takes the API
/// path into the lane). Slowest first (as the lane last timed them), so
/// that the guest's workers end together.
pub const DEFAULT_TESTS: &[&str] = &[
    "prog_test_run",
    "verdicts",
    "lifecycle",
    "census",
    "map_health",
    "clients",
    "ownership_file",
    "probe",
    "kernel_bond",
    "kernel_vlan",
    "kernel_uplinks",
    "observability",
    "takeover",
    "kernel_netem",
    "fuzz_differential",
    "ndp",
    "cli",
    "doctor",
    "probe6",
    "kernel_ipvs",
    "lb_filter",
    "interfaces",
    "cleanup",
    "doctor6",
    "privileges",
    "ndp_test_run",
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
    /// How many test binaries run at once in the guest (1: one after
    /// another, their output streamed).
    #[arg(long, default_value_t = 1)]
    pub jobs: u32,
    #[arg(long, default_value_t = 3072)]
    pub memory_mib: u32,
    /// Seconds before a lane's VM is killed.
    #[arg(long, default_value_t = 3600)]
    pub timeout: u64,
    /// The daemon the tests start (default: `cargo build -p guard`'s).
    #[arg(long)]
    pub daemon: Option<PathBuf>,
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
            jobs: 2,
            daemon: None,
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
    let names: Vec<&str> = if args.tests.is_empty() {
        DEFAULT_TESTS.to_vec()
    } else {
        args.tests.iter().map(String::as_str).collect()
    };
    let guard = match &args.daemon {
        Some(d) => d.clone(),
        None => build_guard()?,
    };
    let mut c = cargo();
    c.args(["test", "-p", "arp-guard-tests", "--no-run"]);
    for n in &names {
        c.args(["--test", n]);
    }
    let built = suite::build(c)?;
    let tests = suite::pick(&built, suite::Kind::Test, &names)?;
    run_lanes(args, &guard, &tests)
}

/// Boot each of `args.kernel`'s lanes with `daemon` and `tests` (built
/// already) and run the tests in it; an error names the lanes that failed.
pub fn run_lanes(args: &VmArgs, daemon: &Path, tests: &[&suite::Exe]) -> Result<()> {
    let lanes = if args.kernel.iter().any(|k| k == "all") {
        kernel::LANES.to_vec()
    } else {
        args.kernel
            .iter()
            .map(|k| kernel::lane(k))
            .collect::<Result<_>>()?
    };
    let tests: Vec<rootfs::TestBinary> = tests
        .iter()
        .map(|e| rootfs::TestBinary {
            name: e.name.clone(),
            path: e.path.clone(),
        })
        .collect();
    let cache = target_dir().join("vm");
    let busybox = kernel::busybox(&cache)?;
    let mut failed = Vec::new();
    for lane in lanes {
        let status = run_lane(args, lane, &cache, &busybox, daemon, &tests)
            .with_context(|| format!("lane {}", lane.name))?;
        if status != 0 {
            failed.push((lane.name, status));
        }
    }
    if !failed.is_empty() {
        bail!("tests failed in the VM lanes {failed:?}");
    }
    Ok(())
}

/// One lane: its kernel, an initramfs holding `daemon` and `tests`, one boot;
/// the guest's status.
fn run_lane(
    args: &VmArgs,
    lane: kernel::Lane,
    cache: &Path,
    busybox: &Path,
    daemon: &Path,
    tests: &[rootfs::TestBinary],
) -> Result<i32> {
    let k = kernel::fetch(cache, lane, args.refresh)?;
    let initrd = cache.join(format!("initrd-{}.cpio", lane.name));
    let env = vec![
        ("ARP_GUARD_BIN".to_owned(), daemon.display().to_string()),
        ("ARP_GUARD_VM".to_owned(), lane.name.to_owned()),
    ];
    let data = [
        workspace_root().join("tests/corpus"),
        workspace_root().join("deploy"),
    ];
    rootfs::build(
        &rootfs::Plan {
            busybox,
            kernel: &k,
            guard: daemon,
            tests,
            test_args: &args.args,
            data: &data,
            env: &env,
            lane: lane.name,
            jobs: args.jobs,
            deadline: crate::suite::BINARY_DEADLINE,
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
        label: lane.name,
    });
    let _ = std::fs::remove_file(&initrd);
    let status = status?;
    eprintln!(
        "xtask vm: lane {} ({}): status {status} after {:.0} s",
        lane.name,
        k.release,
        started.elapsed().as_secs_f64()
    );
    Ok(status)
}

fn build_guard() -> Result<PathBuf> {
    let mut build = cargo();
    build.args(["build", "-p", "guard"]);
    run(&mut build)?;
    Ok(target_dir().join("debug").join("arp-guard"))
}
