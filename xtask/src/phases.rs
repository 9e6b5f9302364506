//! Where the time of `cargo xtask test` goes: each phase timed, and each
//! test binary's time read from `cargo test`'s own output as it streams
//! by; the table is printed at the end, also when a phase fails (the
//! table is what shows which phase to look at first).

use std::{
    io::{BufRead, BufReader},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

/// The phases run so far, with their times and outcomes.
#[derive(Debug, Default)]
pub struct Phases {
    done: Vec<(String, Duration, bool)>,
    /// Test binaries, as `cargo test` reported them.
    binaries: Vec<(String, f64)>,
}

impl Phases {
    /// Run `f` as the phase `name`.
    pub fn phase<T>(&mut self, name: &str, f: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        let t = Instant::now();
        let r = f(self);
        self.done.push((name.to_owned(), t.elapsed(), r.is_ok()));
        r
    }

    /// Run `cmd` (a `cargo test`), its output passed through, and keep the
    /// time of each test binary it reports. Its stdout and stderr share one
    /// pipe: cargo names the binary on stderr, the harness times it on
    /// stdout, and only one stream keeps their order.
    pub fn cargo_test(&mut self, mut cmd: Command) -> Result<()> {
        eprintln!("xtask: running {cmd:?}");
        let (reader, writer) = std::io::pipe()?;
        cmd.stdout(writer.try_clone()?).stderr(writer);
        let mut child = cmd.spawn().with_context(|| format!("spawning {cmd:?}"))?;
        // The pipe's write ends live in `cmd` too: gone, so that the read
        // ends when the child does.
        let shown = format!("{cmd:?}");
        drop(cmd);
        let mut current = None;
        for line in BufReader::new(reader).lines().map_while(|l| l.ok()) {
            println!("{line}");
            if let Some((name, secs)) = binary_time(&line, &mut current) {
                self.binaries.push((name, secs));
            }
        }
        let status = child.wait()?;
        if !status.success() {
            bail!("{shown} failed with {status}");
        }
        Ok(())
    }

    /// The table: every phase, then the slowest test binaries.
    pub fn report(&self) -> String {
        let mut out = String::from("xtask: where the time went\n");
        let total: Duration = self.done.iter().map(|(_, d, _)| *d).sum();
        for (name, d, ok) in &self.done {
            out += &format!(
                "  {:<28} {:>7.1} s{}\n",
                name,
                d.as_secs_f64(),
                if *ok { "" } else { "  FAILED" }
            );
        }
        out += &format!("  {:<28} {:>7.1} s\n", "total", total.as_secs_f64());
        if !self.binaries.is_empty() {
            let mut b = self.binaries.clone();
            b.sort_by(|x, y| y.1.total_cmp(&x.1));
            let sum: f64 = b.iter().map(|(_, s)| s).sum();
            out += &format!(
                "  test binaries: {} in {:.1} s (their own clocks), slowest first:\n",
                b.len(),
                sum
            );
            for (name, s) in b.iter().filter(|(_, s)| *s >= 1.0) {
                out += &format!("    {name:<40} {s:>7.1} s\n");
            }
        }
        out
    }
}

/// From `cargo test`'s lines: `Running tests/x.rs (...)` names the binary
/// whose `test result: ... finished in 1.23s` follows.
fn binary_time(line: &str, current: &mut Option<String>) -> Option<(String, f64)> {
    let l = line.trim();
    if let Some(rest) = l.strip_prefix("Running ") {
        *current = Some(rest.split(" (").next().unwrap_or(rest).to_owned());
        return None;
    }
    if let Some(rest) = l.strip_prefix("Doc-tests ") {
        *current = Some(format!("doc-tests {rest}"));
        return None;
    }
    let secs = l
        .strip_prefix("test result:")?
        .rsplit_once("finished in ")?
        .1
        .trim_end_matches('s')
        .parse()
        .ok()?;
    Some((current.take()?, secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binaries_are_timed_from_cargo_tests_own_lines() {
        let mut cur = None;
        let lines = [
            "     Running tests/probing.rs (target/debug/deps/probing-22eaec3f1d11c450)",
            "running 6 tests",
            "test result: ok. 6 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 47.11s",
            "   Doc-tests guard_common",
            "test result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s",
            "test result: ok. 1 passed; finished in 3.00s",
        ];
        let got: Vec<_> = lines
            .iter()
            .filter_map(|l| binary_time(l, &mut cur))
            .collect();
        assert_eq!(
            got,
            [
                ("tests/probing.rs".to_owned(), 47.11),
                ("doc-tests guard_common".to_owned(), 0.0)
            ]
        );
        let mut p = Phases::default();
        p.phase("fmt", |_| Ok(())).unwrap();
        assert!(p
            .phase("clippy", |_| -> Result<()> { bail!("no") })
            .is_err());
        let r = p.report();
        assert!(
            r.contains("fmt") && r.contains("clippy") && r.contains("FAILED"),
            "{r}"
        );
    }

    #[test]
    fn a_binary_named_on_stderr_and_timed_on_stdout_is_kept_in_order() {
        let mut p = Phases::default();
        let mut cmd = Command::new("sh");
        cmd.args([
            "-c",
            "echo '     Running tests/x.rs (deps/x-1)' >&2; echo 'test result: ok. 1 passed; finished in 2.50s'; \
             echo '     Running tests/y.rs (deps/y-1)' >&2; echo 'test result: ok. 1 passed; finished in 0.25s'",
        ]);
        p.cargo_test(cmd).unwrap();
        assert_eq!(
            p.binaries,
            [
                ("tests/x.rs".to_owned(), 2.5),
                ("tests/y.rs".to_owned(), 0.25)
            ]
        );
        let mut fails = Command::new("sh");
        fails.args(["-c", "exit 3"]);
        assert!(p.cargo_test(fails).is_err());
    }
}
