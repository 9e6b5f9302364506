//! What the guard knew of recent moves, kept across a restart (pure): the
//! history one daemon leaves for the next (a rolling upgrade, a crash), its
//! format, its bounds, and how it is taken back.
//!
//! It holds, per LB IP this node lost, took over or counted misdirected
//! packets for: its state, source and since when (as `status` shows them),
//! when this node lost it, its last takeover by this node (when, the delay
//! to its first announcement, silent or not, or still waiting for one),
//! the packets counted and the census's latest claims of it (who announced
//! it since the move); and the misdirected clients as last read, with
//! their counts since the move and what was reported of them. So that
//! `clients`, the takeover records, Events and refreshes after a restart
//! are what they would have been without it.
//!
//! The format: one header line `arp-guard-history VERSION LENGTH FNV64\n`,
//! then LENGTH bytes of JSON ([`History`]) whose FNV-1a hash is FNV64 (hex);
//! zero bytes may follow (a store that pads). Another version, another
//! node's, a wrong length or hash, JSON that does not parse or breaks a
//! bound, more than [`MAX_BYTES`]: rejected whole, with the reason. Times
//! are wall-clock Unix nanoseconds (the daemon's CLOCK_MONOTONIC restarts
//! at a reboot): [`Clock`] converts, with the writer's own clock pair when
//! the reader runs in the same boot (exact across a wall-clock step), else
//! with the reader's. Entries older than [`WINDOW`], or in the future, are
//! dropped when read. Written: at most [`MAX_IPS`] IPs and [`MAX_CLIENTS`]
//! clients, the most recent first, the oldest dropped until the whole fits
//! in [`MAX_BYTES`].

use std::{collections::BTreeMap, fmt, net::IpAddr, time::Duration};

use guard_common::{Origin, Ownership};
use serde::{Deserialize, Serialize};

use super::{census::CensusEntry, clients::Kept, takeover::KeptTakeover};

/// The format version this daemon writes and reads.
pub const VERSION: u32 = 1;
const MAGIC: &str = "arp-guard-history";
/// The largest history written or read (header and padding aside).
pub const MAX_BYTES: usize = 1 << 20;
/// At most this many LB IPs and clients are kept.
pub const MAX_IPS: usize = 4096;
pub const MAX_CLIENTS: usize = 2048;
/// At most this many census claims per LB IP, the latest.
pub const MAX_CLAIMS: usize = 4;
/// A source longer than this is cut (it then matches nothing when read).
const MAX_SOURCE: usize = 256;
/// What is older than this when read is dropped: a move a day old is
/// history, and a restart takes seconds.
pub const WINDOW: Duration = Duration::from_secs(24 * 3600);
/// A history whose content did not change is written again after this
/// long: its time then says that the daemon that kept it was alive.
pub const REWRITE_AFTER: Duration = Duration::from_secs(60);
/// Written this much longer before the previous daemon's last heartbeat: a
/// daemon that keeps no history (an older arp-guard) ran since, and what
/// it saw is not in it.
const MAX_SILENCE: Duration = Duration::from_secs(75);
/// A time this far ahead of the reader's clock is not believed (ns).
const FUTURE_SLACK: u64 = 60_000_000_000;

fn secs_ns(s: u64) -> u64 {
    s.saturating_mul(1_000_000_000)
}
/// The header line is at most this long.
const MAX_HEADER: usize = 128;
/// The most a store reads: a history at its bound, its header, a page of
/// padding. Anything larger is rejected unread.
pub const MAX_STORED: usize = MAX_BYTES + MAX_HEADER + 4096;

/// CLOCK_MONOTONIC and the wall clock read at one instant, in one boot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Clock {
    /// The boot (`/proc/sys/kernel/random/boot_id`; empty: unknown).
    pub boot: String,
    pub mono_ns: u64,
    /// Unix nanoseconds.
    pub unix_ns: u64,
}

impl Clock {
    /// A monotonic time as Unix nanoseconds.
    pub fn unix_ns_of(&self, mono_ns: u64) -> u64 {
        let d = i128::from(mono_ns) - i128::from(self.mono_ns);
        clamp(i128::from(self.unix_ns) + d, 0)
    }

    /// Unix nanoseconds as a monotonic time; before the clock's start (an
    /// earlier boot) it is its earliest instant.
    pub fn mono_ns_of(&self, unix_ns: u64) -> u64 {
        let d = i128::from(unix_ns) - i128::from(self.unix_ns);
        clamp(i128::from(self.mono_ns) + d, 1)
    }
}

fn clamp(v: i128, min: u64) -> u64 {
    u64::try_from(v.max(i128::from(min))).unwrap_or(u64::MAX)
}

/// What a daemon knows, on its own monotonic clock: what it writes, and
/// what it takes back.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Known {
    pub ips: BTreeMap<IpAddr, IpKnown>,
    pub clients: Vec<Kept>,
}

