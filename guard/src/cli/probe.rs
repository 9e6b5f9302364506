//! `arp-guard probe`: its arguments, and their turning into a checked
//! [`Plan`].

use std::{
    net::{Ipv4Addr, SocketAddrV4},
    time::Duration,
};

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};

use super::{parse_duration, Output};
use crate::probe::{ConnectPlan, NeighMode, Plan, MAX_IPS};

/// The most ARP requests per second a probe sends (all IPs together).
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
    /// IPv4 addresses to ask about (at most 1,024).
    #[arg(value_name = "IP")]
    pub ips: Vec<Ipv4Addr>,
    /// Time between two requests for an IP.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_duration)]
    pub interval: Duration,
    /// How long to probe (default 60s; unlimited with --count alone).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Requests per IP (with --duration: whichever ends first).
    #[arg(short, long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub count: Option<u64>,
    /// Sender IP of the requests (default: the interface's primary IPv4; with
    /// none, 0.0.0.0, an RFC 5227 ARP probe, which owners answer too).
    #[arg(long, value_name = "IP")]
    pub source: Option<Ipv4Addr>,
    /// Each round, after the ARP requests, a TCP connect to PORT on every
    /// probed IP, or to IP:PORT (probing IP too); repeat for several IPs.
    /// Each connect is attributed to the MAC the host's neighbour table held.
    #[arg(long, value_name = "PORT|IP:PORT", value_parser = parse_connect)]
    pub connect: Vec<ConnectTarget>,
    /// How long a connect may take.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_duration)]
    pub connect_timeout: Duration,
    /// The host's neighbour entry around each connect: `keep` it, `flush` it
    /// before each (the kernel resolves afresh: the ARP race decides), or
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
    Addr(SocketAddrV4),
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
    let a: SocketAddrV4 = s
        .parse()
        .map_err(|_| format!("`{s}` is neither a port nor IPv4:PORT"))?;
    port_ok(a.port())?;
    Ok(ConnectTarget::Addr(a))
}

impl ProbeArgs {
    /// The IPs (the positional ones, then those of `--connect IP:PORT`;
    /// duplicates dropped) and their ports.
    fn targets(&self) -> Result<(Vec<Ipv4Addr>, Vec<Option<u16>>)> {
        let mut ips: Vec<Ipv4Addr> = Vec::new();
        for ip in &self.ips {
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
            if given.contains(a.ip()) {
                bail!("--connect {a}: {} has a port already (one per IP)", a.ip());
            }
            given.push(*a.ip());
            match ips.iter().position(|ip| ip == a.ip()) {
                Some(i) => ports[i] = Some(a.port()),
                None if ips.len() < MAX_IPS => {
                    ips.push(*a.ip());
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

    /// The checked plan, asking as `source`.
    pub fn plan(&self, source: Ipv4Addr) -> Result<Plan> {
        let (ips, ports) = self.targets()?;
        let interval = self.interval;
        if !(Duration::from_millis(10)..=Duration::from_secs(3600)).contains(&interval) {
            bail!("--interval must be between 10ms and 1h");
        }
        let per_second = ips.len() as u64 * 1000 / (interval.as_millis() as u64).max(1);
        if per_second > MAX_REQUESTS_PER_SECOND {
            bail!(
                "{} IPs every {interval:?} is {per_second} ARP requests per second (at most \
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

    fn plan(line: &str) -> Result<Plan> {
        args(line)?.plan(Ipv4Addr::new(198, 51, 100, 1))
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
        assert_eq!(p.ips, [Ipv4Addr::new(1, 2, 3, 5)]);
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
        ] {
            let err = plan(line).unwrap_err().to_string();
            assert!(err.contains(why), "{line}: {err}");
        }
        for line in [
            "1.2.3.4",
            "-i eth0 1.2.3.4 --connect 0",
            "-i eth0 1.2.3.4 --connect x:80",
            "-i eth0 ::1",
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
}
