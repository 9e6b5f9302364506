//! What `arp-guard probe` prints: one serde document (`-o json`, a stable
//! schema) and its table rendering.

use std::{
    fmt::Write as _,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    time::Duration,
};

use serde::Serialize;

use crate::model::fmt_mac;

use super::{
    prober::{ConnectStats, MacSeen, ProbeVerdict, Target, MAX_MACS},
    run::Outcome,
    Plan,
};

/// The probe's result, as `-o json` prints it.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub interface: String,
    pub mac: String,
    /// The ARP requests' sender IP (0.0.0.0: RFC 5227 ARP probes); null
    /// without IPv4 targets.
    pub source: Option<Ipv4Addr>,
    /// The Neighbor Solicitations' source; null without IPv6 targets.
    pub source_ipv6: Option<Ipv6Addr>,
    pub interval_ms: u64,
    pub rounds: u64,
    pub elapsed_ms: u64,
    /// Stopped by Ctrl-C (or SIGTERM): the summary so far.
    pub interrupted: bool,
    pub connect: Option<ConnectInfo>,
    pub ips: Vec<IpReport>,
    /// ARP or NDP frames that did not parse (or that their receiver would
    /// discard), and claims about other IPs.
    pub malformed_frames: u64,
    pub unrelated_frames: u64,
    pub io_errors: u64,
    pub last_io_error: Option<String>,
    /// Every IP had exactly one responder and every connect succeeded.
    pub ok: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct ConnectInfo {
    pub timeout_ms: u64,
    /// keep, flush or pin.
    pub neigh: &'static str,
}

