//! The responder census kept current for the API, the metrics and the log:
//! every period the kernel's table is read (off the main loop: a full table
//! is 16,384 lookups), judged against this node's ownership (pure:
//! `model::census`), and published. A conflict is logged once when it
//! begins and once when it ends, and goes to `/events` subscribers.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    time::Duration,
};

use guard_common::{Ownership, MAX_RESPONDERS};
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

use crate::{
    datapath::{census::CensusReader, sys::monotonic_ns},
    model::census::{assess, claims_in_words, conflicts, Census, Context, Reason, Who},
};

/// The census as the API serves it (`/responders`), with the claims as
/// read beside it (shared, not copied): what healing stale clients reads the
/// owner's MAC from, to the nanosecond.
pub type CensusDoc =
    guard_wire::census::CensusDoc<std::sync::Arc<Vec<crate::model::census::CensusEntry>>>;

/// One conflict, as an `/events` line and in the status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConflictEvent {
    pub time: String,
    /// `responder_conflict` when it begins, `responder_conflict_ended` when
    /// it is no longer seen (quiet for a window: not proof that it is fixed).
    pub event: String,
    pub lb_ip: IpAddr,
    pub reason: Reason,
    /// The MACs that claimed it within the window.
    pub macs: Vec<String>,
    /// The claimants in words, by node (presence): "node-b (eth0, MAC)
    /// claims IP owned by node-a", or a MAC that is no guarded node's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub claims: Vec<String>,
}

/// What the task needs from the daemon: which IPs this node owns and since
/// when (Unix seconds), read from the state the main loop publishes.
pub type OwnedSince = Box<dyn Fn() -> BTreeMap<IpAddr, u64> + Send + Sync>;
/// Who the claimants of these LB IPs are (presence) and their owners.
pub type WhoIs = Box<dyn Fn(&BTreeSet<IpAddr>) -> Who + Send + Sync>;

pub struct CensusTask {
    pub reader: CensusReader,
    pub window: Duration,
    pub period: Duration,
    pub owned: OwnedSince,
    pub who: WhoIs,
    pub publish: Box<dyn Fn(CensusDoc) + Send + Sync>,
    pub events: broadcast::Sender<String>,
    /// `--split-brain-after`: another MAC claiming an IP this node owns is
    /// reported once it has lasted this long (at least [`CONFIRM_AFTER`]):
    /// MetalLB's new owner announces seconds before its status moves the IP
    /// away from this node, and that late feed is a takeover, not a rogue.
    pub claimed_elsewhere_after: Duration,
}

/// A conflict is reported (log, event, status, metrics) once it has been
/// seen this long without a break: the ownership feed lags an announcer's
/// first gratuitous ARP by up to a second or two at a failover, and one
/// read must not call the new owner a rogue.
pub const CONFIRM_AFTER: Duration = Duration::from_secs(3);
/// Claims in the first moments after this node became an IP's owner are
/// the previous owner's last words, not a rogue.
const OWNER_GRACE: Duration = Duration::from_secs(2);
/// At most this many conflict lines per read; the rest are summed up.
const LOG_PER_READ: usize = 20;

/// What the loop keeps from one read to the next.
#[derive(Default)]
struct Memory {
    last: CensusDoc,
    claims: std::sync::Arc<Vec<crate::model::census::CensusEntry>>,
    /// The claim totals at the last walk of the table.
    walked_at: Option<Vec<u64>>,
    /// Conflicts seen, since when (unbroken), and those reported.
    seen: BTreeMap<IpAddr, (Reason, std::time::Instant)>,
    reported: BTreeMap<IpAddr, Reason>,
    read_failing: bool,
}

/// Start the census on a thread of its own: every read is blocking map
/// syscalls (a full table is 16,384 lookups), and one long-lived thread
/// keeps what aya caches per thread, so that the census opens no file
/// after its first read (a daemon out of descriptors sees no flicker).
pub fn spawn(task: CensusTask) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("census".into())
        .spawn(move || run(task))
        .map(drop)
}