/// What is known of one LB IP.
#[derive(Debug, Clone, PartialEq)]
pub struct IpKnown {
    /// Its state and source here, and since when (Unix seconds).
    pub state: Ownership,
    pub source: String,
    pub since_unix: u64,
    /// When this node lost it (CLOCK_MONOTONIC ns), while not owned here again.
    pub lost_ns: Option<u64>,
    /// Its last takeover by this node.
    pub takeover: Option<KeptTakeover>,
    /// Misdirected packets counted for it.
    pub packets: u64,
    /// The census's latest claims of it (the census's table starts empty
    /// after a restart: who announced it since the move is known from them).
    pub claims: Vec<CensusEntry>,
}

/// The history as it is stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct History {
    /// The node that wrote it: another node's is not taken.
    pub node: String,
    /// When it was written (Unix ns, as every time stored).
    pub saved_at: u64,
    /// The writer's clock pair (fixed for a daemon's life).
    pub clock: Clock,
    pub ips: Vec<IpRecord>,
    pub clients: Vec<ClientRecord>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IpRecord {
    pub ip: IpAddr,
    pub state: Ownership,
    pub source: String,
    pub since: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost_at: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub takeover: Option<TakeoverKept>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub packets: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub claims: Vec<ClaimRecord>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimRecord {
    pub mac: [u8; 6],
    pub first_at: u64,
    pub last_at: u64,
    pub count: u64,
    pub ifindex: u32,
    pub kinds: u8,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TakeoverKept {
    /// The record as `status` shows it.
    pub at_unix: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via: Option<Origin>,
    pub silent: bool,
    /// Still waiting for its first announcement: since when.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_at: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientRecord {
    pub ip: IpAddr,
    pub mac: [u8; 6],
    pub client_ip: IpAddr,
    pub first_at: u64,
    pub last_at: u64,
    pub packets: u64,
    pub baseline: u64,
    pub ifindex: u32,
    pub vlan: u16,
    pub run_at: u64,
    /// Bits: 1 failover time observed, 2 staleness reported, 4 announced.
    pub flags: u8,
}

/// Why a stored history is not taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejected {
    Empty,
    TooLarge(usize),
    NotHistory,
    Version(String),
    Corrupt(String),
    OtherNode(String),
    Stale { age_s: u64 },
    Future,
    Outdated { before_s: u64 },
}

impl fmt::Display for Rejected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rejected::Empty => write!(f, "empty"),
            Rejected::TooLarge(n) => write!(f, "{n} bytes, more than a history holds"),
            Rejected::NotHistory => write!(f, "not an arp-guard history (no header line)"),
            Rejected::Version(v) => {
                write!(
                    f,
                    "format version {v}; this arp-guard reads version {VERSION}"
                )
            }
            Rejected::Corrupt(why) => write!(f, "corrupt: {why}"),
            Rejected::OtherNode(n) => write!(f, "written on node {n}, not this one"),
            Rejected::Stale { age_s } => write!(
                f,
                "written {age_s} s ago, longer than the {} h it is kept",
                WINDOW.as_secs() / 3600
            ),
            Rejected::Future => write!(f, "written in the future (the clock went back?)"),
            Rejected::Outdated { before_s } => write!(
                f,
                "written {before_s} s before the previous daemon's last heartbeat: a daemon that \
                 keeps no history (an older arp-guard?) ran since"
            ),
        }
    }
}

/// The history to write for `known`, bounded: the most recent IPs and
/// clients first, at most [`MAX_IPS`] and [`MAX_CLIENTS`] of them.
pub fn history(known: &Known, node: &str, clock: &Clock, saved_at: u64) -> History {
    let mut ips: Vec<(u64, IpRecord)> = (known.ips.iter())
        .map(|(ip, k)| record_of(*ip, k, clock))
        .collect();
    ips.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.ip.cmp(&b.1.ip)));
    ips.truncate(MAX_IPS);
    let mut clients: Vec<&Kept> = known.clients.iter().collect();
    clients.sort_by_key(|k| (std::cmp::Reverse(k.entry.last_ns), k.entry.ip, k.entry.mac));
    clients.truncate(MAX_CLIENTS);
    History {
        node: node.to_owned(),
        saved_at,
        clock: clock.clone(),
        ips: ips.into_iter().map(|(_, r)| r).collect(),
        clients: clients.into_iter().map(|k| client_of(k, clock)).collect(),
    }
}

/// The bytes of `h`: its header line and its JSON, within [`MAX_BYTES`]
/// (the oldest clients, then the oldest IPs, dropped until it fits).
pub fn encode(h: &History) -> Vec<u8> {
    let mut h = std::borrow::Cow::Borrowed(h);
    loop {
        // Plain data with string keys: serialising cannot fail.
        let body = serde_json::to_vec(&*h).unwrap_or_default();
        if body.len() <= MAX_BYTES || (h.clients.is_empty() && h.ips.is_empty()) {
            let mut out = header(&body).into_bytes();
            out.extend_from_slice(&body);
            return out;
        }
        let h = h.to_mut();
        if h.clients.is_empty() {
            h.ips.truncate(h.ips.len() * 3 / 4);
        } else {
            h.clients.truncate(h.clients.len() * 3 / 4);
        }
    }
}

