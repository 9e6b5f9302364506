//! The node as files show it: sysctls, interfaces, routes, mounts and the
//! kernel release, read under a procfs and a sysfs root given as
//! parameters (so every check runs on fixture trees in the unit tests).
//! Reads are bounded and never block: a FIFO, a device, a huge or
//! malformed file in a sysctl's place reads as "unknown" with the reason.

use std::{
    collections::BTreeMap,
    io::Read as _,
    net::Ipv4Addr,
    path::{Path, PathBuf},
};

use crate::model::text::clip;

/// A sysctl or other small value, or why it is unknown.
pub type Reading = Result<i64, String>;

/// The largest sysctl file read (they hold a number and a newline).
const SMALL: u64 = 256;
/// The largest table read (/proc/mounts, /proc/net/route).
const TABLE: u64 = 16 << 20;
/// Interfaces listed at most.
const MAX_IFACES: usize = 65_536;

/// The per-interface sysctls the checks read (`conf/<if>/<key>`).
pub const CONF_KEYS: [&str; 4] = ["arp_ignore", "arp_announce", "rp_filter", "forwarding"];
/// The same for IPv6 (`ipv6/conf/<if>/<key>`): what decides its Neighbor
/// Discovery answers.
pub const CONF6_KEYS: [&str; 5] = [
    "disable_ipv6",
    "forwarding",
    "proxy_ndp",
    "accept_dad",
    "accept_ra",
];

/// One route of the main table (as /proc/net/route lists it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub iface: String,
    pub dst: Ipv4Addr,
    pub prefix: u8,
    pub gateway: Option<Ipv4Addr>,
    pub metric: u32,
}

impl Route {
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        let mask = u32::MAX
            .checked_shl(32 - u32::from(self.prefix))
            .unwrap_or(0);
        u32::from(ip) & mask == u32::from(self.dst) & mask
    }

    pub fn describe(&self) -> String {
        match self.gateway {
            Some(gw) => format!("{}/{} via {gw} dev {}", self.dst, self.prefix, self.iface),
            None => format!("{}/{} dev {}", self.dst, self.prefix, self.iface),
        }
    }
}

