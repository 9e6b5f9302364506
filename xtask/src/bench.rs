//! `cargo xtask bench`: run the benches, collect their `RESULT` lines and
//! write them into BENCHMARKS.md as tables, with the machine they ran on.
//!
//! A bench prints `RESULT <table> <row> <column>=<value> ...`; a value
//! `median/min/max` is shown as "median (min–max)". Each table replaces the
//! text between `<!-- bench:<table> -->` and `<!-- /bench:<table> -->` in
//! the document, so the prose around the tables is written by hand and the
//! numbers by the command. `--short` runs small versions (what CI runs, so
//! the benches cannot rot; nothing is asserted) and writes to
//! `target/bench/BENCHMARKS.short.md` instead.

use std::{
    collections::BTreeMap,
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{bail, Context as _, Result};

use crate::{cargo, target_dir, workspace_root};

/// Every bench, in the order they run.
pub const BENCHES: &[&str] = &[
    "datapath",
    "control_plane",
    "cluster_feed",
    "alternatives",
    "takeover",
    "probing",
    "fleet",
    "plugin",
];

#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Small sizes and few samples; writes target/bench/BENCHMARKS.short.md.
    #[arg(long)]
    pub short: bool,
    /// Run only these benches (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Also measure this git revision next to today's: its egress program
    /// in the datapath bench, its daemon (release build, kept under
    /// target/bench/baseline/ by commit) in every cluster_feed case.
    #[arg(long)]
    pub baseline: Option<String>,
    /// Write the tables here instead of BENCHMARKS.md (or the short file).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// One table: rows in the order first seen, columns likewise.
#[derive(Debug, Default, PartialEq)]
pub struct Table {
    pub columns: Vec<String>,
    pub rows: Vec<(String, BTreeMap<String, String>)>,
}

/// Collect `RESULT` lines into tables (other lines are ignored).
pub fn parse_results(text: &str) -> BTreeMap<String, Table> {
    let mut tables: BTreeMap<String, Table> = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.trim().strip_prefix("RESULT ") else {
            continue;
        };
        let mut words = rest.split_whitespace();
        let (Some(table), Some(row)) = (words.next(), words.next()) else {
            continue;
        };
        let t = tables.entry(table.to_owned()).or_default();
        let idx = match t.rows.iter().position(|(r, _)| r == row) {
            Some(i) => i,
            None => {
                t.rows.push((row.to_owned(), BTreeMap::new()));
                t.rows.len() - 1
            }
        };
        for kv in words {
            let Some((k, v)) = kv.split_once('=') else {
                continue;
            };
            if !t.columns.iter().any(|c| c == k) {
                t.columns.push(k.to_owned());
            }
            t.rows[idx].1.insert(k.to_owned(), v.to_owned());
        }
    }
    tables
}

/// "25/24/27" -> "25 (24–27)"; anything else as it is.
fn cell(v: &str) -> String {
    let parts: Vec<&str> = v.split('/').collect();
    match parts.as_slice() {
        [m, lo, hi] if parts.iter().all(|p| p.parse::<f64>().is_ok()) => {
            format!("{m} ({lo}–{hi})")
        }
        _ => v.to_owned(),
    }
}

/// The columns holding the spread of `base`: `<base>_min`/`<base>_max`, or
/// `min`/`max` for a column named `median`.
fn spread_columns(base: &str) -> (String, String) {
    if base == "median" {
        ("min".into(), "max".into())
    } else {
        (format!("{base}_min"), format!("{base}_max"))
    }
}

impl Table {
    /// Columns as shown: a column with its `_min` and `_max` beside it is
    /// one cell, "median (min–max)".
    fn shown_columns(&self) -> Vec<&String> {
        let has = |c: &str| self.columns.iter().any(|x| x == c);
        let folded: Vec<String> = self
            .columns
            .iter()
            .filter(|c| {
                let (lo, hi) = spread_columns(c);
                has(&lo) && has(&hi)
            })
            .flat_map(|c| {
                let (lo, hi) = spread_columns(c);
                [lo, hi]
            })
            .collect();
        self.columns
            .iter()
            .filter(|c| !folded.contains(c))
            .collect()
    }