/// Read, judge and publish until the process ends.
fn run(task: CensusTask) {
    let CensusTask {
        reader,
        window,
        period,
        owned,
        who,
        publish,
        events,
        claimed_elsewhere_after,
    } = task;
    let mut m = Memory::default();
    loop {
        std::thread::sleep(period);
        // The table is walked only when a claim arrived since the last walk
        // (the totals say so); otherwise the claims read then are judged
        // again (time alone moves claims out of the window).
        let read = reader.stats().and_then(|stats| {
            let claims = if m.walked_at == Some(claim_totals(&stats)) {
                None
            } else {
                Some(reader.claims()?)
            };
            Ok((claims, stats))
        });
        let (claims, stats) = match read {
            Ok(v) => {
                m.read_failing = false;
                v
            }
            Err(e) => {
                if !m.read_failing {
                    tracing::warn!(error = %format!("{e:#}"), "cannot read the responder census; keeping the last one");
                }
                m.read_failing = true;
                m.last.error = Some(format!("{e:#}"));
                publish(m.last.clone());
                continue;
            }
        };
        if let Some(c) = claims {
            m.claims = std::sync::Arc::new(c);
            m.walked_at = Some(claim_totals(&stats));
        }
        let mut census = assess(&m.claims, &context(window, &owned, &who, &m.claims));
        let confirmed = confirm(&mut m.seen, &mut census, claimed_elsewhere_after);
        report_changes(&m.reported, &confirmed, &census, &events);
        m.reported = confirmed;
        m.last = CensusDoc {
            window_seconds: window.as_secs(),
            entries: m.claims.len(),
            capacity: MAX_RESPONDERS,
            totals: stats.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
            error: None,
            ips: census,
            claims: m.claims.clone(),
        };
        publish(m.last.clone());
    }
}

