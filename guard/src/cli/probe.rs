//! `arp-guard probe`: its arguments, and their turning into a checked
//! [`Plan`].

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    time::Duration,
};

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};

use super::{parse_duration, Output};
use crate::probe::{ConnectPlan, NeighMode, Plan, MAX_IPS};

/// The most requests (ARP and NDP) per second a probe sends (all IPs together).
pub const MAX_REQUESTS_PER_SECOND: u64 = 10_000;
/// `--duration` when neither it nor `--count` is given.
pub const DEFAULT_DURATION: Duration = Duration::from_secs(60);

#[derive(Debug, Args)]
#[command(
    after_help = "Exit status: 0 when every IP had exactly one responder and every connect \
    succeeded; 1 when an IP had none, several (conflict) or changed (moved), or a connect failed; \
    2 when the probe could not run (no such interface, no CAP_NET_RAW...). Ctrl-C prints the \
    summary so far and exits with its status."
)]
pub struct ProbeArgs {
    /// Interface on the IPs' segment to probe from.
    #[arg(short, long = "interface", value_name = "IFACE")]
    pub interface: String,
    /// IPv4 addresses (asked with ARP) and IPv6 ones (asked with Neighbor
    /// Solicitations), mixed as you like (at most 1,024).
    #[arg(value_name = "IP")]
    pub ips: Vec<IpAddr>,
    /// Time between two requests for an IP.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_duration)]
    pub interval: Duration,
    /// How long to probe (default 60s; unlimited with --count alone).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Requests per IP (with --duration: whichever ends first).
    #[arg(short, long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub count: Option<u64>,
    /// Sender IP of the requests, one per family (repeat for both). ARP
    /// default: the interface's primary IPv4; with none, 0.0.0.0, an RFC
    /// 5227 ARP probe, which owners answer too. NDP default: the
    /// interface's link-local address.
    #[arg(long, value_name = "IP")]
    pub source: Vec<IpAddr>,
    /// Each round, after the requests, a TCP connect to PORT on every probed
    /// IP, or to IP:PORT or [IPv6]:PORT (probing IP too); repeat for several
    /// IPs. Each connect is attributed to the MAC the host's neighbour table
    /// held.
    #[arg(long, value_name = "PORT|IP:PORT", value_parser = parse_connect)]
    pub connect: Vec<ConnectTarget>,
    /// How long a connect may take.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_duration)]
    pub connect_timeout: Duration,
    /// The host's neighbour entry (ARP or NDP) around each connect: `keep`
    /// it, `flush` it before each (the kernel resolves afresh: the race
    /// decides), or
    /// `pin` it to each responder in turn (each MAC tested on its own;
    /// removed at the end, an earlier permanent entry put back). flush and
    /// pin need CAP_NET_ADMIN.
    #[arg(long, value_enum, default_value_t = NeighArg::Keep)]
    pub neigh: NeighArg,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum NeighArg {
    Keep,
    Flush,
    Pin,
}

impl From<NeighArg> for NeighMode {
    fn from(n: NeighArg) -> Self {
        match n {
            NeighArg::Keep => NeighMode::Keep,
            NeighArg::Flush => NeighMode::Flush,
            NeighArg::Pin => NeighMode::Pin,
        }
    }
}

/// One `--connect`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectTarget {
    /// Every probed IP.
    Port(u16),
    Addr(SocketAddr),
}

fn parse_connect(s: &str) -> Result<ConnectTarget, String> {
    let port_ok = |p: u16| {
        if p == 0 {
            Err(format!("`{s}`: port 0"))
        } else {
            Ok(p)
        }
    };
    if let Ok(p) = s.parse::<u16>() {
        return port_ok(p).map(ConnectTarget::Port);
    }
    let a: SocketAddr = s
        .parse()
        .map_err(|_| format!("`{s}` is neither a port nor IPv4:PORT or [IPv6]:PORT"))?;
    port_ok(a.port())?;
    Ok(ConnectTarget::Addr(a))
}

/// An address the segment can be asked about: IPv6 link-local, multicast,
/// loopback and unspecified addresses are nobody's LB IP (and a link-local
/// target would need a zone to connect to).
fn check_target(ip: IpAddr) -> Result<()> {
    if let IpAddr::V6(v6) = ip {
        if v6.is_unicast_link_local()
            || v6.is_multicast()
            || v6.is_loopback()
            || v6.is_unspecified()
        {
            bail!("{v6} is not an address to probe: give a global (or unique local) IPv6 address");
        }
    }
    Ok(())
}