    pub fn markdown(&self) -> String {
        let shown = self.shown_columns();
        let mut s = String::from("| |");
        for c in &shown {
            s += &format!(" {} |", c.replace('_', " "));
        }
        s += "\n|---|";
        s += &"---|".repeat(shown.len());
        s += "\n";
        for (row, values) in &self.rows {
            s += &format!("| {} |", row.replace('_', " "));
            for c in &shown {
                let (lo, hi) = spread_columns(c);
                let v = match (values.get(*c), values.get(&lo), values.get(&hi)) {
                    (Some(m), Some(lo), Some(hi)) => format!("{m} ({lo}–{hi})"),
                    (Some(v), ..) => cell(v),
                    _ => String::new(),
                };
                s += &format!(" {v} |");
            }
            s += "\n";
        }
        s
    }
}

/// Put `body` between the table's markers in `doc`; a table without markers
/// is appended under its own heading, with them, for the next run.
pub fn splice(doc: &str, name: &str, body: &str) -> String {
    let (open, close) = (
        format!("<!-- bench:{name} -->"),
        format!("<!-- /bench:{name} -->"),
    );
    match (doc.find(&open), doc.find(&close)) {
        (Some(a), Some(b)) if a < b => {
            format!("{}{open}\n{body}{}", &doc[..a], &doc[b..])
        }
        _ => format!("{doc}\n### {name}\n\n{open}\n{body}{close}\n"),
    }
}

/// The machine the numbers come from: one line.
pub fn machine() -> String {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpu = read("/proc/cpuinfo")
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = read("/proc/sys/kernel/osrelease");
    let load = read("/proc/loadavg");
    let load = load.split_whitespace().next().unwrap_or("?");
    let date = Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    let rev = Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(workspace_root())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    format!(
        "Measured {date} at commit {rev} on {cpu}, {cores} cores, Linux {}, load average {load} at the start.\n",
        kernel.trim()
    )
}

/// Run one bench, echoing its output, and return what it printed.
/// `baseline`: the older egress object; `daemon`: the older daemon and its
/// revision's name.
fn run_bench(
    name: &str,
    args: &BenchArgs,
    built: Option<&Built>,
    baseline: Option<&Path>,
    daemon: Option<&(PathBuf, String)>,
) -> Result<String> {
    let mut c = match built {
        // Built by the suite already (`cargo xtask test`): run it as
        // `cargo bench` would, in its package's directory.
        Some(b) => {
            let exe = crate::suite::pick(b.benches, crate::suite::Kind::Bench, &[name])?[0];
            let mut c = Command::new(&exe.path);
            c.arg("--bench").current_dir(&exe.dir);
            c.env("ARP_GUARD_BIN", b.daemon);
            c
        }
        None => {
            let mut c = cargo();
            c.arg("bench");
            if args.short {
                // The test build's artifacts: nothing more to compile. The
                // kernel's timings do not depend on the profile; userspace ones do.
                c.args(["--profile", "dev"]);
            }
            c.args(["-p", "arp-guard-tests", "--bench", name]);
            c.env(
                "ARP_GUARD_BIN",
                target_dir()
                    .join(if args.short { "debug" } else { "release" })
                    .join("arp-guard"),
            );
            c
        }
    };
    if args.short {
        c.env("BENCH_SHORT", "1");
    }
    if let Some(obj) = baseline {
        c.env("BENCH_BASELINE_OBJ", obj);
    }
    if let Some((bin, rev)) = daemon {
        c.env("BENCH_BASELINE_BIN", bin)
            .env("BENCH_BASELINE_NAME", rev);
    }
    c.stdout(Stdio::piped());
    let started = std::time::Instant::now();
    let mut child = c
        .spawn()
        .with_context(|| format!("starting bench {name}"))?;
    let mut out = String::new();
    let stdout = child.stdout.take().context("bench stdout")?;
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        println!("{line}");
        out.push_str(&line);
        out.push('\n');
    }
    let status = child.wait()?;
    // Where a run of the benches spends its time (CI's short run too).
    eprintln!(
        "xtask bench: {name} took {:.1} s",
        started.elapsed().as_secs_f64()
    );
    if !status.success() {
        bail!("bench {name} failed: {status}");
    }
    Ok(out)
}

