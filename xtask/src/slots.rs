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
    os::unix::process::CommandExt as _,
    process::Command,
    sync::{mpsc, Arc, Mutex},
    time::{Duration, Instant},
};

use crate::suite::Exe;

/// The binaries that take longest, in that order: started first so that
/// the run does not end waiting for one of them alone. Others follow in
/// the order given.
pub const SLOW_FIRST: &[&str] = &[
    "image",
    "alarms",
    "alarms_restart",
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
    /// How long one may run ([`crate::suite::BINARY_DEADLINE`] in CI).
    pub deadline: Duration,
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
/// stdout and stderr in one pipe so that their order is kept. Past
/// `plan.deadline` it is killed with its process group (the daemons its
/// tests started, which would otherwise hold the pipe open) and reported
/// with what it printed; its tests' namespaces and mounts may remain, as
/// after any kill, which is why this is a failing run's last resort.
fn run_one(exe: &Exe, plan: &Plan) -> (Outcome, String) {
    let started = Instant::now();
    let held = Arc::new(Mutex::new(Vec::new()));
    let mut note = String::new();
    let ok = (|| -> std::io::Result<bool> {
        let (reader, writer) = std::io::pipe()?;
        let mut cmd = Command::new(&exe.path);
        cmd.args(plan.args)
            .current_dir(&exe.dir)
            .env("CARGO_MANIFEST_DIR", &exe.dir)
            .envs(plan.env.iter().map(|(k, v)| (k, v)))
            .process_group(0)
            .stdout(writer.try_clone()?)
            .stderr(writer);
        let mut child = cmd.spawn()?;
        // The write ends live in `cmd` too: gone, so the read ends with the
        // child and whatever it started.
        drop(cmd);
        let drained = drain(reader, Arc::clone(&held));
        let left = plan.deadline.saturating_sub(started.elapsed());
        let ended = drained.recv_timeout(left);
        let in_time = matches!(ended, Ok(Ok(())));
        if !in_time {
            // SAFETY: kill has no memory preconditions; a negative pid names
            // the process group the child leads (`process_group(0)`).
            unsafe { libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL) };
            note = match ended {
                Ok(Err(e)) => format!("xtask: reading {}'s output: {e}; killed\n", exe.shown),
                _ => format!(
                    "xtask: {} passed its deadline of {:?}: killed with its process group\n",
                    exe.shown, plan.deadline
                ),
            };
            // A process that left the group could still hold the pipe:
            // what was read so far is shown either way.
            let _ = drained.recv_timeout(Duration::from_secs(5));
        }
        Ok(child.wait()?.success() && in_time)
    })()
    .unwrap_or_else(|e| {
        note += &format!("xtask: running {}: {e}\n", exe.path.display());
        false
    });
    let text = String::from_utf8_lossy(&lock(&held)).into_owned() + &note;
    let outcome = Outcome {
        shown: exe.shown.clone(),
        took: started.elapsed(),
        ok,
    };
    (outcome, text)
}

/// Read `reader` to its end into `held` on a thread of its own; the
/// receiver hears when the end came, or why the read failed (the child
/// would then block on a full pipe: it is killed).
fn drain(
    mut reader: std::io::PipeReader,
    held: Arc<Mutex<Vec<u8>>>,
) -> mpsc::Receiver<std::io::Result<()>> {
    let (done, drained) = mpsc::channel();
    std::thread::spawn(move || {
        let mut chunk = [0u8; 8192];
        let end = loop {
            match reader.read(&mut chunk) {
                Ok(0) => break Ok(()),
                Ok(n) => lock(&held).extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => break Err(e),
            }
        };
        let _ = done.send(end);
    });
    drained
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
            deadline: Duration::from_secs(60),
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
    fn a_binary_past_its_deadline_is_killed_and_shown() {
        // One hangs itself; one exits well but leaves a child holding the
        // pipe (a leaked daemon), which would have held the run forever.
        let hangs = sh("hangs", "echo before the hang; sleep 60");
        let leaks = sh("leaks", "sleep 60 & echo leaked");
        let plan = Plan {
            args: &[],
            env: &[],
            slots: 2,
            deadline: Duration::from_secs(1),
        };
        let started = Instant::now();
        let got = run(vec![&hangs, &leaks], &plan);
        assert!(started.elapsed() < Duration::from_secs(20), "{got:?}");
        assert_eq!(got.len(), 2, "{got:?}");
        for o in &got {
            assert!(!o.ok, "{o:?}");
            assert!(o.took >= Duration::from_secs(1), "{o:?}");
        }
        // What they printed before the kill is kept, and the kill is named.
        let (_, text) = run_one(&hangs, &plan);
        assert!(text.contains("before the hang"), "{text}");
        assert!(text.contains("passed its deadline of 1s"), "{text}");
        for e in [hangs, leaks] {
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