/// What the files under the two roots say.
#[derive(Debug, Clone)]
pub struct Node {
    pub proc_root: PathBuf,
    /// `<proc>/sys/kernel/osrelease`.
    pub kernel: Result<String, String>,
    /// `<proc>/sys/net/ipv4/ip_forward`.
    pub ip_forward: Reading,
    /// `conf/<iface or all>/<key>`, for `all` and the interfaces asked for.
    pub conf: BTreeMap<(String, &'static str), Reading>,
    /// `ipv6/conf/<iface or all>/<key>`, the same way.
    pub conf6: BTreeMap<(String, &'static str), Reading>,
    /// Interfaces in `<sys>/class/net` with their ifindex.
    pub interfaces: Result<BTreeMap<String, Option<u32>>, String>,
    /// The main routing table, IPv4.
    pub routes: Result<Vec<Route>, String>,
    /// Where bpffs is mounted (`<proc>/mounts`).
    pub bpf_mounts: Result<Vec<PathBuf>, String>,
}

impl Node {
    /// Everything but the per-interface sysctls ([`Node::read_conf`]).
    pub fn read(proc_root: &Path, sys_root: &Path) -> Self {
        let p = |rel: &str| proc_root.join(rel);
        Node {
            proc_root: proc_root.to_owned(),
            kernel: read_file(&p("sys/kernel/osrelease"), SMALL).map(|s| s.trim().to_owned()),
            ip_forward: read_number(&p("sys/net/ipv4/ip_forward")),
            conf: BTreeMap::new(),
            conf6: BTreeMap::new(),
            interfaces: read_interfaces(&sys_root.join("class/net")),
            routes: read_file(&p("net/route"), TABLE).map(|t| parse_routes(&t)),
            bpf_mounts: read_file(&p("mounts"), TABLE).map(|t| parse_bpf_mounts(&t)),
        }
    }

    /// Read `conf/<if>/<key>` (IPv4 and IPv6) for `all` and each of `ifaces`.
    pub fn read_conf<'a>(&mut self, ifaces: impl IntoIterator<Item = &'a str>) {
        let base = self.proc_root.join("sys/net/ipv4/conf");
        let base6 = self.proc_root.join("sys/net/ipv6/conf");
        for iface in std::iter::once("all").chain(ifaces) {
            // A name that could leave the directory is no interface.
            let bad = iface.is_empty() || iface.contains('/') || iface == "." || iface == "..";
            let read = |base: &Path, key: &str| {
                if bad {
                    Err("not an interface name".to_owned())
                } else {
                    read_number(&base.join(iface).join(key))
                }
            };
            for key in CONF_KEYS {
                self.conf.insert((iface.to_owned(), key), read(&base, key));
            }
            for key in CONF6_KEYS {
                self.conf6
                    .insert((iface.to_owned(), key), read(&base6, key));
            }
        }
    }

    /// `ipv6/conf/<iface>/<key>` as read (unknown if never asked for).
    pub fn conf6(&self, iface: &str, key: &'static str) -> Reading {
        self.conf6
            .get(&(iface.to_owned(), key))
            .cloned()
            .unwrap_or_else(|| Err("not read".into()))
    }

    /// Whether IPv6 runs on `iface`: the kernel has IPv6 (`ipv6/conf/<if>`
    /// exists) and the interface's `disable_ipv6` is 0 (writing `all`
    /// writes every interface; the kernel reads the interface's).
    pub fn ipv6_on(&self, iface: &str) -> Result<bool, String> {
        match self.conf6(iface, "disable_ipv6") {
            Ok(v) => Ok(v == 0),
            Err(e) if e.ends_with("not found") => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// `conf/<iface>/<key>` as read (unknown if never asked for).
    pub fn conf(&self, iface: &str, key: &'static str) -> Reading {
        self.conf
            .get(&(iface.to_owned(), key))
            .cloned()
            .unwrap_or_else(|| Err("not read".into()))
    }

    /// The value the kernel uses for `iface`: the maximum of `all` and the
    /// interface's own (arp_ignore, arp_announce, rp_filter), with both
    /// values for the record ("1 (all 1, eth0 0)").
    pub fn effective(&self, iface: &str, key: &'static str) -> (Reading, String) {
        let all = self.conf("all", key);
        let dev = self.conf(iface, key);
        let show = |r: &Reading| match r {
            Ok(v) => v.to_string(),
            Err(e) => format!("unknown: {e}"),
        };
        let detail = format!("all {}, {iface} {}", show(&all), show(&dev));
        let eff = match (&all, &dev) {
            (Ok(a), Ok(d)) => Ok(*a.max(d)),
            (Err(e), _) | (_, Err(e)) => Err(e.clone()),
        };
        (eff, detail)
    }

    /// Whether `iface` exists (per `<sys>/class/net`).
    pub fn has_interface(&self, iface: &str) -> bool {
        self.interfaces
            .as_ref()
            .is_ok_and(|m| m.contains_key(iface))
    }

    pub fn ifindex(&self, iface: &str) -> Option<u32> {
        self.interfaces.as_ref().ok()?.get(iface).copied().flatten()
    }

    /// The route the kernel would take to `ip` in the main table: longest
    /// prefix, then lowest metric.
    pub fn route_to(&self, ip: Ipv4Addr) -> Option<&Route> {
        let routes = self.routes.as_ref().ok()?;
        routes
            .iter()
            .filter(|r| r.contains(ip))
            .min_by_key(|r| (std::cmp::Reverse(r.prefix), r.metric))
    }
}

/// Read a regular file of at most `max` bytes. Never blocks on a FIFO or a
/// device (opened non-blocking, refused unless a regular file).
pub fn read_file(path: &Path, max: u64) -> Result<String, String> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => format!("{} not found", path.display()),
            _ => format!("{}: {e}", path.display()),
        })?;
    let meta = file
        .metadata()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if !meta.is_file() {
        return Err(format!("{} is not a regular file", path.display()));
    }
    // procfs and sysfs files report size 0: the limit is on what is read.
    let mut buf = Vec::new();
    file.take(max + 1)
        .read_to_end(&mut buf)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if buf.len() as u64 > max {
        return Err(format!(
            "{} is larger than {max} bytes; not read",
            path.display()
        ));
    }
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// A sysctl holding one integer.
pub fn read_number(path: &Path) -> Reading {
    let text = read_file(path, SMALL)?;
    let t = text.trim();
    t.parse::<i64>()
        .map_err(|_| format!("{} holds {:?}, not a number", path.display(), clip(t, 40)))
}

fn read_interfaces(dir: &Path) -> Result<BTreeMap<String, Option<u32>>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut out = BTreeMap::new();
    for e in entries.flatten().take(MAX_IFACES) {
        let name = e.file_name().to_string_lossy().into_owned();
        let index = read_number(&e.path().join("ifindex"))
            .ok()
            .and_then(|i| u32::try_from(i).ok());
        out.insert(name, index);
    }
    Ok(out)
}