fn header(body: &[u8]) -> String {
    format!("{MAGIC} {VERSION} {} {:016x}\n", body.len(), fnv64(body))
}

/// FNV-1a, 64 bits: catches a torn or altered history (not an attacker,
/// whose history is only ever data, read within bounds).
fn fnv64(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325, |h, x| {
        (h ^ u64::from(*x)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The JSON of a stored history, checked: its header, length and hash.
pub fn parse(bytes: &[u8]) -> Result<History, Rejected> {
    if bytes.iter().all(|b| *b == 0) {
        return Err(Rejected::Empty);
    }
    if bytes.len() > MAX_STORED {
        return Err(Rejected::TooLarge(bytes.len()));
    }
    let nl = (bytes.iter().take(MAX_HEADER))
        .position(|b| *b == b'\n')
        .ok_or(Rejected::NotHistory)?;
    let line = std::str::from_utf8(&bytes[..nl]).map_err(|_| Rejected::NotHistory)?;
    let f: Vec<&str> = line.split(' ').collect();
    if f.first() != Some(&MAGIC) {
        return Err(Rejected::NotHistory);
    }
    let version = f.get(1).copied().unwrap_or_default();
    if version.parse::<u32>().ok() != Some(VERSION) {
        return Err(Rejected::Version(version.chars().take(16).collect()));
    }
    let bad = |why: &str| Rejected::Corrupt(why.to_owned());
    let (Some(len), Some(sum), 4) = (
        f.get(2).and_then(|l| l.parse::<usize>().ok()),
        f.get(3).and_then(|s| u64::from_str_radix(s, 16).ok()),
        f.len(),
    ) else {
        return Err(bad("a malformed header line"));
    };
    if len > MAX_BYTES {
        return Err(Rejected::TooLarge(len));
    }
    let rest = &bytes[nl + 1..];
    if rest.len() < len {
        return Err(Rejected::Corrupt(format!(
            "truncated: {} of {len} bytes",
            rest.len()
        )));
    }
    let (body, pad) = rest.split_at(len);
    if pad.iter().any(|b| *b != 0) || fnv64(body) != sum {
        return Err(bad("its content does not match its checksum"));
    }
    serde_json::from_slice(body).map_err(|e| Rejected::Corrupt(format!("{e}")))
}

/// What a stored history gives back, on the reader's clock (`now`), and
/// how many entries were dropped as too old or ahead of the clock.
/// `last_alive`: the previous daemon's last heartbeat (CLOCK_MONOTONIC ns,
/// this boot), when the pinned maps hold one.
pub fn decode(
    bytes: &[u8],
    node: &str,
    now: &Clock,
    last_alive: Option<u64>,
) -> Result<(Known, usize), Rejected> {
    let h = parse(bytes)?;
    if h.node != node {
        return Err(Rejected::OtherNode(h.node.chars().take(64).collect()));
    }
    let window = u64::try_from(WINDOW.as_nanos()).unwrap_or(u64::MAX);
    if h.saved_at > now.unix_ns.saturating_add(FUTURE_SLACK) {
        return Err(Rejected::Future);
    }
    if h.saved_at.saturating_add(window) < now.unix_ns {
        let age_s = (now.unix_ns - h.saved_at) / 1_000_000_000;
        return Err(Rejected::Stale { age_s });
    }
    let claims = h.ips.iter().map(|r| r.claims.len()).max().unwrap_or(0);
    if h.ips.len() > MAX_IPS || h.clients.len() > MAX_CLIENTS || claims > MAX_CLAIMS {
        return Err(Rejected::Corrupt(
            "more entries than a history holds".into(),
        ));
    }
    // The writer's clock pair converts exactly within its boot.
    let clock = if !h.clock.boot.is_empty() && h.clock.boot == now.boot {
        &h.clock
    } else {
        now
    };
    let saved_ns = clock.mono_ns_of(h.saved_at);
    let silence = u64::try_from(MAX_SILENCE.as_nanos()).unwrap_or(u64::MAX);
    if let Some(alive) = last_alive.filter(|a| a.saturating_sub(saved_ns) > silence) {
        let before_s = (alive - saved_ns) / 1_000_000_000;
        return Err(Rejected::Outdated { before_s });
    }
    let fresh = |t: u64| {
        t.saturating_add(window) >= now.unix_ns && t <= now.unix_ns.saturating_add(FUTURE_SLACK)
    };
    let mut dropped = 0;
    let mut known = Known::default();
    for r in h.ips {
        if known.ips.contains_key(&r.ip) {
            dropped += 1;
            continue;
        }
        let (k, gone) = ip_known(r.clone(), clock, &fresh);
        dropped += gone;
        if k.lost_ns.is_some() || k.takeover.is_some() || k.packets > 0 {
            known.ips.insert(r.ip, k);
        }
    }
    for c in h.clients {
        if fresh(c.last_at) {
            known.clients.push(kept_of(&c, clock));
        } else {
            dropped += 1;
        }
    }
    Ok((known, dropped))
}

mod convert;
use convert::{client_of, ip_known, kept_of, record_of};

#[cfg(test)]
mod tests;
