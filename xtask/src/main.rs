use std::{path::PathBuf, process::Command, time::Instant};

use anyhow::{bail, Result};
use clap::{Parser, Subcommand};
use xtask::{
    cargo,
    image::{Arch, ImageArgs},
    phases::Phases,
    run, suite, target_dir,
    vm::VmArgs,
    workspace_root,
};

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
    /// (with the image's daemon), its root-only tests again in the 6.1 VM lane and the benches'
    /// short run (needs root).
    Test {
        /// How many test binaries run at once on the host.
        #[arg(long, default_value_t = 3)]
        slots: usize,
        /// Extra arguments for every test binary (after --).
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
    /// Write docs/reference from the code (every flag, metric, alert and
    /// Event reason); a unit test fails while the committed one differs.
    Docs,
    /// Build and pack the plugin's linux/amd64 release archive and write
    /// its krew manifest (plugins/arp-guard.yaml) from it and the other
    /// platforms' archives given.
    Krew(xtask::krew::KrewArgs),
    /// Compile the plugin for Windows (std from source with the pinned
    /// nightly, ring's C with mingw-w64); macOS needs Apple's SDK.
    CheckTargets,
}

/// `cargo xtask test`: every check CI runs, each a timed phase. The suite
/// is built once, and linted as it builds ([`Built`]); then the VM lane
/// boots beside the host's checks (the tests in `slots` slots, the benches'
/// short run), so that the 2-core machine waits on neither alone.
fn test_all(p: &mut Phases, args: &[String], slots: usize) -> Result<()> {
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
    let first = p.phase("build (image; the lane's tests + clippy)", |_| {
        LaneBuild::build()
    })?;
    let lane_args = VmArgs::lane("6.1");
    let lane_tests = suite::pick(&first.exes, suite::Kind::Test, xtask::vm::DEFAULT_TESTS)?;
    let mut failed = Vec::new();
    std::thread::scope(|s| {
        let since = Instant::now();
        // The same tests on Debian 12's kernel (no TCX: the netlink
        // fallback), with the devices this machine's kernel lacks.
        let lane = s.spawn(|| xtask::vm::run_lanes(&lane_args, &first.daemon, &lane_tests));
        let mut check = |name: &str, r: Result<()>| {
            if let Err(e) = r {
                eprintln!("xtask: {name}: {e:#}");
                failed.push(name.to_owned());
            }
        };
        // The rest of the suite builds while the lane boots and runs.
        match p.phase("build (other tests + clippy)", |_| Built::build(&first)) {
            Ok(built) => {
                let host = p.phase("tests (host)", |p| built.host_tests(p, args, slots));
                check("tests (host)", host);
                // Every bench in its short form, so that none can rot; the
                // numbers are printed, never asserted.
                let benches = p.phase("benches (short)", |_| built.benches());
                check("benches (short)", benches);
            }
            Err(e) => check("build (other tests + clippy)", Err(e)),
        }
        let lane = lane
            .join()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("the VM lane's thread panicked")));
        p.record("VM lane 6.1", since, lane.is_ok());
        check("VM lane 6.1", lane);
    });
    if !failed.is_empty() {
        bail!("failed: {}", failed.join(", "));
    }
    Ok(())
}

/// What the VM lane runs, built first so that the lane (the longest part
/// of the run) boots while the rest of the suite builds: the image, its
/// static release daemon (the one the host tests, the VM lane and the
/// benches start, so that they test what ships) and the lane's test
/// executables.
struct LaneBuild {
    exes: Vec<suite::Exe>,
    daemon: PathBuf,
    image: PathBuf,
}