impl ProbeArgs {
    /// The IPs (the positional ones, then those of `--connect IP:PORT`;
    /// duplicates dropped) and their ports.
    fn targets(&self) -> Result<(Vec<IpAddr>, Vec<Option<u16>>)> {
        let mut ips: Vec<IpAddr> = Vec::new();
        for ip in &self.ips {
            check_target(*ip)?;
            if !ips.contains(ip) {
                ips.push(*ip);
            }
            if ips.len() > MAX_IPS {
                bail!("at most {MAX_IPS} IPs per probe");
            }
        }
        let every: Vec<u16> = self
            .connect
            .iter()
            .filter_map(|c| match c {
                ConnectTarget::Port(p) => Some(*p),
                ConnectTarget::Addr(_) => None,
            })
            .collect();
        if every.len() > 1 {
            bail!("--connect PORT is given twice ({every:?}): one port per IP (use IP:PORT for others)");
        }
        let mut ports = vec![every.first().copied(); ips.len()];
        let mut given = Vec::new();
        for c in &self.connect {
            let ConnectTarget::Addr(a) = c else { continue };
            check_target(a.ip())?;
            if given.contains(&a.ip()) {
                bail!("--connect {a}: {} has a port already (one per IP)", a.ip());
            }
            given.push(a.ip());
            match ips.iter().position(|ip| *ip == a.ip()) {
                Some(i) => ports[i] = Some(a.port()),
                None if ips.len() < MAX_IPS => {
                    ips.push(a.ip());
                    ports.push(Some(a.port()));
                }
                None => bail!("at most {MAX_IPS} IPs per probe"),
            }
        }
        if ips.is_empty() {
            bail!("no IP to probe: name one or more IPs, or --connect IP:PORT");
        }
        Ok((ips, ports))
    }

    /// Whether any target is IPv4 (`false`: IPv6), for opening only the
    /// sockets needed.
    pub fn has_family(&self, ipv4: bool) -> bool {
        let connects = self.connect.iter().filter_map(|c| match c {
            ConnectTarget::Addr(a) => Some(a.ip()),
            ConnectTarget::Port(_) => None,
        });
        self.ips
            .iter()
            .copied()
            .chain(connects)
            .any(|ip| ip.is_ipv4() == ipv4)
    }

    /// The `--source` of a family, at most one each.
    fn source_of(&self, ipv4: bool) -> Result<Option<IpAddr>> {
        let mut given = self.source.iter().filter(|ip| ip.is_ipv4() == ipv4);
        let first = given.next().copied();
        if let Some(second) = given.next() {
            bail!("--source {second}: one source per family");
        }
        Ok(first)
    }

    /// The requests' senders: `--source`, else `default4` for ARP and
    /// `default6` (the interface's link-local) for NDP. Without IPv6
    /// targets the NDP source is unused (`::`).
    pub fn sources(
        &self,
        default4: Ipv4Addr,
        default6: Option<Ipv6Addr>,
    ) -> Result<(Ipv4Addr, Ipv6Addr)> {
        let v4 = match self.source_of(true)? {
            Some(IpAddr::V4(ip)) => ip,
            _ => default4,
        };
        let v6 = match self.source_of(false)? {
            Some(IpAddr::V6(ip)) if ip.is_unspecified() || ip.is_multicast() => {
                bail!("--source {ip}: an NDP source must be a unicast address (a solicitation from :: is duplicate address detection)")
            }
            Some(IpAddr::V6(ip)) => Some(ip),
            _ => default6,
        };
        match v6 {
            Some(v6) => Ok((v4, v6)),
            None if self.has_family(false) => bail!(
                "{} has no usable IPv6 link-local address to send Neighbor Solicitations from                  (IPv6 off on it, or its link-local still tentative): give --source IPV6",
                self.interface
            ),
            None => Ok((v4, Ipv6Addr::UNSPECIFIED)),
        }
    }

