//! What arp-guard's two command lines share, so that they read and end
//! alike: the node's `arp-guard` and the laptop's `kubectl arp-guard` take
//! durations in one syntax, and exit 0 (nothing found), 1 (a finding) or
//! 2 (could not ask) — the plugin reads the guards' exit codes by the same
//! rule, through pods/exec.

use std::{process::ExitCode, time::Duration};

/// `500ms`, `5s`, `2m`, `1h 30m` (jiff's friendly format), or a bare
/// number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if let Ok(secs) = s.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    let d: jiff::SignedDuration = s
        .parse()
        .map_err(|e| format!("`{s}` is not a duration like 500ms, 5s or 2m ({e})"))?;
    Duration::try_from(d).map_err(|e| format!("`{s}`: {e}"))
}

/// A command that ran to its end and found a problem (a failed check, a
/// conflict): its output already said what. [`exit`] exits with
/// [`Found::EXIT_CODE`] for it, and with [`EXIT_TROUBLE`] for any error
/// that kept the command from finishing, the way `diff` and `grep` tell
/// the two apart.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Found(pub String);

impl Found {
    /// The exit code of a command that found a problem.
    pub const EXIT_CODE: u8 = 1;

    /// `Ok` when `n` is 0, else the finding "`n` `what`": a command's count
    /// of the problems its output showed.
    pub fn if_any(n: usize, what: &str) -> anyhow::Result<()> {
        if n > 0 {
            return Err(Found(format!("{n} {what}")).into());
        }
        Ok(())
    }
}

/// The exit code of a command that could not finish (bad arguments, no
/// permission, the daemon unreachable...).
pub const EXIT_TROUBLE: u8 = 2;

/// How a command named `name` ends with `result`: its finding or its error
/// on stderr, and the exit code that says which.
pub fn exit(result: anyhow::Result<()>, name: &str) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => match e.downcast_ref::<Found>() {
            Some(found) => {
                eprintln!("{name}: {found}");
                ExitCode::from(Found::EXIT_CODE)
            }
            None => {
                eprintln!("{name}: error: {e:#}");
                ExitCode::from(EXIT_TROUBLE)
            }
        },
    }
}

/// A command whose reader goes away (`arp-guard status | head`) ends
/// quietly, as other command-line tools do, instead of panicking in
/// `println!`. Not the daemon: a client closing its connection must never
/// end it (Rust ignores SIGPIPE, and the write fails instead). Elsewhere
/// than Unix there is no such signal: nothing to do.
pub fn end_quietly_on_a_closed_pipe() {
    #[cfg(unix)]
    // SAFETY: signal(2) with SIG_DFL installs no handler; called before any
    // thread is started.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_both_command_lines_take_them() {
        assert_eq!(parse_duration("15"), Ok(Duration::from_secs(15)));
        assert_eq!(parse_duration(" 500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5400)));
        let e = parse_duration("soon").unwrap_err();
        assert!(e.contains("not a duration like 500ms"), "{e}");
        assert!(parse_duration("-5s").is_err(), "no negative duration");
    }

    #[test]
    fn a_finding_and_trouble_are_told_apart() {
        assert!(Found::if_any(0, "x").is_ok());
        let e = Found::if_any(2, "conflicts").unwrap_err();
        assert_eq!(e.to_string(), "2 conflicts");
        assert!(e.downcast_ref::<Found>().is_some());
    }
}
