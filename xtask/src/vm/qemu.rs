//! Boot a kernel and an initramfs under qemu's software emulation (TCG;
//! `/dev/kvm` on the project's machines is a nested PVM that ordinary
//! kernels do not run on), stream the serial console and return the status
//! line `/init` prints.

use std::{
    io::{BufRead as _, BufReader},
    path::Path,
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

pub const STATUS_MARK: &str = "ARP-GUARD-VM-STATUS ";

pub struct Machine<'a> {
    pub kernel: &'a Path,
    pub initrd: &'a Path,
    pub cpus: u32,
    pub memory_mib: u32,
    pub timeout: Duration,
    /// Put before every line of the guest's console (the lane's name).
    pub label: &'a str,
}

/// The guest's exit status as `/init` reported it.
pub fn boot(m: &Machine) -> Result<i32> {
    let mut child = Command::new("qemu-system-x86_64")
        // qemu64, not max: the guest kernel then runs without the features
        // TCG emulates at a price (XSAVE of wide vector state at every
        // context switch, 5-level paging). The same three lane binaries:
        // 173 s of qemu's CPU and 101-104 s of wall time against 217 s and
        // 128-129 s with `max`, twice each; the tests need no CPU feature.
        .args(["-accel", "tcg,thread=multi", "-cpu", "qemu64"])
        .args(["-smp", &m.cpus.to_string(), "-m", &m.memory_mib.to_string()])
        .args(["-nodefaults", "-no-user-config", "-display", "none"])
        .args(["-serial", "stdio", "-no-reboot"])
        // Two virtio NICs on one hub and nothing else: a segment of real
        // NICs (no link kind) between two namespaces of the guest.
        .args(["-netdev", "hubport,id=n0,hubid=0"])
        .args(["-device", "virtio-net-pci,netdev=n0,mac=52:54:00:5e:00:01"])
        .args(["-netdev", "hubport,id=n1,hubid=0"])
        .args(["-device", "virtio-net-pci,netdev=n1,mac=52:54:00:5e:00:02"])
        .arg("-kernel")
        .arg(m.kernel)
        .arg("-initrd")
        .arg(m.initrd)
        .args([
            "-append",
            "console=ttyS0 quiet loglevel=4 panic=-1 oops=panic",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("starting qemu-system-x86_64 (cargo xtask setup installs qemu-system-x86)")?;
    let stdout = child.stdout.take().context("qemu stdout")?;
    let (tx, rx) = mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).split(b'\n') {
            let Ok(line) = line else { break };
            let text = String::from_utf8_lossy(&line)
                .trim_end_matches('\r')
                .to_owned();
            if tx.send(text).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + m.timeout;
    let mut status = None;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left.min(Duration::from_secs(1))) {
            Ok(line) => {
                // SeaBIOS clears the screen with escape sequences first.
                let clean: String = line.chars().filter(|c| !c.is_control()).collect();
                if let Some(rest) = clean.trim().strip_prefix(STATUS_MARK) {
                    status = rest.trim().parse::<i32>().ok();
                }
                // Labelled: the lane streams beside the host's tests.
                println!("[{}] {clean}", m.label);
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if Instant::now() >= deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    bail!("the VM did not finish within {:?}; killed", m.timeout);
                }
            }
        }
    }
    let _ = reader.join();
    let exit = child.wait()?;
    match status {
        Some(s) => Ok(s),
        None => bail!("the VM stopped ({exit}) without reporting a status: the kernel or /init failed (see its output above)"),
    }
}
