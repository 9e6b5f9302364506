//! Network namespaces that remove themselves.

use std::{
    fs::File,
    os::fd::AsRawFd,
    process::{Command, Output},
    sync::atomic::{AtomicU32, Ordering},
};

use anyhow::{bail, Context as _, Result};

static NEXT: AtomicU32 = AtomicU32::new(0);

/// Every namespace the test bed makes starts with this, then the creating pid.
pub const PREFIX: &str = "agt";

/// A named network namespace (`ip netns add`), deleted on drop together with
/// every interface in it.
#[derive(Debug)]
pub struct Netns {
    pub name: String,
}

impl Netns {
    /// A new namespace named `agt<pid>-<n>-<tag>`; loopback is brought up.
    pub fn new(tag: &str) -> Result<Self> {
        sweep_stale();
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let name = format!("{PREFIX}{}-{n}-{tag}", std::process::id());
        run(Command::new("ip").args(["netns", "add", &name]))?;
        let ns = Netns { name };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// `ip -n <ns> <args>`; fails with ip's stderr.
    pub fn ip(&self, args: &[&str]) -> Result<String> {
        run(Command::new("ip").arg("-n").arg(&self.name).args(args))
    }

    /// Run a command inside the namespace.
    pub fn exec(&self, args: &[&str]) -> Result<String> {
        run(Command::new("ip")
            .args(["netns", "exec", &self.name])
            .args(args))
    }

    /// The same, returning the raw output whatever the exit status.
    pub fn exec_output(&self, args: &[&str]) -> Result<Output> {
        Command::new("ip")
            .args(["netns", "exec", &self.name])
            .args(args)
            .output()
            .context("spawning ip netns exec")
    }

    /// A command that will run inside the namespace.
    pub fn command(&self, program: &std::path::Path) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name]).arg(program);
        c
    }

    pub fn sysctl(&self, key: &str, value: &str) -> Result<()> {
        self.exec(&["sysctl", "-qw", &format!("{key}={value}")])
            .map(|_| ())
    }

    /// Run `f` on a thread that has entered this namespace. Sockets opened in
    /// `f` belong to the namespace and stay there when returned.
    pub fn enter<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let path = format!("/run/netns/{}", self.name);
        let file = File::open(&path).with_context(|| format!("opening {path}"))?;
        std::thread::spawn(move || {
            // SAFETY: setns on this thread only; the fd is valid while `file` lives.
            if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                bail!("setns: {}", std::io::Error::last_os_error());
            }
            f()
        })
        .join()
        .map_err(|_| anyhow::anyhow!("thread in netns panicked"))?
    }

    /// MAC address of an interface in this namespace.
    pub fn mac(&self, iface: &str) -> Result<[u8; 6]> {
        let out = self.ip(&["-br", "link", "show", "dev", iface])?;
        let mac = out
            .split_whitespace()
            .nth(2)
            .context("no MAC in ip -br link")?;
        parse_mac(mac)
    }

    /// The neighbour entry for `ip` on `iface`: (lladdr, state), if any, as
    /// `ip neigh show to <ip> dev <iface>` shows it (read over rtnetlink in
    /// this process: the tests poll it).
    pub fn neigh(&self, iface: &str, ip: &str) -> Result<Option<(Option<[u8; 6]>, String)>> {
        let addr: std::net::IpAddr = ip.parse().with_context(|| format!("address {ip}"))?;
        let name = std::ffi::CString::new(iface)?;
        let iface = iface.to_owned();
        self.enter(move || {
            // SAFETY: name is a valid NUL-terminated string.
            let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
            if index == 0 {
                bail!("no device {iface}: {}", std::io::Error::last_os_error());
            }
            crate::neigh::entry(index, addr)
        })
    }

    /// The MAC `ip` is cached at, if the entry is usable (not INCOMPLETE/FAILED).
    pub fn cached_mac(&self, iface: &str, ip: &str) -> Result<Option<[u8; 6]>> {
        Ok(self.neigh(iface, ip)?.and_then(|(mac, state)| {
            if state == "FAILED" || state == "INCOMPLETE" {
                None
            } else {
                mac
            }
        }))
    }

    /// `ip neigh replace IP lladdr MAC dev IFACE nud NUD` (`-6` for an IPv6
    /// address): the entry for `ip` on `iface` holds `mac` in state `nud`
    /// (reachable, stale, permanent, ...).
    pub fn set_neigh(
        &self,
        iface: &str,
        ip: impl Into<std::net::IpAddr>,
        mac: &[u8; 6],
        nud: &str,
    ) -> Result<()> {
        let ip = ip.into();
        let (addr, mac) = (ip.to_string(), fmt_mac(mac));
        let family: &[&str] = if ip.is_ipv6() { &["-6"] } else { &[] };
        let entry = [
            "neigh", "replace", &addr, "lladdr", &mac, "dev", iface, "nud", nud,
        ];
        self.ip(&[family, &entry[..]].concat()).map(|_| ())
    }

    pub fn flush_neigh(&self, iface: &str) -> Result<()> {
        self.ip(&["neigh", "flush", "dev", iface]).map(|_| ())
    }

    /// Make the kernel resolve `ip` by sending one UDP datagram to it.
    pub fn poke(&self, dst: &str) -> Result<()> {
        let addr: std::net::SocketAddr = format!("{dst}:9").parse()?;
        self.enter(move || {
            let s = std::net::UdpSocket::bind("0.0.0.0:0")?;
            let _ = s.send_to(b"arp-guard test", addr);
            Ok(())
        })
    }

    /// Send one UDP datagram from `src` (a local address) to `dst`.
    pub fn poke_from(&self, src: &str, dst: &str) -> Result<()> {
        let src: std::net::SocketAddr = format!("{src}:0").parse()?;
        let dst: std::net::SocketAddr = format!("{dst}:9").parse()?;
        self.enter(move || {
            let s = std::net::UdpSocket::bind(src)?;
            let _ = s.send_to(b"arp-guard test", dst);
            Ok(())
        })
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// Join `a:a_if` and `b:b_if` with a veth pair (created directly inside the
/// two namespaces) and bring both ends up.
pub fn veth(a: &Netns, a_if: &str, b: &Netns, b_if: &str) -> Result<()> {
    a.ip(&[
        "link", "add", a_if, "type", "veth", "peer", "name", b_if, "netns", &b.name,
    ])?;
    a.ip(&["link", "set", a_if, "up"])?;
    b.ip(&["link", "set", b_if, "up"])?;
    Ok(())
}

/// kube-ipvs0 holding `ips` (/32), as kube-proxy in IPVS mode makes it: a
/// dummy device, left down. Where the kernel has no dummy driver (the
/// development machine's), a veth end that is down and NOARP carries the
/// addresses just as well. Either way the kernel treats them as local and,
/// with arp_ignore=0, answers ARP for them on every interface.
pub fn kube_ipvs0(ns: &Netns, ips: &[std::net::Ipv4Addr]) -> Result<()> {
    if ns
        .ip(&["link", "add", "kube-ipvs0", "type", "dummy"])
        .is_err()
    {
        ns.ip(&[
            "link",
            "add",
            "kube-ipvs0",
            "type",
            "veth",
            "peer",
            "name",
            "kipvs-peer",
        ])?;
        ns.ip(&["link", "set", "kube-ipvs0", "arp", "off"])?;
    }
    for ip in ips {
        ns.ip(&["addr", "add", &format!("{ip}/32"), "dev", "kube-ipvs0"])?;
    }
    Ok(())
}

pub fn parse_mac(s: &str) -> Result<[u8; 6]> {
    let parts: Vec<u8> = s
        .split(':')
        .map(|p| u8::from_str_radix(p, 16))
        .collect::<Result<_, _>>()
        .with_context(|| format!("bad MAC {s}"))?;
    parts.try_into().map_err(|_| anyhow::anyhow!("bad MAC {s}"))
}

pub fn fmt_mac(m: &[u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

fn run(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("spawning {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Remove namespaces left by test-bed processes that no longer exist (a run
/// killed with SIGKILL cannot clean up after itself).
fn sweep_stale() {
    let Ok(entries) = std::fs::read_dir("/run/netns") else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(PREFIX) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = Command::new("ip").args(["netns", "del", &name]).output();
        }
    }
}