/// `/proc/net/route`: a header, then `Iface Destination Gateway Flags RefCnt
/// Use Metric Mask ...`, addresses as the hex of the network-order word read
/// as a native integer. Only routes that are up (RTF_UP); malformed lines
/// are skipped.
pub fn parse_routes(text: &str) -> Vec<Route> {
    const RTF_UP: u32 = 0x1;
    const RTF_GATEWAY: u32 = 0x2;
    let hex = |s: &str| u32::from_str_radix(s, 16).ok();
    let addr = |s: &str| hex(s).map(|v| Ipv4Addr::from(v.to_ne_bytes()));
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (iface, dst, gw, flags) = (
                *f.first()?,
                addr(f.get(1)?)?,
                addr(f.get(2)?)?,
                hex(f.get(3)?)?,
            );
            let metric = f.get(6)?.parse().ok()?;
            let mask = u32::from(addr(f.get(7)?)?);
            // A mask is contiguous ones; anything else is not a route we read.
            let prefix = mask.leading_ones();
            if mask.checked_shl(prefix).unwrap_or(0) != 0 || flags & RTF_UP == 0 {
                return None;
            }
            Some(Route {
                iface: iface.to_owned(),
                dst,
                prefix: prefix as u8,
                gateway: (flags & RTF_GATEWAY != 0).then_some(gw),
                metric,
            })
        })
        .collect()
}

/// Mount points of bpf file systems in a `/proc/mounts` text (octal
/// escapes such as `\040` decoded).
pub fn parse_bpf_mounts(text: &str) -> Vec<PathBuf> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, target, fstype) = (f.next()?, f.next()?, f.next()?);
            (fstype == "bpf").then(|| PathBuf::from(unescape(target)))
        })
        .collect()
}

fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let oct = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], oct) {
            (b'\\', Some(d)) => {
                out.push(
                    d.iter()
                        .fold(0u8, |a, c| a.wrapping_mul(8).wrapping_add(c - b'0')),
                );
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `(major, minor)` of a kernel release such as `6.8.0-45-generic`.
pub fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::doctor::tests::Tree;

    #[test]
    fn effective_is_the_maximum_of_all_and_the_interface() {
        let t = Tree::new("eff");
        t.iface("eth0", 2)
            .conf("all", "arp_ignore", "1")
            .conf("eth0", "arp_ignore", "0");
        t.conf("all", "rp_filter", "0")
            .conf("eth0", "rp_filter", "2");
        let mut n = Node::read(&t.proc(), &t.sys());
        n.read_conf(["eth0"]);
        let (v, detail) = n.effective("eth0", "arp_ignore");
        assert_eq!(v, Ok(1));
        assert_eq!(detail, "all 1, eth0 0");
        assert_eq!(n.effective("eth0", "rp_filter").0, Ok(2));
        // An interface never asked for, or missing, is unknown, not 0.
        assert!(n.effective("eth9", "rp_filter").0.is_err());
        n.read_conf(["eth9"]);
        let (v, detail) = n.effective("eth9", "rp_filter");
        assert!(v.unwrap_err().contains("not found"));
        assert!(detail.contains("eth9 unknown"), "{detail}");
    }

    #[test]
    fn hostile_files_read_as_unknown() {
        let t = Tree::new("hostile");
        t.iface("eth0", 2);
        // Huge, malformed, a directory, a FIFO, a path out of the tree.
        t.write(
            "proc/sys/net/ipv4/conf/all/arp_ignore",
            &"9".repeat(100_000),
        );
        t.write("proc/sys/net/ipv4/conf/all/arp_announce", "two\n");
        std::fs::create_dir_all(t.path("proc/sys/net/ipv4/conf/all/rp_filter")).unwrap();
        let fifo = t.path("proc/sys/net/ipv4/conf/eth0/arp_ignore");
        std::fs::remove_file(&fifo).unwrap();
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo with a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        t.write("proc/sys/net/ipv4/ip_forward", "99999999999999999999999\n");
        let mut n = Node::read(&t.proc(), &t.sys());
        n.read_conf(["eth0", "../../..", ""]);
        assert!(n
            .conf("all", "arp_ignore")
            .unwrap_err()
            .contains("larger than"));
        assert!(n
            .conf("all", "arp_announce")
            .unwrap_err()
            .contains("not a number"));
        assert!(n
            .conf("all", "rp_filter")
            .unwrap_err()
            .contains("not a regular file"));
        assert!(n
            .conf("eth0", "arp_ignore")
            .unwrap_err()
            .contains("not a regular file"));
        assert!(n
            .conf("../../..", "arp_ignore")
            .unwrap_err()
            .contains("not an interface"));
        assert!(n.ip_forward.is_err());
        assert!(n.kernel.is_err(), "no osrelease in the tree");
        assert!(n.routes.is_err() && n.bpf_mounts.is_err());
    }

    #[test]
    fn routes_and_lookup() {
        let t = Tree::new("routes");
        t.routes(&[
            ("eth0", "198.51.100.0/24", None, 0),
            ("eth1", "203.0.113.0/25", None, 0),
            ("eth1", "203.0.113.128/25", Some("203.0.113.1"), 0),
            ("eth0", "0.0.0.0/0", Some("198.51.100.1"), 200),
            ("eth1", "0.0.0.0/0", Some("203.0.113.1"), 100),
        ]);
        let n = Node::read(&t.proc(), &t.sys());
        let r = n.routes.as_ref().unwrap();
        assert_eq!(r.len(), 5);
        assert_eq!(r[0].dst, Ipv4Addr::new(198, 51, 100, 0));
        assert_eq!(r[0].prefix, 24);
        assert_eq!(r[2].gateway, Some(Ipv4Addr::new(203, 0, 113, 1)));
        let via = |ip: &str| n.route_to(ip.parse().unwrap()).map(|r| r.iface.clone());
        assert_eq!(via("198.51.100.7").as_deref(), Some("eth0"));
        assert_eq!(via("203.0.113.200").as_deref(), Some("eth1"));
        // The default with the lower metric wins.
        assert_eq!(via("192.0.2.1").as_deref(), Some("eth1"));
        assert_eq!(
            n.route_to("203.0.113.200".parse().unwrap())
                .unwrap()
                .describe(),
            "203.0.113.128/25 via 203.0.113.1 dev eth1"
        );
        // Garbage lines and non-contiguous masks are skipped.
        let junk = "h\neth0 zz 0 1 0 0 0 0\neth0 0000000A 00000000 0001 0 0 0 00FF00FF\n";
        assert!(parse_routes(junk).is_empty());
    }

    #[test]
    fn bpf_mounts_and_kernel() {
        let m = "sysfs /sys sysfs rw 0 0\nbpf /sys/fs/bpf bpf rw 0 0\nbpf /tmp/a\\040b bpf rw 0 0\nshort\n";
        assert_eq!(
            parse_bpf_mounts(m),
            [PathBuf::from("/sys/fs/bpf"), PathBuf::from("/tmp/a b")]
        );
        assert_eq!(kernel_version("6.8.0-45-generic"), Some((6, 8)));
        assert_eq!(kernel_version("5.10"), Some((5, 10)));
        assert_eq!(kernel_version("garbage"), None);
    }
}