/// Benches built already, and the daemon they spawn.
pub struct Built<'a> {
    pub benches: &'a [crate::suite::Exe],
    pub daemon: &'a Path,
}

pub fn bench(args: &BenchArgs) -> Result<()> {
    bench_with(args, None)
}

/// [`bench`], with the benches and the daemon `built` already when given.
pub fn bench_with(args: &BenchArgs, built: Option<&Built>) -> Result<()> {
    let names: Vec<&str> = if args.only.is_empty() {
        BENCHES.to_vec()
    } else {
        for n in &args.only {
            if !BENCHES.contains(&n.as_str()) {
                bail!("no bench `{n}` (there are: {})", BENCHES.join(", "));
            }
        }
        args.only.iter().map(String::as_str).collect()
    };
    if built.is_none() {
        // The daemon and the plugin the benches spawn, in the profile they
        // run with.
        let mut build = cargo();
        build.args(["build", "-p", "guard", "-p", "kubectl-arp_guard"]);
        if !args.short {
            build.arg("--release");
        }
        crate::run(&mut build)?;
    }
    let baseline = args.baseline.as_deref().map(baseline_object).transpose()?;
    let daemon = match (&args.baseline, names.contains(&"cluster_feed")) {
        (Some(rev), true) => Some(baseline_daemon(rev)?),
        _ => None,
    };
    let header = machine();
    let mut text = String::new();
    for name in names {
        text += &run_bench(name, args, built, baseline.as_deref(), daemon.as_ref())?;
    }
    let out = match (&args.out, args.short) {
        (Some(p), _) => p.clone(),
        (None, true) => target_dir().join("bench").join("BENCHMARKS.short.md"),
        (None, false) => workspace_root().join("BENCHMARKS.md"),
    };
    let mut doc =
        std::fs::read_to_string(&out).unwrap_or_else(|_| "# Benchmarks (short run)\n".into());
    doc = splice(&doc, "machine", &header);
    let tables = parse_results(&text);
    for (name, t) in &tables {
        doc = splice(&doc, name, &t.markdown());
    }
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&out, doc).with_context(|| format!("writing {}", out.display()))?;
    println!(
        "bench: {} table(s) written to {}",
        tables.len(),
        out.display()
    );
    if tables.is_empty() {
        bail!("the benches printed no RESULT line");
    }
    Ok(())
}

/// The daemon of git revision `rev` and the short commit it resolves to:
/// built once (release) from a throwaway worktree, then kept by commit
/// under target/bench/baseline/.
fn baseline_daemon(rev: &str) -> Result<(PathBuf, String)> {
    let out = Command::new("git")
        .args(["rev-parse", "--short=12", &format!("{rev}^{{commit}}")])
        .current_dir(workspace_root())
        .output()?;
    let commit = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if !out.status.success() || commit.is_empty() {
        bail!("no such revision: {rev}");
    }
    let cache = target_dir().join("bench").join("baseline");
    let kept = cache.join(format!("arp-guard-{commit}"));
    if kept.exists() {
        return Ok((kept, commit));
    }
    let tree = cache.join("tree-daemon");
    add_worktree(&tree, &commit)?;
    let target = cache.join("target-daemon");
    let result = crate::run(
        cargo()
            .args(["build", "-p", "guard", "--release", "--target-dir"])
            .arg(&target)
            .current_dir(&tree),
    )
    .and_then(|()| {
        std::fs::copy(target.join("release").join("arp-guard"), &kept)
            .context("copying the baseline daemon")
            .map(drop)
    });
    remove_worktree(&tree);
    result.map(|()| (kept, commit))
}

/// A throwaway worktree of `rev` at `tree`, made afresh: whatever an
/// earlier run left there is removed first.
fn add_worktree(tree: &Path, rev: &str) -> Result<()> {
    remove_worktree(tree);
    crate::run(
        Command::new("git")
            .args(["worktree", "add", "--detach"])
            .arg(tree)
            .arg(rev)
            .current_dir(workspace_root()),
    )
}