/// The totals that move when the table changes: claims recorded and
/// refused (not every ARP frame parsed).
fn claim_totals(stats: &[(&'static str, u64)]) -> Vec<u64> {
    stats
        .iter()
        // Frames parsed are not claims: only claims say the table moved.
        .filter(|(k, _)| {
            *k != guard_common::CensusStat::Arp.as_str()
                && *k != guard_common::CensusStat::Ndp.as_str()
        })
        .map(|(_, v)| *v)
        .collect()
}

/// What the claims are judged against, now.
fn context(
    window: Duration,
    owned: &OwnedSince,
    who: &WhoIs,
    claims: &[crate::model::census::CensusEntry],
) -> Context {
    let now_ns = monotonic_ns();
    let now_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let grace = OWNER_GRACE.as_nanos() as u64;
    let owned_since: BTreeMap<IpAddr, u64> = owned()
        .into_iter()
        .map(|(ip, since)| {
            // Unix seconds to the claims' monotonic clock, then the grace.
            let ago = now_unix.saturating_sub(since).saturating_mul(1_000_000_000);
            (ip, now_ns.saturating_sub(ago).saturating_add(grace))
        })
        .collect();
    // This node's MACs matter only for claims of IPs it owns.
    let owned_claimed = claims.iter().any(|c| owned_since.contains_key(&c.ip));
    Context {
        now_ns,
        window,
        owned_since,
        local_macs: if owned_claimed {
            local_macs()
        } else {
            BTreeSet::new()
        },
        ifnames: claims
            .iter()
            .map(|c| c.ifindex)
            .collect::<BTreeSet<u32>>()
            .into_iter()
            .map(|i| (i, super::interface_name(i)))
            .collect(),
        who: who(&claims.iter().map(|c| c.ip).collect()),
    }
}

/// Keep in `census` only the conflicts seen for [`CONFIRM_AFTER`] without a
/// break (a claim of an IP owned here: `claimed_elsewhere_after`); returns
/// them.
fn confirm(
    seen: &mut BTreeMap<IpAddr, (Reason, std::time::Instant)>,
    census: &mut Census,
    claimed_elsewhere_after: Duration,
) -> BTreeMap<IpAddr, Reason> {
    let now = std::time::Instant::now();
    let current = conflicts(census);
    seen.retain(|ip, (r, _)| current.get(ip) == Some(r));
    for (ip, r) in &current {
        seen.entry(*ip).or_insert((*r, now));
    }
    let mut confirmed = BTreeMap::new();
    for (ip, c) in census.iter_mut() {
        match seen.get(ip) {
            Some((r, since))
                if now.duration_since(*since)
                    >= match r {
                        Reason::Contested => CONFIRM_AFTER,
                        Reason::ClaimedElsewhere => claimed_elsewhere_after.max(CONFIRM_AFTER),
                    } =>
            {
                confirmed.insert(*ip, *r);
            }
            _ => c.conflict = None,
        }
    }
    confirmed
}

/// A log line and an event for each conflict that began or ended.
fn report_changes(
    before: &BTreeMap<IpAddr, Reason>,
    now: &BTreeMap<IpAddr, Reason>,
    census: &Census,
    events: &broadcast::Sender<String>,
) {
    let macs = |ip: &IpAddr| -> Vec<String> {
        census.get(ip).map_or_else(Vec::new, |c| {
            c.responders
                .iter()
                .filter(|r| r.active)
                .map(|r| r.mac.clone())
                .collect()
        })
    };
    let words = |ip: &IpAddr| -> Vec<String> {
        census
            .get(ip)
            .map_or_else(Vec::new, |c| claims_in_words(*ip, c))
    };
    let send = |event: &str, ip: IpAddr, reason: Reason, macs: Vec<String>| {
        let e = ConflictEvent {
            time: crate::telemetry::events::unix_time_millis(),
            event: event.into(),
            lb_ip: ip,
            reason,
            macs,
            claims: words(&ip),
        };
        if let Ok(line) = serde_json::to_string(&e) {
            // No subscriber is fine.
            let _ = events.send(line);
        }
    };
    let mut lines = 0usize;
    let mut held = 0usize;
    for (ip, reason) in now {
        if before.get(ip) == Some(reason) {
            continue;
        }
        let m = macs(ip);
        send("responder_conflict", *ip, *reason, m.clone());
        lines += 1;
        if lines > LOG_PER_READ {
            held += 1;
            continue;
        }
        tracing::warn!(
            target: "arp_guard::census",
            lb_ip = %ip, reason = reason.as_str(), macs = ?m, claims = ?words(ip),
            "responder conflict: {}",
            match reason {
                Reason::Contested => "more than one MAC claimed this LB IP within the census window, not one after the other (split brain, stale speaker, or nodes answering that should not)",
                Reason::ClaimedElsewhere => "this node owns the LB IP and another MAC claimed it since (a rogue host or a speaker that did not step down)",
            }
        );
    }
    for (ip, reason) in before {
        if !now.contains_key(ip) {
            send("responder_conflict_ended", *ip, *reason, macs(ip));
            lines += 1;
            if lines > LOG_PER_READ {
                held += 1;
                continue;
            }
            tracing::info!(target: "arp_guard::census", lb_ip = %ip, reason = reason.as_str(), "responder conflict no longer seen");
        }
    }
    if held > 0 {
        tracing::warn!(target: "arp_guard::census", more = held, "more responder conflicts began or ended in this read (see arp-guard responders)");
    }
}

/// This node's own MACs (every interface in its network namespace).
fn local_macs() -> BTreeSet<[u8; 6]> {
    crate::datapath::sys::link_macs().into_iter().collect()
}

/// The owned IPs of an IP table, with since when (for [`CensusTask::owned`]).
pub fn owned_since<'a>(
    ips: impl Iterator<Item = (&'a IpAddr, Ownership, u64)>,
) -> BTreeMap<IpAddr, u64> {
    ips.filter(|(_, s, _)| *s == Ownership::Owned)
        .map(|(ip, _, since)| (*ip, since))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::census::IpCensus;

    fn census(conflict: Option<Reason>) -> Census {
        let ip = IpAddr::V4(std::net::Ipv4Addr::new(203, 0, 113, 7));
        BTreeMap::from([(
            ip,
            IpCensus {
                owner: None,
                active: 2,
                conflict,
                responders: vec![],
                more: 0,
            },
        )])
    }

    #[test]
    fn a_conflict_counts_once_it_has_lasted() {
        let ip = IpAddr::V4(std::net::Ipv4Addr::new(203, 0, 113, 7));
        let mut seen = BTreeMap::new();
        // First seen now: not reported yet, and hidden from the document.
        let mut c = census(Some(Reason::Contested));
        assert!(confirm(&mut seen, &mut c, CONFIRM_AFTER).is_empty());
        assert_eq!(c[&ip].conflict, None);
        // Seen since long enough: reported.
        seen.insert(
            ip,
            (Reason::Contested, std::time::Instant::now() - CONFIRM_AFTER),
        );
        let mut c = census(Some(Reason::Contested));
        assert_eq!(
            confirm(&mut seen, &mut c, CONFIRM_AFTER).get(&ip),
            Some(&Reason::Contested)
        );
        assert_eq!(c[&ip].conflict, Some(Reason::Contested));
        // A claim of an IP owned here waits for a late feed.
        let mut c = census(Some(Reason::ClaimedElsewhere));
        assert!(confirm(&mut seen, &mut c, Duration::from_secs(30)).is_empty());
        seen.insert(
            ip,
            (
                Reason::ClaimedElsewhere,
                std::time::Instant::now() - Duration::from_secs(30),
            ),
        );
        let mut c = census(Some(Reason::ClaimedElsewhere));
        assert_eq!(
            confirm(&mut seen, &mut c, Duration::from_secs(30)).get(&ip),
            Some(&Reason::ClaimedElsewhere)
        );
        // A break (or another reason) starts the clock again.
        let mut c = census(Some(Reason::Contested));
        assert!(confirm(&mut seen, &mut c, CONFIRM_AFTER).is_empty());
        let mut c = census(Some(Reason::ClaimedElsewhere));
        assert!(confirm(&mut seen, &mut c, CONFIRM_AFTER).is_empty());
        let mut c = census(None);
        assert!(confirm(&mut seen, &mut c, CONFIRM_AFTER).is_empty());
        assert!(seen.is_empty());
    }
}