impl LaneBuild {
    fn build() -> Result<LaneBuild> {
        let image = xtask::image::image(&ImageArgs {
            arch: vec![Arch::Amd64],
            out: None,
            binary: Vec::new(),
            user: xtask::image::DEFAULT_USER.to_owned(),
            file_caps: false,
        })?;
        let daemon = target_dir().join(xtask::image::built_binary(&Arch::Amd64.triple()));
        // The same packages as the whole suite's build below (`--workspace`),
        // so that cargo resolves the same features and that build reuses
        // every artefact of this one: only the targets are fewer.
        let mut tests = cargo();
        tests.args(["test", "--workspace", "--no-run"]);
        for name in xtask::vm::DEFAULT_TESTS {
            tests.args(["--test", name]);
        }
        suite::lint_while_building(&mut tests)?;
        let exes = suite::build(tests)?;
        Ok(LaneBuild {
            exes,
            daemon,
            image,
        })
    }
}

/// What the suite runs: every test executable, built and linted once, the
/// plugin's binary, and the lane's daemon and image.
struct Built<'a> {
    exes: Vec<suite::Exe>,
    plugin: PathBuf,
    first: &'a LaneBuild,
}

impl<'a> Built<'a> {
    fn build(first: &'a LaneBuild) -> Result<Built<'a>> {
        // Built and linted in one compile (clippy with -D warnings).
        let mut tests = cargo();
        tests.args(["test", "--workspace", "--all-targets", "--no-run"]);
        suite::lint_while_building(&mut tests)?;
        let exes = suite::build(tests)?;
        // `kubectl-arp_guard`, built beside the tests (its crate has
        // integration tests, so `cargo test` builds its binary), for the
        // tests that run it through kubectl.
        let plugin = target_dir().join("debug").join("kubectl-arp_guard");
        if !plugin.exists() {
            bail!("the suite's build left no {}", plugin.display());
        }
        // Doc tests build apart (there are none today): run so that one
        // added is not skipped.
        let mut doc = cargo();
        doc.args(["test", "--workspace", "--doc"]);
        suite::lint_while_building(&mut doc)?;
        run(&mut doc)?;
        Ok(Built {
            exes,
            plugin,
            first,
        })
    }

    /// Every unit and integration test binary, `slots` at a time.
    fn host_tests(&self, p: &mut Phases, args: &[String], slots: usize) -> Result<()> {
        let exes = (self.exes.iter())
            .filter(|e| e.kind != suite::Kind::Bench)
            .collect();
        let env = [
            ("ARP_GUARD_BIN".to_owned(), self.first.daemon.clone().into()),
            ("ARP_GUARD_PLUGIN".to_owned(), self.plugin.clone().into()),
            (
                "ARP_GUARD_IMAGE".to_owned(),
                self.first.image.clone().into(),
            ),
            // Set-up installed golang-go: the Go peer's tests run, never skip.
            ("ARP_GUARD_REQUIRE_GO".to_owned(), "1".into()),
        ];
        let plan = xtask::slots::Plan {
            args,
            env: &env,
            slots,
            deadline: suite::BINARY_DEADLINE,
        };
        let outcomes = xtask::slots::run(xtask::slots::slow_first(exes), &plan);
        p.binaries(&outcomes);
        let failed: Vec<&str> = (outcomes.iter())
            .filter(|o| !o.ok)
            .map(|o| o.shown.as_str())
            .collect();
        if !failed.is_empty() {
            bail!("test binaries failed: {}", failed.join(", "));
        }
        Ok(())
    }

    fn benches(&self) -> Result<()> {
        let args = xtask::bench::BenchArgs {
            short: true,
            only: Vec::new(),
            baseline: None,
            out: None,
        };
        let built = xtask::bench::Built {
            benches: &self.exes,
            daemon: &self.first.daemon,
        };
        xtask::bench::bench_with(&args, Some(&built))
    }
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
        Task::Krew(args) => xtask::krew::krew(&args).map(|_| ()),
        Task::CheckTargets => xtask::targets::check_targets(),
        Task::Bench(args) => xtask::bench::bench(&args),
        Task::VmTest(args) => xtask::vm::vm_test(&args),
        Task::Docs => {
            let mut docs = cargo();
            docs.args(["run", "--quiet", "-p", "guard", "--", "reference", "--out"])
                .arg(workspace_root().join("docs/reference"));
            run(&mut docs)
        }
        Task::Test { slots, args } => {
            let mut phases = Phases::default();
            let r = test_all(&mut phases, &args, slots);
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
