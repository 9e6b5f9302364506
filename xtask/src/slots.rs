//! Test executables run side by side. Every integration test makes its own
//! namespaces, bpffs mounts and fake API servers (the harness already runs
//! the tests of one binary in parallel), so binaries that `cargo test`
//! would run one after another can share the machine: most of their time
//! is spent waiting for a daemon, a lease or a neighbour, not computing.
//! Each binary's output is held and printed whole when it ends, under
//! cargo's own `Running` line, so that the log reads like cargo's.

use std::{
    collections::VecDeque,
    ffi::OsString,
    io::Read as _,
    process::Command,
    sync::Mutex,
    time::{Duration, Instant},
};

use crate::suite::Exe;

/// The binaries that take longest, in that order: started first so that
/// the run does not end waiting for one of them alone. Others follow in
/// the order given.
pub const SLOW_FIRST: &[&str] = &[
    "image",
    "cluster",
    "incluster",
    "takeover_rounds",
    "kube_events",
    "probing",
    "map_health",
    "lab_smoke",
    "census",
    "refresh",
];

/// How one executable ended.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub shown: String,
    /// The wall time it ran.
    pub took: Duration,
    pub ok: bool,
}

/// What every executable gets.
pub struct Plan<'a> {
    /// Arguments after the executable (a name filter, `--test-threads`).
    pub args: &'a [String],
    pub env: &'a [(String, OsString)],
    /// How many run at once.
    pub slots: usize,
}

/// `exes` reordered: the ones named in [`SLOW_FIRST`] first.
pub fn slow_first(mut exes: Vec<&Exe>) -> Vec<&Exe> {
    exes.sort_by_key(|e| {
        SLOW_FIRST
            .iter()
            .position(|n| *n == e.name)
            .unwrap_or(usize::MAX)
    });
    exes
}

/// Run `exes` in `plan.slots` slots, in the order given; every outcome,
/// in the order they ended.
pub fn run(exes: Vec<&Exe>, plan: &Plan) -> Vec<Outcome> {
    let queue = Mutex::new(exes.into_iter().collect::<VecDeque<_>>());
    let ended = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..plan.slots.max(1) {
            s.spawn(|| {
                loop {
                    // Not `while let`: its guard would hold the queue
                    // through the body and run one binary at a time.
                    let next = lock(&queue).pop_front();
                    let Some(exe) = next else { break };
                    let (outcome, text) = run_one(exe, plan);
                    // One block, one write: the VM lane's lines print from
                    // another thread and must not land inside it.
                    let mut block = format!(
                        "     Running {} ({})\n{text}",
                        exe.shown,
                        exe.path.display()
                    );
                    if !outcome.ok {
                        block +=
                            &format!("xtask: {} FAILED after {:.1?}\n", exe.shown, outcome.took);
                    }
                    print!("{block}");
                    lock(&ended).push(outcome);
                }
            });
        }
    });
    ended.into_inner().unwrap_or_else(|p| p.into_inner())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Run one executable where `cargo test` would (its package's directory),
/// stdout and stderr in one pipe so that their order is kept.
fn run_one(exe: &Exe, plan: &Plan) -> (Outcome, String) {
    let started = Instant::now();
    let mut text = String::new();
    let ok = (|| -> std::io::Result<bool> {
        let (mut reader, writer) = std::io::pipe()?;
        let mut cmd = Command::new(&exe.path);
        cmd.args(plan.args)
            .current_dir(&exe.dir)
            .env("CARGO_MANIFEST_DIR", &exe.dir)
            .envs(plan.env.iter().map(|(k, v)| (k, v)))
            .stdout(writer.try_clone()?)
            .stderr(writer);
        let mut child = cmd.spawn()?;
        // The write ends live in `cmd` too: gone, so the read ends with the child.
        drop(cmd);
        let mut bytes = Vec::new();
        reader.read_to_end(&mut bytes)?;
        text = String::from_utf8_lossy(&bytes).into_owned();
        Ok(child.wait()?.success())
    })()
    .unwrap_or_else(|e| {
        text += &format!("xtask: running {}: {e}\n", exe.path.display());
        false
    });
    let outcome = Outcome {
        shown: exe.shown.clone(),
        took: started.elapsed(),
        ok,
    };
    (outcome, text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::suite::Kind;
    use std::path::PathBuf;

    fn sh(name: &str, script: &str) -> Exe {
        let dir = std::env::temp_dir().join(format!("xtask-slots-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{script}\n")).unwrap();
        std::process::Command::new("chmod")
            .arg("+x")
            .arg(&path)
            .status()
            .unwrap();
        Exe {
            name: name.into(),
            shown: format!("{name}.rs"),
            kind: Kind::Test,
            path,
            dir: PathBuf::from("/"),
        }
    }

    #[test]
    fn binaries_share_slots_and_each_outcome_is_its_own() {
        let marker = std::env::temp_dir().join(format!("xtask-slots-{}-mark", std::process::id()));
        let m = marker.display();
        // `a` ends well only if `b` runs while it waits: they share the slots.
        let a = sh(
            "a",
            &format!("for i in $(seq 200); do [ -e {m} ] && exit 0; sleep 0.05; done; exit 1"),
        );
        let b = sh("b", &format!("touch {m}; exit 3"));
        // Arguments, environment and directory as planned.
        let c = sh("c", "[ \"$X $1\" = 'x arg' ] && [ \"$(pwd)\" = / ]");
        let env = [("X".to_owned(), OsString::from("x"))];
        let args = ["arg".to_owned()];
        let plan = Plan {
            args: &args,
            env: &env,
            slots: 2,
        };
        let got = run(vec![&a, &b, &c], &plan);
        let _ = std::fs::remove_file(&marker);
        let by = |n: &str| got.iter().find(|o| o.shown == n).unwrap().clone();
        assert!(by("a.rs").ok && !by("b.rs").ok && by("c.rs").ok, "{got:?}");
        for e in [a, b, c] {
            let _ = std::fs::remove_dir_all(e.path.parent().unwrap());
        }
    }

    #[test]
    fn the_slow_ones_go_first() {
        let x = sh("lifecycle", "true");
        let y = sh("image", "true");
        let z = sh("cluster", "true");
        let order: Vec<&str> = slow_first(vec![&x, &y, &z])
            .iter()
            .map(|e| e.name.as_str())
            .collect();
        assert_eq!(order, ["image", "cluster", "lifecycle"]);
        for e in [x, y, z] {
            let _ = std::fs::remove_dir_all(e.path.parent().unwrap());
        }
    }
}
