//! Where the time of `cargo xtask test` goes: each phase timed (with when
//! it started, as some run side by side) and each test binary; the table
//! is printed at the end, also when a phase fails (the table is what shows
//! which phase to look at first).

use std::time::{Duration, Instant};

use anyhow::Result;

use crate::slots::Outcome;

/// The phases run so far: when each started (from the first), how long it
/// took and whether it passed. Phases may overlap (the VM lane runs beside
/// the host's tests), so the total is the wall time, not their sum.
#[derive(Debug)]
pub struct Phases {
    started: Instant,
    done: Vec<Done>,
    /// Test binaries and the wall time each ran.
    binaries: Vec<(String, Duration)>,
}

#[derive(Debug)]
struct Done {
    name: String,
    from: Duration,
    took: Duration,
    ok: bool,
}

impl Default for Phases {
    fn default() -> Self {
        Phases {
            started: Instant::now(),
            done: Vec::new(),
            binaries: Vec::new(),
        }
    }
}

impl Phases {
    /// Run `f` as the phase `name`.
    pub fn phase<T>(&mut self, name: &str, f: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        let t = Instant::now();
        let r = f(self);
        self.record(name, t, r.is_ok());
        r
    }

    /// A phase that ran elsewhere (another thread) from `since` until now.
    pub fn record(&mut self, name: &str, since: Instant, ok: bool) {
        self.done.push(Done {
            name: name.to_owned(),
            from: since.saturating_duration_since(self.started),
            took: since.elapsed(),
            ok,
        });
    }

    /// Keep the test binaries' times for the table.
    pub fn binaries(&mut self, outcomes: &[Outcome]) {
        (self.binaries).extend(outcomes.iter().map(|o| (o.shown.clone(), o.took)));
    }

    /// The table: every phase, then the slowest test binaries.
    pub fn report(&self) -> String {
        let mut out =
            String::from("xtask: where the time went (from: start after the first phase's)\n");
        for d in &self.done {
            out += &format!(
                "  {:<28} from {:>6.1} s {:>7.1} s{}\n",
                d.name,
                d.from.as_secs_f64(),
                d.took.as_secs_f64(),
                if d.ok { "" } else { "  FAILED" }
            );
        }
        let wall = self.started.elapsed().as_secs_f64();
        out += &format!("  {:<40} {wall:>7.1} s\n", "total (wall)");
        if !self.binaries.is_empty() {
            let mut b = self.binaries.clone();
            b.sort_by_key(|x| std::cmp::Reverse(x.1));
            let sum: f64 = b.iter().map(|(_, d)| d.as_secs_f64()).sum();
            out += &format!(
                "  test binaries on the host: {} in {sum:.1} s (the sum of their wall times), slowest first:\n",
                b.len(),
            );
            for (name, d) in b.iter().filter(|(_, d)| d.as_secs() >= 1) {
                out += &format!("    {name:<40} {:>7.1} s\n", d.as_secs_f64());
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::bail;

    #[test]
    fn phases_and_binaries_make_one_table() {
        let mut p = Phases::default();
        p.phase("fmt", |_| Ok(())).unwrap();
        assert!(p
            .phase("clippy", |_| -> Result<()> { bail!("no") })
            .is_err());
        let since = Instant::now();
        p.record("VM lane 6.1", since, true);
        p.binaries(&[
            Outcome {
                shown: "probing.rs".into(),
                took: Duration::from_secs(47),
                ok: true,
            },
            Outcome {
                shown: "cli.rs".into(),
                took: Duration::from_millis(300),
                ok: true,
            },
        ]);
        let r = p.report();
        for want in [
            "fmt",
            "clippy",
            "FAILED",
            "VM lane 6.1",
            "probing.rs",
            "total (wall)",
        ] {
            assert!(r.contains(want), "{want} missing from {r}");
        }
        // Under a second: counted, not listed.
        assert!(!r.contains("cli.rs") && r.contains("2 in 47.3 s"), "{r}");
    }
}