/// Remove the throwaway worktree at `tree`, if there is one (best effort:
/// a failed removal is tried again by the next run's [`add_worktree`]).
fn remove_worktree(tree: &Path) {
    let _ = Command::new("git")
        .args(["worktree", "remove", "--force"])
        .arg(tree)
        .current_dir(workspace_root())
        .status();
    let _ = std::fs::remove_dir_all(tree);
}

/// The egress program of git revision `rev`, built from a throwaway worktree
/// the way guard/build.rs builds today's (aya-build's command).
fn baseline_object(rev: &str) -> Result<PathBuf> {
    let cache = target_dir().join("bench").join("baseline");
    let tree = cache.join("tree");
    add_worktree(&tree, rev)?;
    let result = (|| {
        // The channel the revision pins (guard-ebpf/rust-toolchain.toml).
        let pin = std::fs::read_to_string(tree.join("guard-ebpf/rust-toolchain.toml"))?;
        let channel = pin
            .lines()
            .find_map(|l| l.trim().strip_prefix("channel"))
            .and_then(|r| r.trim().strip_prefix('='))
            .map(|v| v.trim().trim_matches('"').to_owned())
            .context("no channel in the revision's guard-ebpf/rust-toolchain.toml")?;
        let mut c = Command::new("rustup");
        c.args([
            "run",
            &channel,
            "cargo",
            "build",
            "--package",
            "guard-ebpf",
            "--bins",
            "--release",
        ])
        .args([
            "--target",
            "bpfel-unknown-none",
            "-Z",
            "build-std=core",
            "--target-dir",
        ])
        .arg(cache.join("target"))
        .env(
            "CARGO_ENCODED_RUSTFLAGS",
            format!(
                "--cfg=bpf_target_arch=\"{}\"\x1f-Cdebuginfo=2\x1f-Clink-arg=--btf",
                std::env::consts::ARCH
            ),
        )
        .env_remove("RUSTC")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .current_dir(tree.join("guard-ebpf"));
        crate::run(&mut c)?;
        let obj = cache.join("target/bpfel-unknown-none/release/arp-guard-ebpf");
        let safe: String = rev
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        let kept = cache.join(format!("arp-guard-ebpf-{safe}"));
        std::fs::copy(&obj, &kept).with_context(|| format!("copying {}", obj.display()))?;
        Ok(kept)
    })();
    remove_worktree(&tree);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_become_tables_in_the_document() {
        let out = "noise\nRESULT d ipv4 floor=25/24/27 guard=29/28/30\nRESULT d arp guard=70/69/75\nRESULT m fill ms=88.1\n";
        let t = parse_results(out);
        assert_eq!(t.len(), 2);
        let md = t["d"].markdown();
        assert_eq!(
            md,
            "| | floor | guard |\n|---|---|---|\n| ipv4 | 25 (24–27) | 29 (28–30) |\n| arp |  | 70 (69–75) |\n"
        );
        let doc = "# B\n\ntext\n<!-- bench:d -->\nold\n<!-- /bench:d -->\nmore\n";
        let new = splice(doc, "d", &md);
        assert!(new.contains("text\n<!-- bench:d -->\n| | floor"));
        assert!(new.ends_with("<!-- /bench:d -->\nmore\n"));
        assert!(!new.contains("old"));
        // A table without markers is appended with them, and replaced next time.
        let added = splice(&new, "m", "x\n");
        assert!(added.ends_with("### m\n\n<!-- bench:m -->\nx\n<!-- /bench:m -->\n"));
        assert_eq!(
            splice(&added, "m", "y\n")
                .matches("<!-- bench:m -->")
                .count(),
            1
        );
        assert_eq!(cell("1.5"), "1.5");
        // Spread columns beside their median are one cell.
        let t = parse_results(
            "RESULT t a kpps=5 kpps_min=4 kpps_max=6 n=2\nRESULT t b median=1 min=0 max=3\n",
        );
        assert_eq!(
            t["t"].markdown(),
            "| | kpps | n | median |\n|---|---|---|---|\n| a | 5 (4–6) | 2 |  |\n| b |  |  | 1 (0–3) |\n"
        );
        assert_eq!(cell("a/b/c"), "a/b/c");
    }
}