    /// The checked plan, asking as `source` (ARP) and `source6` (NDP).
    pub fn plan(&self, source: Ipv4Addr, source6: Ipv6Addr) -> Result<Plan> {
        self.source_of(true)?;
        self.source_of(false)?;
        let (ips, ports) = self.targets()?;
        let interval = self.interval;
        if !(Duration::from_millis(10)..=Duration::from_secs(3600)).contains(&interval) {
            bail!("--interval must be between 10ms and 1h");
        }
        let per_second = ips.len() as u64 * 1000 / (interval.as_millis() as u64).max(1);
        if per_second > MAX_REQUESTS_PER_SECOND {
            bail!(
                "{} IPs every {interval:?} is {per_second} requests per second (at most \
                 {MAX_REQUESTS_PER_SECOND}): raise --interval",
                ips.len()
            );
        }
        let duration = match (self.duration, self.count) {
            (Some(d), _) => Some(d),
            (None, Some(_)) => None,
            (None, None) => Some(DEFAULT_DURATION),
        };
        if duration.is_some_and(|d| d < interval || d > Duration::from_secs(7 * 86_400)) {
            bail!("--duration must be between --interval and 7 days");
        }
        let by_duration = duration.map(|d| {
            d.as_nanos()
                .div_ceil(interval.as_nanos())
                .min(u64::MAX.into()) as u64
        });
        // One of the two is set (a duration when --count is not).
        let rounds = [self.count, by_duration]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(1);
        let neigh = NeighMode::from(self.neigh);
        if neigh != NeighMode::Keep && self.connect.is_empty() {
            bail!(
                "--neigh {} is about connects: it needs --connect",
                neigh.as_str()
            );
        }
        let timeout = self.connect_timeout;
        if !(Duration::from_millis(1)..=Duration::from_secs(60)).contains(&timeout) {
            bail!("--connect-timeout must be between 1ms and 60s");
        }
        Ok(Plan {
            ips,
            source,
            source6,
            interval,
            rounds,
            duration,
            connect: (!self.connect.is_empty()).then_some(ConnectPlan {
                ports,
                timeout,
                neigh,
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser as _;

    fn args(line: &str) -> Result<ProbeArgs, clap::Error> {
        let words = ["arp-guard", "probe"]
            .into_iter()
            .chain(line.split_whitespace());
        match Cli::try_parse_from(words)?.command {
            Command::Probe(a) => Ok(a),
            other => panic!("not probe: {other:?}"),
        }
    }

    const LL: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);

    fn plan(line: &str) -> Result<Plan> {
        args(line)?.plan(Ipv4Addr::new(198, 51, 100, 1), LL)
    }

    #[test]
    fn defaults_ask_once_a_second_for_a_minute() {
        let p = plan("-i eth0 198.51.100.100").unwrap();
        assert_eq!(
            (p.interval, p.rounds, p.duration),
            (Duration::from_secs(1), 60, Some(DEFAULT_DURATION))
        );
        assert_eq!(p.connect, None);
        assert_eq!(
            args("-i eth0 198.51.100.100").unwrap().output,
            Output::Table
        );
    }

    #[test]
    fn count_and_duration() {
        assert_eq!(plan("-i eth0 1.2.3.4 --count 5").unwrap().rounds, 5);
        assert_eq!(plan("-i eth0 1.2.3.4 --count 5").unwrap().duration, None);
        assert_eq!(
            plan("-i eth0 1.2.3.4 --interval 100ms --duration 2s")
                .unwrap()
                .rounds,
            20
        );
        assert_eq!(
            plan("-i eth0 1.2.3.4 --interval 300ms --duration 1s")
                .unwrap()
                .rounds,
            4
        );
        assert_eq!(
            plan("-i eth0 1.2.3.4 -c 3 --duration 10s").unwrap().rounds,
            3
        );
    }

    #[test]
    fn connect_targets() {
        let p =
            plan("-i eth0 1.2.3.4 1.2.3.5 --connect 80 --connect 1.2.3.6:443 --neigh pin").unwrap();
        assert_eq!(p.ips.len(), 3);
        let c = p.connect.unwrap();
        assert_eq!(c.ports, [Some(80), Some(80), Some(443)]);
        assert_eq!(
            (c.neigh, c.timeout),
            (NeighMode::Pin, Duration::from_secs(1))
        );
        let p = plan("-i eth0 1.2.3.4 --connect 1.2.3.5:22").unwrap();
        assert_eq!(p.connect.unwrap().ports, [None, Some(22)]);
        let p = plan("-i eth0 --connect 1.2.3.5:22 1.2.3.5").unwrap();
        assert_eq!(p.ips, [IpAddr::from(Ipv4Addr::new(1, 2, 3, 5))]);
    }

    #[test]
    fn bad_combinations_are_refused() {
        for (line, why) in [
            ("-i eth0", "no IP to probe"),
            ("-i eth0 1.2.3.4 --neigh flush", "needs --connect"),
            ("-i eth0 1.2.3.4 --connect 80 --connect 81", "given twice"),
            (
                "-i eth0 --connect 1.2.3.4:80 --connect 1.2.3.4:81",
                "one per IP",
            ),
            ("-i eth0 1.2.3.4 --interval 1ms", "--interval"),
            ("-i eth0 1.2.3.4 --interval 2s --duration 1s", "--duration"),
            (
                "-i eth0 1.2.3.4 --connect 80 --connect-timeout 2m",
                "--connect-timeout",
            ),
            ("-i eth0 ::1", "not an address to probe"),
            ("-i eth0 fe80::1", "not an address to probe"),
            ("-i eth0 --connect [ff02::1]:80", "not an address to probe"),
            (
                "-i eth0 1.2.3.4 --source 1.1.1.1 --source 2.2.2.2",
                "one source per family",
            ),
        ] {
            let err = plan(line).unwrap_err().to_string();
            assert!(err.contains(why), "{line}: {err}");
        }
        for line in [
            "1.2.3.4",
            "-i eth0 1.2.3.4 --connect 0",
            "-i eth0 1.2.3.4 --connect x:80",
            "-i eth0 1.2.3.4 --connect fd00::1:80",
            "-i eth0 fd00::zz",
        ] {
            assert!(args(line).is_err(), "{line}");
        }
    }

    #[test]
    fn ips_and_rates_are_bounded() {
        let many: Vec<String> = (0..=MAX_IPS as u32)
            .map(|i| Ipv4Addr::from(0x0a00_0000 + i).to_string())
            .collect();
        let err = plan(&format!("-i eth0 {}", many.join(" "))).unwrap_err();
        assert!(err.to_string().contains("at most 1024"), "{err}");
        let some = many[..200].join(" ");
        let err = plan(&format!("-i eth0 --interval 10ms {some}")).unwrap_err();
        assert!(err.to_string().contains("per second"), "{err}");
        assert!(plan(&format!("-i eth0 --interval 20ms {some}")).is_ok());
    }

    #[test]
    fn ipv4_and_ipv6_mixed() {
        let p = plan("-i eth0 198.51.100.100 fd00::100 --connect [fd00::101]:443 --connect 80")
            .unwrap();
        let want: Vec<IpAddr> = ["198.51.100.100", "fd00::100", "fd00::101"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        assert_eq!(p.ips, want);
        assert_eq!(p.connect.unwrap().ports, [Some(80), Some(80), Some(443)]);
        assert_eq!(p.source6, LL);
        let a = args("-i eth0 fd00::100").unwrap();
        assert!(a.has_family(false) && !a.has_family(true));
        let a = args("-i eth0 1.2.3.4 --connect [fd00::1]:80").unwrap();
        assert!(a.has_family(false) && a.has_family(true));
    }

    #[test]
    fn sources_per_family() {
        let v4 = Ipv4Addr::new(198, 51, 100, 1);
        let a = args("-i eth0 fd00::100 1.2.3.4").unwrap();
        assert_eq!(a.sources(v4, Some(LL)).unwrap(), (v4, LL));
        let err = a.sources(v4, None).unwrap_err().to_string();
        assert!(
            err.contains("no usable IPv6 link-local") && err.contains("--source"),
            "{err}"
        );
        let a = args("-i eth0 fd00::100 1.2.3.4 --source fd00::9 --source 198.51.100.9").unwrap();
        let (s4, s6) = a.sources(v4, None).unwrap();
        assert_eq!(
            (s4.to_string(), s6.to_string()),
            ("198.51.100.9".into(), "fd00::9".into())
        );
        // No IPv6 target: no link-local needed.
        let a = args("-i eth0 1.2.3.4").unwrap();
        assert_eq!(a.sources(v4, None).unwrap(), (v4, Ipv6Addr::UNSPECIFIED));
        // Never ::, which is duplicate address detection.
        let a = args("-i eth0 fd00::100 --source ::").unwrap();
        assert!(a
            .sources(v4, Some(LL))
            .unwrap_err()
            .to_string()
            .contains("unicast"));
    }
}
