use std::{path::PathBuf, process::Command};

use anyhow::{bail, Result};
use clap::{Parser, Subcommand};
use xtask::{cargo, run, target_dir, workspace_root};

#[derive(Parser)]
#[command(about = "arp-guard project tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install the tool chain and packages (idempotent): llvm-22-dev, rust-src, bpf-linker, iproute2, ...
    Setup,
    /// Set up, then run fmt --check, the shape check, clippy -D warnings, the whole test suite
    /// and its root-only tests again in the 6.1 VM lane (needs root).
    Test {
        /// Extra arguments for `cargo test` (after --).
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Reproduce the incident in network namespaces, then stop it with arp-guard (needs root).
    Lab {
        /// Connect attempts per phase, one per second.
        #[arg(long, default_value_t = 60)]
        duration: u32,
    },
    /// Build static binaries and a reproducible OCI image archive holding only them
    /// (amd64; arm64 cross-built and smoke-run under qemu-user when asked).
    Image(xtask::image::ImageArgs),
    /// Run the benchmarks and write their tables into BENCHMARKS.md (needs root).
    Bench(xtask::bench::BenchArgs),
    /// Run the root-only integration tests inside VMs booted on Debian's
    /// 5.10 / 6.1 / 6.12 kernels (qemu, software emulation; needs root).
    VmTest(xtask::vm::VmArgs),
}

/// `cargo xtask test`: every check CI runs, each a timed phase.
fn test_all(p: &mut xtask::phases::Phases, args: Vec<String>) -> Result<()> {
    p.phase("setup", |_| xtask::setup::setup())?;
    p.phase("fmt --check", |_| {
        let mut fmt = cargo();
        fmt.args(["fmt", "--all", "--", "--check"]);
        run(&mut fmt)
    })?;
    // The house's shape: file and function sizes, layers, no import cycle.
    p.phase("shape", |_| {
        run(Command::new("python3")
            .arg(workspace_root().join("scripts/shape.py"))
            .current_dir(workspace_root()))
    })?;
    p.phase("clippy", |_| {
        let mut clippy = cargo();
        clippy.args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]);
        run(&mut clippy)
    })?;
    p.phase("build", |_| {
        let mut build = cargo();
        build.args(["build", "-p", "guard"]);
        run(&mut build)
    })?;
    p.phase("tests (build and run)", |p| {
        let mut test = cargo();
        test.args(["test", "--workspace", "--no-fail-fast", "--"])
            .args(&args);
        test.env("ARP_GUARD_BIN", guard_binary());
        p.cargo_test(test)
    })?;
    // The same tests on Debian 12's kernel (no TCX: the netlink
    // fallback), with the devices this machine's kernel lacks.
    p.phase("VM lane 6.1", |_| {
        xtask::vm::vm_test(&xtask::vm::VmArgs::lane("6.1"))
    })?;
    // Every bench in its short form, so that none can rot; the
    // numbers are printed, never asserted.
    p.phase("benches (short)", |_| {
        xtask::bench::bench(&xtask::bench::BenchArgs {
            short: true,
            only: Vec::new(),
            baseline: None,
            out: None,
        })
    })
}

fn guard_binary() -> PathBuf {
    target_dir().join("debug").join("arp-guard")
}

fn main() -> std::process::ExitCode {
    match task(Cli::parse().task) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn task(task: Task) -> Result<()> {
    match task {
        Task::Setup => xtask::setup::setup(),
        Task::Image(args) => xtask::image::image(&args).map(|_| ()),
        Task::Bench(args) => xtask::bench::bench(&args),
        Task::VmTest(args) => xtask::vm::vm_test(&args),
        Task::Test { args } => {
            let mut phases = xtask::phases::Phases::default();
            let r = test_all(&mut phases, args);
            eprint!("{}", phases.report());
            r
        }
        Task::Lab { duration } => {
            // SAFETY: geteuid has no preconditions.
            if unsafe { libc::geteuid() } != 0 {
                bail!("the lab creates network namespaces and loads BPF programs: run it as root");
            }
            xtask::setup::setup()?;
            let mut build = cargo();
            build.args(["build", "-p", "guard"]);
            run(&mut build)?;
            testbed::lab::install_interrupt_handler();
            let (_, after) = testbed::lab::run(&testbed::lab::Options {
                attempts: duration,
                binary: guard_binary(),
            })?;
            if after.successes != after.attempts {
                bail!(
                    "with the guard {} of {} connects failed: the guard did not stop the incident",
                    after.attempts - after.successes,
                    after.attempts
                );
            }
            Ok(())
        }
    }
}
