//! Between what a daemon knows (on its monotonic clock) and the records
//! stored (wall-clock times, cut to their bounds).

use std::net::IpAddr;

use super::{
    secs_ns, ClaimRecord, ClientRecord, Clock, IpKnown, IpRecord, TakeoverKept, MAX_CLAIMS,
    MAX_SOURCE,
};
use crate::model::{
    census::CensusEntry,
    clients::{Entry, Kept},
    takeover::{KeptTakeover, TakeoverRecord},
};

/// One IP's record, with how recent it is (Unix ns; 0: counts only).
pub(super) fn record_of(ip: IpAddr, k: &IpKnown, clock: &Clock) -> (u64, IpRecord) {
    let lost_at = k.lost_ns.map(|t| clock.unix_ns_of(t));
    let takeover = k.takeover.as_ref().map(|t| TakeoverKept {
        at_unix: t.record.at_unix,
        first_ms: t.record.first_announcement_ms,
        via: t.record.via,
        silent: t.record.silent,
        pending_at: t.pending.map(|(since, _)| clock.unix_ns_of(since)),
    });
    let recent = (lost_at.unwrap_or(0)).max(takeover.as_ref().map_or(0, |t| secs_ns(t.at_unix)));
    let mut source = k.source.clone();
    if source.len() > MAX_SOURCE {
        let mut end = MAX_SOURCE;
        while !source.is_char_boundary(end) {
            end -= 1;
        }
        source.truncate(end);
    }
    let r = IpRecord {
        ip,
        state: k.state,
        source,
        since: k.since_unix,
        lost_at,
        takeover,
        packets: k.packets,
        claims: claims_of(&k.claims, clock),
    };
    (recent, r)
}

pub(super) fn client_of(k: &Kept, clock: &Clock) -> ClientRecord {
    let e = &k.entry;
    ClientRecord {
        ip: e.ip,
        mac: e.mac,
        client_ip: e.client_ip,
        first_at: clock.unix_ns_of(e.first_ns),
        last_at: clock.unix_ns_of(e.last_ns),
        packets: e.packets,
        baseline: k.baseline,
        ifindex: e.ifindex,
        vlan: e.vlan,
        run_at: if k.run == 0 {
            0
        } else {
            clock.unix_ns_of(k.run)
        },
        flags: u8::from(k.observed) | u8::from(k.stale_reported) << 1 | u8::from(k.announced) << 2,
    }
}

/// One IP record on the reader's clock; how many of its parts were dropped.
pub(super) fn ip_known(
    r: IpRecord,
    clock: &Clock,
    fresh: &impl Fn(u64) -> bool,
) -> (IpKnown, usize) {
    let mut dropped = 0;
    let lost_ns = match r.lost_at {
        Some(t) if fresh(t) => Some(clock.mono_ns_of(t)),
        Some(_) => {
            dropped += 1;
            None
        }
        None => None,
    };
    let takeover = match r.takeover {
        Some(t) if fresh(secs_ns(t.at_unix)) && t.pending_at.is_none_or(fresh) => {
            Some(KeptTakeover {
                pending: t.pending_at.map(|at| (clock.mono_ns_of(at), t.silent)),
                record: TakeoverRecord {
                    at_unix: t.at_unix,
                    first_announcement_ms: t.first_ms,
                    via: t.via,
                    silent: t.silent,
                },
            })
        }
        Some(_) => {
            dropped += 1;
            None
        }
        None => None,
    };
    let claims = (r.claims.iter())
        .filter(|c| fresh(c.last_at))
        .map(|c| CensusEntry {
            ip: r.ip,
            mac: c.mac,
            first_ns: clock.mono_ns_of(c.first_at.min(c.last_at)),
            last_ns: clock.mono_ns_of(c.last_at),
            count: c.count,
            ifindex: c.ifindex,
            kinds: c.kinds,
        })
        .collect();
    let k = IpKnown {
        state: r.state,
        source: r.source,
        since_unix: r.since,
        lost_ns,
        takeover,
        packets: r.packets,
        claims,
    };
    (k, dropped)
}

pub(super) fn kept_of(c: &ClientRecord, clock: &Clock) -> Kept {
    let last_ns = clock.mono_ns_of(c.last_at);
    Kept {
        entry: Entry {
            ip: c.ip,
            mac: c.mac,
            client_ip: c.client_ip,
            first_ns: clock.mono_ns_of(c.first_at).min(last_ns),
            last_ns,
            packets: c.packets,
            ifindex: c.ifindex,
            vlan: c.vlan,
        },
        baseline: c.baseline.min(c.packets),
        run: if c.run_at == 0 {
            0
        } else {
            clock.mono_ns_of(c.run_at)
        },
        observed: c.flags & 1 != 0,
        stale_reported: c.flags & 2 != 0,
        announced: c.flags & 4 != 0,
    }
}

/// The latest claims, at most [`MAX_CLAIMS`].
fn claims_of(claims: &[CensusEntry], clock: &Clock) -> Vec<ClaimRecord> {
    let mut latest: Vec<&CensusEntry> = claims.iter().collect();
    latest.sort_by_key(|c| (std::cmp::Reverse(c.last_ns), c.mac));
    (latest.into_iter().take(MAX_CLAIMS))
        .map(|c| ClaimRecord {
            mac: c.mac,
            first_at: clock.unix_ns_of(c.first_ns),
            last_at: clock.unix_ns_of(c.last_ns),
            count: c.count,
            ifindex: c.ifindex,
            kinds: c.kinds,
        })
        .collect()
}
