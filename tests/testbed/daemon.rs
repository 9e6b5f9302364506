//! The `arp-guard` daemon as a child process inside a namespace.

use std::{
    io::{BufRead as _, BufReader},
    process::{Child, Stdio},
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::{bail, Context as _, Result};

use crate::{guard_binary, netns::Netns, wait_for};

/// A running `arp-guard run`; SIGTERM then SIGKILL on drop.
pub struct Daemon {
    child: Option<Child>,
    log: Arc<Mutex<Vec<String>>>,
}

impl Daemon {
    /// Start `arp-guard run <args>` in `ns` and wait until it enforces.
    pub fn start(ns: &Netns, args: &[&str]) -> Result<Self> {
        Self::start_with(ns, &guard_binary(), args)
    }

    /// The same with an explicit binary.
    pub fn start_with(ns: &Netns, binary: &std::path::Path, args: &[&str]) -> Result<Self> {
        Self::spawn_with(ns, binary, args)?.started()
    }

    /// Wait until the daemon enforces; fail with its log if it does not.
    /// A deadline, not an expectation: ~2.5 s under the VM lane's emulation,
    /// but a loaded host (the lane beside other builds on two cores) has
    /// taken it past 20 s with nothing logged yet.
    fn started(mut self) -> Result<Self> {
        if self
            .wait_log("arp-guard is enforcing", Duration::from_secs(60))
            .is_none()
        {
            let log = self.log_text();
            let status = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            bail!("arp-guard did not start (exit: {status:?}); its log:\n{log}");
        }
        Ok(self)
    }

    /// Start without waiting (for tests of start-up errors).
    pub fn spawn(ns: &Netns, args: &[&str]) -> Result<Self> {
        Self::spawn_with(ns, &guard_binary(), args)
    }

    /// Start `arp-guard run <args>` in `ns` under `wrapper` (a command that
    /// ends by exec'ing its arguments, e.g. setpriv), and wait until it enforces.
    pub fn start_wrapped(ns: &Netns, wrapper: &[String], args: &[&str]) -> Result<Self> {
        Self::start_build_wrapped(ns, wrapper, &guard_binary(), args)
    }

    /// [`Self::start_wrapped`] with an explicit binary.
    pub fn start_build_wrapped(
        ns: &Netns,
        wrapper: &[String],
        binary: &std::path::Path,
        args: &[&str],
    ) -> Result<Self> {
        Self::spawn_cmd(ns, wrapper, binary, &["run"], args)?.started()
    }

    fn spawn_with(ns: &Netns, binary: &std::path::Path, args: &[&str]) -> Result<Self> {
        Self::spawn_cmd(ns, &[], binary, &["run"], args)
    }

    /// Start any `arp-guard <args>` (a subcommand other than `run`) in `ns`
    /// under `wrapper`, without waiting; its stdout and stderr are the log.
    pub fn spawn_command(ns: &Netns, wrapper: &[String], args: &[&str]) -> Result<Self> {
        Self::spawn_cmd(ns, wrapper, &guard_binary(), &[], args)
    }

    fn spawn_cmd(
        ns: &Netns,
        wrapper: &[String],
        binary: &std::path::Path,
        subcommand: &[&str],
        args: &[&str],
    ) -> Result<Self> {
        let mut cmd = match wrapper.split_first() {
            None => ns.command(binary),
            Some((first, rest)) => {
                let mut c = ns.command(std::path::Path::new(first));
                c.args(rest).arg(binary);
                c
            }
        };
        cmd.args(["--log-format", "json", "--log-level", "info,guard=debug"])
            .args(subcommand)
            .args(args);
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .stdin(Stdio::null());
        let mut child = cmd
            .spawn()
            .with_context(|| format!("spawning {:?}", guard_binary()))?;
        let log = Arc::new(Mutex::new(Vec::new()));
        let stdout: Box<dyn std::io::Read + Send> =
            Box::new(child.stdout.take().context("stdout")?);
        let stderr: Box<dyn std::io::Read + Send> =
            Box::new(child.stderr.take().context("stderr")?);
        for stream in [stdout, stderr] {
            let sink = log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    if std::env::var_os("ARP_GUARD_TEST_LOG").is_some() {
                        eprintln!("[arp-guard] {line}");
                    }
                    sink.lock().unwrap().push(line);
                }
            });
        }
        Ok(Daemon {
            child: Some(child),
            log,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// The daemon's resident set (VmRSS) in KiB; panics if it is gone.
    pub fn rss_kib(&self) -> u64 {
        self.proc_status_kib("VmRSS:")
    }

    /// The daemon's peak resident set so far (VmHWM) in KiB.
    pub fn peak_rss_kib(&self) -> u64 {
        self.proc_status_kib("VmHWM:")
    }

    fn proc_status_kib(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .expect("the daemon's /proc status");
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("{field} in /proc/PID/status"))
    }

    /// CPU time the daemon has used so far (user + system, all its threads,
    /// from /proc/PID/stat): robust to other load on the machine.
    pub fn cpu_time(&self) -> Duration {
        let (user, system) = self.cpu_times();
        user + system
    }

    /// The same, as (user, system).
    pub fn cpu_times(&self) -> (Duration, Duration) {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid()))
            .expect("the daemon's /proc stat");
        // After "pid (comm) ": state is field 3, utime 14, stime 15.
        let rest = &stat[stat.rfind(')').expect("comm in /proc/PID/stat") + 2..];
        let f: Vec<u64> = rest
            .split_whitespace()
            .skip(11)
            .take(2)
            .map(|v| v.parse().expect("utime, stime"))
            .collect();
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
        let d = |ticks: u64| Duration::from_nanos(ticks * 1_000_000_000 / hz);
        (d(f[0]), d(f[1]))
    }

    pub fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// Wait for a log line containing `needle`; returns the line.
    pub fn wait_log(&self, needle: &str, timeout: Duration) -> Option<String> {
        wait_for(timeout, || {
            self.log
                .lock()
                .unwrap()
                .iter()
                .find(|l| l.contains(needle))
                .cloned()
        })
    }

    /// The first log line containing `needle`, waiting up to `timeout`;
    /// panics with the whole log when none comes.
    #[track_caller]
    pub fn expect_log(&self, needle: &str, timeout: Duration) -> String {
        match self.wait_log(needle, timeout) {
            Some(line) => line,
            None => panic!(
                "no log line with {needle:?} within {timeout:?}; the log:\n{}",
                self.log_text()
            ),
        }
    }

    /// Every line logged so far that contains `needle`.
    pub fn lines(&self, needle: &str) -> Vec<String> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(needle))
            .cloned()
            .collect()
    }

    /// Lines logged so far that contain `needle`.
    pub fn count_log(&self, needle: &str) -> usize {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(needle))
            .count()
    }

    /// Send a signal and wait for the exit status.
    pub fn stop(&mut self, signal: i32, timeout: Duration) -> Result<std::process::ExitStatus> {
        let child = self.child.as_mut().context("already stopped")?;
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(child.id() as i32, signal) };
        let status = wait_for(timeout, || child.try_wait().ok().flatten());
        match status {
            Some(s) => {
                self.child = None;
                Ok(s)
            }
            None => bail!("arp-guard did not exit within {timeout:?} after signal {signal}"),
        }
    }

    /// Wait for the process to exit on its own (start-up errors).
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<std::process::ExitStatus> {
        let child = self.child.as_mut().context("already stopped")?;
        let status =
            wait_for(timeout, || child.try_wait().ok().flatten()).context("still running")?;
        // Let the reader thread take the last lines.
        std::thread::sleep(Duration::from_millis(100));
        self.child = None;
        Ok(status)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            if wait_for(Duration::from_secs(5), || c.try_wait().ok().flatten()).is_none() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// `arp-guard counters -i IFACE -o json` run by `binary` inside `ns`.
pub fn counters_json(
    ns: &Netns,
    binary: &std::path::Path,
    iface: &str,
) -> Result<serde_json::Value> {
    let out = ns.exec(&[
        binary.to_str().context("binary path")?,
        "counters",
        "-i",
        iface,
        "-o",
        "json",
    ])?;
    serde_json::from_str(out.trim()).with_context(|| format!("counters output: {out}"))
}

/// Packets the guard on `iface` in `ns` dropped for `ip`, over every kind,
/// origin and state (`arp-guard counters`, run by the test's binary).
pub fn dropped(ns: &Netns, iface: &str, ip: std::net::Ipv4Addr) -> Result<u64> {
    let c = counters_json(ns, &guard_binary(), iface)?;
    Ok(c["counters"]
        .as_array()
        .context("counters array")?
        .iter()
        .filter(|r| r["lb_ip"] == ip.to_string() && r["verdict"] == "dropped")
        .map(|r| r["packets"].as_u64().unwrap_or(0))
        .sum())
}

/// `arp-guard events -o json` running in a namespace, its lines collected;
/// killed on drop.
pub struct EventTail {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl EventTail {
    /// Start tailing; returns once the stream is subscribed (a moment later).
    pub fn start(ns: &Netns) -> Result<Self> {
        let mut child = ns
            .command(&guard_binary())
            .args(["events", "-o", "json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        let stdout = child.stdout.take().context("stdout")?;
        std::thread::spawn(move || {
            for l in BufReader::new(stdout).lines().map_while(Result::ok) {
                sink.lock().unwrap_or_else(|p| p.into_inner()).push(l);
            }
        });
        std::thread::sleep(Duration::from_millis(300));
        Ok(EventTail { child, lines })
    }

    /// Every line so far.
    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The first line containing `needle`, waiting up to `timeout`.
    pub fn wait_line(&self, needle: &str, timeout: Duration) -> String {
        wait_for(timeout, || {
            self.lines().into_iter().find(|l| l.contains(needle))
        })
        .unwrap_or_else(|| panic!("no event line with {needle:?} in {:#?}", self.lines()))
    }
}

impl Drop for EventTail {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