#[derive(Debug, Clone, Serialize)]
pub struct IpReport {
    pub ip: IpAddr,
    /// `ipv4` (asked with ARP) or `ipv6` (asked with Neighbor Discovery).
    pub family: &'static str,
    /// one_responder, no_responder, conflict or moved.
    pub verdict: &'static str,
    /// MACs that claimed the IP (replies, gratuitous ARP, announce leaks;
    /// for IPv6 solicited NAs, unsolicited NAs, NS from the IP with a source
    /// link-layer option).
    pub responders: usize,
    pub requests: u64,
    pub send_errors: u64,
    /// Rounds with at least one reply.
    pub answered: u64,
    /// Rounds in which two or more MACs claimed the IP.
    pub rounds_with_several: u64,
    /// ARP replies; for IPv6 solicited Neighbor Advertisements.
    pub replies: u64,
    /// Gratuitous ARP; for IPv6 unsolicited Neighbor Advertisements.
    pub gratuitous: u64,
    /// Announce leaks (requests with the IP as sender); for IPv6 Neighbor
    /// Solicitations from the IP with a source link-layer option.
    pub announce_leaks: u64,
    /// In first-seen order, at most 64; a MAC known only from the neighbour
    /// table (a stale entry) has no frames and no times.
    pub macs: Vec<MacReport>,
    /// Frames from MACs past the first 64.
    pub unlisted_frames: u64,
    pub port: Option<u16>,
    /// Connects made while the neighbour table had no MAC for the IP.
    pub unresolved: Option<ConnectReport>,
    pub ok: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct MacReport {
    pub mac: String,
    pub replies: u64,
    pub gratuitous: u64,
    pub announce_leaks: u64,
    /// Rounds in which this MAC replied.
    pub answered: u64,
    /// First and last frame, in ms since the start.
    pub first_ms: Option<u64>,
    pub last_ms: Option<u64>,
    pub connect: Option<ConnectReport>,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct ConnectReport {
    pub ok: u64,
    pub failed: u64,
    pub timed_out: u64,
    pub refused: u64,
    pub unreachable: u64,
    pub other: u64,
}

impl From<&ConnectStats> for ConnectReport {
    fn from(s: &ConnectStats) -> Self {
        ConnectReport {
            ok: s.ok,
            failed: s.failed(),
            timed_out: s.timed_out,
            refused: s.refused,
            unreachable: s.unreachable,
            other: s.other,
        }
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn verdict_key(v: ProbeVerdict) -> &'static str {
    match v {
        ProbeVerdict::NoResponder => "no_responder",
        ProbeVerdict::OneResponder => "one_responder",
        ProbeVerdict::Conflict => "conflict",
        ProbeVerdict::Moved => "moved",
    }
}

fn mac_report(m: &MacSeen, connecting: bool) -> MacReport {
    MacReport {
        mac: fmt_mac(&m.mac),
        replies: m.replies,
        gratuitous: m.gratuitous,
        announce_leaks: m.leaks,
        answered: m.answered,
        first_ms: m.first.map(ms),
        last_ms: m.last.map(ms),
        connect: connecting.then(|| (&m.connect).into()),
    }
}

fn ip_report(t: &Target, port: Option<u16>) -> IpReport {
    IpReport {
        ip: t.ip,
        family: if t.ip.is_ipv4() { "ipv4" } else { "ipv6" },
        verdict: verdict_key(t.verdict()),
        responders: t.responders().count(),
        requests: t.requests,
        send_errors: t.send_errors,
        answered: t.answered,
        rounds_with_several: t.several,
        replies: t.replies,
        gratuitous: t.gratuitous,
        announce_leaks: t.leaks,
        macs: t
            .macs
            .iter()
            .map(|m| mac_report(m, port.is_some()))
            .collect(),
        unlisted_frames: t.unlisted_frames,
        port,
        unresolved: port.map(|_| (&t.unresolved).into()),
        ok: t.ok(),
    }
}

impl Summary {
    pub fn new(out: &Outcome, interface: &str, mac: [u8; 6], plan: &Plan) -> Self {
        let port = |i: usize| {
            plan.connect
                .as_ref()
                .and_then(|c| c.ports.get(i).copied().flatten())
        };
        let ips: Vec<IpReport> = out
            .prober
            .targets()
            .iter()
            .enumerate()
            .map(|(i, t)| ip_report(t, port(i)))
            .collect();
        let has = |v6: bool| plan.ips.iter().any(|ip| ip.is_ipv6() == v6);
        Summary {
            interface: interface.to_owned(),
            mac: fmt_mac(&mac),
            source: has(false).then_some(plan.source),
            source_ipv6: has(true).then_some(plan.source6),
            interval_ms: ms(plan.interval),
            rounds: out.prober.rounds(),
            elapsed_ms: ms(out.elapsed),
            interrupted: out.interrupted,
            connect: plan.connect.as_ref().map(|c| ConnectInfo {
                timeout_ms: ms(c.timeout),
                neigh: c.neigh.as_str(),
            }),
            ok: ips.iter().all(|r| r.ok),
            ips,
            malformed_frames: out.prober.malformed,
            unrelated_frames: out.prober.unrelated,
            io_errors: out.io_errors,
            last_io_error: out.last_io_error.clone(),
        }
    }

    /// One line naming every problem, for the exit status's message; `None`
    /// when all is well.
    pub fn problems(&self) -> Option<String> {
        let mut found: Vec<String> = Vec::new();
        for r in &self.ips {
            if r.verdict != "one_responder" {
                found.push(format!("{}: {}", r.ip, verdict_text(r)));
            }
            let failed = connect_failures(r);
            if failed > 0 {
                let tried = failed + connects_ok(r);
                found.push(format!("{}: {failed} of {tried} connects failed", r.ip));
            }
        }
        if found.is_empty() {
            return None;
        }
        let more = found.len().saturating_sub(5);
        found.truncate(5);
        let mut line = found.join("; ");
        if more > 0 {
            let _ = write!(line, "; and {more} more");
        }
        Some(line)
    }

    /// The human table.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let secs = self.elapsed_ms as f64 / 1000.0;
        let sources: Vec<String> = [
            self.source.map(IpAddr::from),
            self.source_ipv6.map(IpAddr::from),
        ]
        .iter()
        .flatten()
        .map(IpAddr::to_string)
        .collect();
        let _ = writeln!(
            s,
            "{} ({}) asking as {}: {} round(s) every {:?} in {secs:.1} s{}",
            self.interface,
            self.mac,
            sources.join(" and "),
            self.rounds,
            Duration::from_millis(self.interval_ms),
            if self.interrupted {
                ", interrupted: the summary so far"
            } else {
                ""
            }
        );
        if let Some(c) = &self.connect {
            let how = match c.neigh {
                "flush" => "neighbour entry flushed before each",
                "pin" => "neighbour entry pinned to each responder in turn",
                _ => "neighbour entry kept",
            };
            let timeout = Duration::from_millis(c.timeout_ms);
            let _ = writeln!(s, "TCP connects: timeout {timeout:?}, {how}");
        }
        for r in &self.ips {
            s.push('\n');
            ip_table(&mut s, r);
        }
        s.push('\n');
        if self.malformed_frames + self.unrelated_frames + self.io_errors > 0 {
            let _ = writeln!(
                s,
                "also seen: {} malformed ARP/NDP frame(s), {} about other IPs, {} I/O error(s){}",
                self.malformed_frames,
                self.unrelated_frames,
                self.io_errors,
                self.last_io_error
                    .as_ref()
                    .map(|e| format!(" (last: {e})"))
                    .unwrap_or_default()
            );
        }
        match self.problems() {
            None => s.push_str("verdict: OK, one responder per IP\n"),
            Some(p) => {
                let _ = writeln!(s, "verdict: PROBLEM: {p}");
            }
        }
        s
    }
}

fn connect_failures(r: &IpReport) -> u64 {
    let per_mac: u64 = r
        .macs
        .iter()
        .filter_map(|m| m.connect)
        .map(|c| c.failed)
        .sum();
    per_mac + r.unresolved.map_or(0, |c| c.failed)
}

fn connects_ok(r: &IpReport) -> u64 {
    let per_mac: u64 = r.macs.iter().filter_map(|m| m.connect).map(|c| c.ok).sum();
    per_mac + r.unresolved.map_or(0, |c| c.ok)
}

/// "one responder", "2 responders: conflict (...)", ...
pub fn verdict_text(r: &IpReport) -> String {
    let n = if r.unlisted_frames > 0 {
        format!("more than {MAX_MACS}")
    } else {
        r.responders.to_string()
    };
    match r.verdict {
        "no_responder" => "no responder".to_owned(),
        "one_responder" => "one responder".to_owned(),
        "moved" => format!("{n} responders: moved (one after another, never in the same round)"),
        _ => format!(
            "{n} responders: conflict (several in {} of {} rounds)",
            r.rounds_with_several, r.requests
        ),
    }
}

fn connect_cell(c: &ConnectReport) -> String {
    let mut cell = format!("{} ok, {} failed", c.ok, c.failed);
    let why: Vec<String> = [
        (c.timed_out, "timed out"),
        (c.refused, "refused"),
        (c.unreachable, "unreachable"),
        (c.other, "other"),
    ]
    .iter()
    .filter(|(n, _)| *n > 0)
    .map(|(n, what)| format!("{n} {what}"))
    .collect();
    if !why.is_empty() {
        let _ = write!(cell, " ({})", why.join(", "));
    }
    cell
}

fn at(ms: Option<u64>) -> String {
    ms.map_or_else(|| "-".to_owned(), |m| format!("+{:.3}s", m as f64 / 1000.0))
}

fn ip_table(s: &mut String, r: &IpReport) {
    let _ = writeln!(s, "{}  {}", r.ip, verdict_text(r));
    let _ = write!(
        s,
        "  requests {}  answered {}  replies {}",
        r.requests, r.answered, r.replies
    );
    if r.gratuitous + r.announce_leaks > 0 {
        let (gratuitous, leaks) = if r.ip.is_ipv4() {
            ("gratuitous", "announce leaks")
        } else {
            ("unsolicited NAs", "NS leaks")
        };
        let _ = write!(
            s,
            "  {gratuitous} {}  {leaks} {}",
            r.gratuitous, r.announce_leaks
        );
    }
    if r.send_errors > 0 {
        let _ = write!(s, "  send errors {}", r.send_errors);
    }
    if let Some(p) = r.port {
        let _ = write!(s, "  connect port {p}");
    }
    s.push('\n');
    if r.macs.is_empty() && r.unresolved.is_none_or(|c| c.ok + c.failed == 0) {
        return;
    }
    // IPv6: unsolicited NAs count where gratuitous ARP does.
    let garp = if r.ip.is_ipv4() { "garp" } else { "unsol" };
    let w = garp.len();
    let _ = write!(
        s,
        "  {:<17}  {:>7}  {:>w$}  {:>5}  {:>9}  {:>8}  {:>8}",
        "MAC", "replies", garp, "leaks", "answered", "first", "last"
    );
    s.push_str(if r.port.is_some() {
        "  connect\n"
    } else {
        "\n"
    });
    for m in &r.macs {
        let _ = write!(
            s,
            "  {:<17}  {:>7}  {:>w$}  {:>5}  {:>9}  {:>8}  {:>8}",
            m.mac,
            m.replies,
            m.gratuitous,
            m.announce_leaks,
            format!("{}/{}", m.answered, r.requests),
            at(m.first_ms),
            at(m.last_ms)
        );
        if let Some(c) = &m.connect {
            let _ = write!(s, "  {}", connect_cell(c));
        }
        if m.first_ms.is_none() {
            s.push_str("  (neighbour table only: never answered)");
        }
        s.push('\n');
    }
    if let Some(c) = r.unresolved.filter(|c| c.ok + c.failed > 0) {
        let pad = 49 + w;
        let _ = writeln!(s, "  {:<17}{:pad$}  {}", "(no MAC)", "", connect_cell(&c));
    }
    if r.unlisted_frames > 0 {
        let _ = writeln!(
            s,
            "  and {} frame(s) from further MACs (only the first {MAX_MACS} are listed)",
            r.unlisted_frames
        );
    }
}

#[cfg(test)]
mod tests {
    use guard_common::{
        build::{write_arp, ArpPacket, Ethernet, FRAME_BUF},
        ndp_build::{write_nd, NdSpec, ND_FRAME_BUF},
    };

    use super::*;
    use crate::probe::{prober::Prober, ConnectError, ConnectPlan, NeighMode};

    const ME: [u8; 6] = [2, 0, 0, 0, 0, 1];
    const SRC: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);
    const LB: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 100);
    const NONE: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 200);
    const SRC6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);
    const LB6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 0x100);
    const A: [u8; 6] = [2, 0, 0, 0, 0, 0xa];
    const B: [u8; 6] = [2, 0, 0, 0, 0, 0xb];

    fn reply(mac: [u8; 6]) -> Vec<u8> {
        let mut buf = [0; FRAME_BUF];
        let eth = Ethernet {
            dst: ME,
            src: mac,
            tags: &[],
        };
        let n = write_arp(
            &mut buf,
            &eth,
            &ArpPacket::reply(mac, LB.into(), ME, SRC.into()),
        )
        .unwrap();
        buf[..n].to_vec()
    }

    /// Two rounds: A and B answer for LB, nobody for NONE; connects to LB
    /// through A work, through B time out.
    fn conflict() -> (Outcome, Plan) {
        let mut p = Prober::new(&[LB.into(), NONE.into()], ME, SRC, SRC6).unwrap();
        for r in 0..2u64 {
            p.next_round();
            p.sent(0, true);
            p.sent(1, true);
            p.on_frame(Duration::from_millis(r * 1000 + 1), &reply(A));
            p.on_frame(Duration::from_millis(r * 1000 + 2), &reply(B));
        }
        p.on_connect(0, Some(A), Ok(()));
        p.on_connect(0, Some(B), Err(ConnectError::TimedOut));
        let plan = Plan {
            ips: vec![LB.into(), NONE.into()],
            source: SRC,
            source6: SRC6,
            interval: Duration::from_secs(1),
            rounds: 2,
            duration: None,
            connect: Some(ConnectPlan {
                ports: vec![Some(443), None],
                timeout: Duration::from_secs(1),
                neigh: NeighMode::Flush,
            }),
        };
        let out = Outcome {
            prober: p,
            elapsed: Duration::from_secs(2),
            interrupted: false,
            io_errors: 0,
            last_io_error: None,
        };
        (out, plan)
    }

    #[test]
    fn the_json_schema_is_stable() {
        let (out, plan) = conflict();
        let v = serde_json::to_value(Summary::new(&out, "eth0", ME, &plan)).unwrap();
        let keys = |v: &serde_json::Value| -> Vec<String> {
            let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
            k.sort();
            k
        };
        assert_eq!(
            keys(&v),
            [
                "connect",
                "elapsed_ms",
                "interface",
                "interrupted",
                "interval_ms",
                "io_errors",
                "ips",
                "last_io_error",
                "mac",
                "malformed_frames",
                "ok",
                "rounds",
                "source",
                "source_ipv6",
                "unrelated_frames"
            ]
        );
        let ip = &v["ips"][0];
        assert_eq!(
            keys(ip),
            [
                "announce_leaks",
                "answered",
                "family",
                "gratuitous",
                "ip",
                "macs",
                "ok",
                "port",
                "replies",
                "requests",
                "responders",
                "rounds_with_several",
                "send_errors",
                "unlisted_frames",
                "unresolved",
                "verdict"
            ]
        );
        assert_eq!(
            keys(&ip["macs"][0]),
            [
                "announce_leaks",
                "answered",
                "connect",
                "first_ms",
                "gratuitous",
                "last_ms",
                "mac",
                "replies"
            ]
        );
        assert_eq!(
            keys(&ip["macs"][0]["connect"]),
            [
                "failed",
                "ok",
                "other",
                "refused",
                "timed_out",
                "unreachable"
            ]
        );
        assert_eq!(
            (ip["verdict"].as_str(), ip["responders"].as_u64()),
            (Some("conflict"), Some(2))
        );
        assert_eq!(
            (ip["ip"].as_str(), ip["family"].as_str()),
            (Some("198.51.100.100"), Some("ipv4"))
        );
        assert_eq!(
            (v["source"].as_str(), v["source_ipv6"].as_str()),
            (Some("198.51.100.1"), None),
            "no IPv6 target: no NS source"
        );
        assert_eq!(ip["macs"][1]["mac"], "02:00:00:00:00:0b");
        assert_eq!(
            (
                ip["macs"][1]["first_ms"].as_u64(),
                ip["macs"][1]["last_ms"].as_u64()
            ),
            (Some(2), Some(1002))
        );
        assert_eq!(ip["macs"][1]["connect"]["timed_out"], 1);
        assert_eq!(v["ips"][1]["verdict"], "no_responder");
        assert_eq!(v["ips"][1]["port"], serde_json::Value::Null);
        assert_eq!(
            (v["ok"].as_bool(), v["connect"]["neigh"].as_str()),
            (Some(false), Some("flush"))
        );
    }

    #[test]
    fn the_table_names_every_problem() {
        let (out, plan) = conflict();
        let s = Summary::new(&out, "eth0", ME, &plan);
        let table = s.table();
        for want in [
            "eth0 (02:00:00:00:00:01) asking as 198.51.100.1: 2 round(s) every 1s in 2.0 s",
            "neighbour entry flushed before each",
            "198.51.100.100  2 responders: conflict (several in 2 of 2 rounds)",
            "requests 2  answered 2  replies 4  connect port 443",
            "02:00:00:00:00:0a        2     0      0        2/2   +0.001s   +1.001s  1 ok, 0 failed",
            "02:00:00:00:00:0b        2     0      0        2/2   +0.002s   +1.002s  0 ok, 1 failed (1 timed out)",
            "198.51.100.200  no responder",
            "verdict: PROBLEM: 198.51.100.100: 2 responders: conflict (several in 2 of 2 rounds); \
             198.51.100.100: 1 of 2 connects failed; 198.51.100.200: no responder",
        ] {
            assert!(table.contains(want), "no {want:?} in\n{table}");
        }
        assert!(!table.contains("also seen"), "{table}");
    }

    #[test]
    fn all_well_is_ok() {
        let mut p = Prober::new(&[LB.into()], ME, SRC, SRC6).unwrap();
        p.next_round();
        p.sent(0, true);
        p.on_frame(Duration::from_millis(3), &reply(A));
        let plan = Plan {
            ips: vec![LB.into()],
            source: SRC,
            source6: SRC6,
            interval: Duration::from_secs(1),
            rounds: 1,
            duration: None,
            connect: None,
        };
        let out = Outcome {
            prober: p,
            elapsed: Duration::from_secs(1),
            interrupted: true,
            io_errors: 1,
            last_io_error: Some("receiving: Network is down".into()),
        };
        let s = Summary::new(&out, "eth0", ME, &plan);
        assert!(s.ok && s.problems().is_none());
        let table = s.table();
        assert!(table.contains("interrupted: the summary so far"), "{table}");
        assert!(table.contains("198.51.100.100  one responder"), "{table}");
        assert!(
            table.contains("1 I/O error(s) (last: receiving: Network is down)"),
            "{table}"
        );
        assert!(
            table.ends_with("verdict: OK, one responder per IP\n"),
            "{table}"
        );
    }

    #[test]
    fn an_ipv6_target_reads_as_ipv6() {
        let mut p = Prober::new(&[LB6.into()], ME, SRC, SRC6).unwrap();
        p.next_round();
        p.sent(0, true);
        let mut buf = [0; ND_FRAME_BUF];
        let n = write_nd(
            &mut buf,
            &NdSpec::advert(A, LB6.octets(), ME, SRC6.octets(), 0x60),
        );
        p.on_frame(Duration::from_millis(3), &buf[..n]);
        let n = write_nd(&mut buf, &NdSpec::unsolicited(B, LB6.octets()));
        p.on_frame(Duration::from_millis(4), &buf[..n]);
        let plan = Plan {
            ips: vec![LB6.into()],
            source: SRC,
            source6: SRC6,
            interval: Duration::from_secs(1),
            rounds: 1,
            duration: None,
            connect: None,
        };
        let out = Outcome {
            prober: p,
            elapsed: Duration::from_secs(1),
            interrupted: false,
            io_errors: 0,
            last_io_error: None,
        };
        let s = Summary::new(&out, "eth0", ME, &plan);
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(
            (v["source"].clone(), v["source_ipv6"].as_str()),
            (serde_json::Value::Null, Some("fe80::1"))
        );
        let ip = &v["ips"][0];
        assert_eq!(
            (ip["ip"].as_str(), ip["family"].as_str()),
            (Some("fd00::100"), Some("ipv6"))
        );
        assert_eq!(
            (ip["replies"].as_u64(), ip["gratuitous"].as_u64()),
            (Some(1), Some(1))
        );
        let table = s.table();
        for want in [
            "eth0 (02:00:00:00:00:01) asking as fe80::1: 1 round(s)",
            "fd00::100  2 responders: conflict (several in 1 of 1 rounds)",
            "requests 1  answered 1  replies 1  unsolicited NAs 1  NS leaks 0",
            "MAC                replies  unsol  leaks   answered",
            "02:00:00:00:00:0b        0      1      0        0/1   +0.004s   +0.004s",
        ] {
            assert!(table.contains(want), "no {want:?} in\n{table}");
        }
    }
}
