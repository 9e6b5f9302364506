//! Real forward proxies from Debian for the tests, as an operator's
//! corporate proxy or bastion: tinyproxy (HTTP CONNECT, with Basic
//! credentials) and microsocks (SOCKS5, with a user and a password), each
//! in a network namespace, listening on one address and connecting out from
//! another ([`OUT`]), so that a fake API server reachable only from there
//! (`FakeApi::only_from`) is answered only through the proxy. tinyproxy's
//! log says which tunnels it opened. A proxy is killed on drop, or when a test
//! wants it dead mid-watch.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::{bail, Context as _, Result};

use crate::{bed::TempDir, wait_for, Netns};

/// The address the proxies connect out from (on the management bridge).
pub const OUT: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 2);
/// The user every proxy here asks for.
pub const USER: &str = "alice";

impl Kind {
    /// Its password: tinyproxy's configuration takes `[-a-z0-9._]` only;
    /// microsocks's has what must be percent-encoded in a URL and reach the
    /// proxy decoded.
    pub fn password(self) -> &'static str {
        match self {
            Kind::Http => "s3cr.t-x",
            Kind::Socks5 => "s3cr%t:@x",
        }
    }
}

/// Which proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// tinyproxy: `http://user:password@host:port`.
    Http,
    /// microsocks: `socks5://user:password@host:port`.
    Socks5,
}

/// A running proxy; killed on drop.
pub struct Proxy {
    pub kind: Kind,
    pub addr: SocketAddr,
    ns: String,
    child: Option<Child>,
    log: PathBuf,
    dir: TempDir,
}

/// Whether the proxies are installed (`cargo xtask setup` installs them).
pub fn available() -> bool {
    ["/usr/bin/tinyproxy", "/usr/bin/microsocks"]
        .iter()
        .all(|p| std::path::Path::new(p).exists())
}

impl Proxy {
    /// Start `kind` in `ns`, listening on `listen`, connecting out from
    /// [`OUT`] (added to `dev` in `ns` if it is not there).
    pub fn start(kind: Kind, ns: &Netns, dev: &str, listen: SocketAddr) -> Result<Proxy> {
        if !available() {
            bail!("tinyproxy and microsocks are needed (cargo xtask setup installs them)");
        }
        let _ = ns.ip(&["addr", "add", &format!("{OUT}/24"), "dev", dev]);
        let dir = TempDir::new("proxy")?;
        let log = dir.path().join("proxy.log");
        let mut p = Proxy {
            kind,
            addr: listen,
            ns: ns.name.clone(),
            child: None,
            log,
            dir,
        };
        p.spawn()?;
        Ok(p)
    }

    fn spawn(&mut self) -> Result<()> {
        let (ip, port) = (self.addr.ip().to_string(), self.addr.port().to_string());
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns]);
        match self.kind {
            Kind::Http => {
                let conf = self.dir.path().join("tinyproxy.conf");
                std::fs::write(
                    &conf,
                    format!(
                        "Port {port}\nListen {ip}\nBind {OUT}\nTimeout 3600\nLogFile \"{}\"\n\
                         LogLevel Connect\nMaxClients 200\nAllow 0.0.0.0/0\nConnectPort 6443\n\
                         BasicAuth {USER} {}\nUser root\nGroup root\n",
                        self.log.display(),
                        self.kind.password()
                    ),
                )?;
                c.args(["tinyproxy", "-d", "-c"]).arg(&conf);
                c.stdout(Stdio::null()).stderr(Stdio::null());
            }
            Kind::Socks5 => {
                c.args(["microsocks", "-i", &ip, "-p", &port, "-b"])
                    .arg(OUT.to_string())
                    .args(["-u", USER, "-P", self.kind.password()]);
                c.stdout(Stdio::null()).stderr(Stdio::null());
            }
        }
        self.child = Some(
            c.spawn()
                .with_context(|| format!("starting {:?}", self.kind))?,
        );
        let probe = format!("exec 3<>/dev/tcp/{ip}/{port}");
        let listening = wait_for(Duration::from_secs(5), || {
            let o = Command::new("ip")
                .args(["netns", "exec", &self.ns, "bash", "-c", &probe])
                .stderr(Stdio::null())
                .status()
                .ok()?;
            o.success().then_some(())
        });
        if listening.is_none() {
            bail!("{:?} never listened on {}", self.kind, self.addr);
        }
        Ok(())
    }

    /// The proxy's URL with its credentials, percent-encoded.
    pub fn url(&self) -> String {
        let enc = |s: &str| {
            s.bytes()
                .map(|b| match b {
                    b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                        (b as char).to_string()
                    }
                    _ => format!("%{b:02X}"),
                })
                .collect::<String>()
        };
        let scheme = match self.kind {
            Kind::Http => "http",
            Kind::Socks5 => "socks5",
        };
        format!(
            "{scheme}://{}:{}@{}",
            enc(USER),
            enc(self.kind.password()),
            self.addr
        )
    }

    /// The same without credentials (the proxy refuses it).
    pub fn url_without_credentials(&self) -> String {
        let scheme = match self.kind {
            Kind::Http => "http",
            Kind::Socks5 => "socks5",
        };
        format!("{scheme}://{}", self.addr)
    }

    /// Tunnels opened to `target` (host:port) so far, as tinyproxy's log
    /// has them (microsocks logs nothing: count at the server, which
    /// answers only the proxies, `FakeApi::connections`).
    pub fn tunnels_to(&self, target: &str) -> usize {
        assert_eq!(self.kind, Kind::Http, "only tinyproxy logs its tunnels");
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let needle = format!("CONNECT {target} ");
        log.lines().filter(|l| l.contains(&needle)).count()
    }

    /// The proxy's log so far (for a failing assertion).
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Kill it: every tunnel through it is cut, and nothing listens.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Start it again on the same address.
    pub fn restart(&mut self) -> Result<()> {
        self.kill();
        self.spawn()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `OUT` as an address.
pub fn out() -> IpAddr {
    IpAddr::V4(OUT)
}
