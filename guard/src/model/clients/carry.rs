//! Misdirected clients carried across a restart (pure). The census's table
//! lives with the daemon (it is not pinned): a restarted daemon starts with
//! an empty one, and its entries count from their first packet after the
//! restart. What the previous daemon had read is handed back as [`Kept`]
//! clients: each one's entry as last read (its first packet, its count
//! since the move) and what was remembered of it (its count at the move,
//! whether its failover time was observed, its staleness reported). Until
//! the new table's entry for the same client is evicted, the two are read
//! as one: the kept count plus the new one, the kept start of its run while
//! the run goes on. A kept client the new table does not hold is listed as
//! its old entry, as the kernel's table would have held it.

use std::{
    borrow::Cow,
    collections::{BTreeMap, HashSet},
    net::IpAddr,
    time::Duration,
};

use super::{Context, Entry, Memory, Seen};

/// One client as it is kept across a restart (times on the entries' clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kept {
    /// Its entry as last read (packets since the entry was made).
    pub entry: Entry,
    /// Its count when this node last lost the IP.
    pub baseline: u64,
    /// The start of the run its staleness was reported for.
    pub run: u64,
    pub observed: bool,
    pub stale_reported: bool,
    pub announced: bool,
}

/// A kept client, while it matters.
#[derive(Debug, Clone, Copy)]
pub(super) struct Carried {
    entry: Entry,
    /// The count of this daemon's entry for the client at the last read (0:
    /// none seen yet). Fewer next time, or none: that entry was evicted,
    /// and the client counts from scratch, as after any eviction.
    kernel: u64,
}

/// What the daemon hands back after a restart.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Restore {
    pub clients: Vec<Kept>,
    /// Misdirected packets per LB IP, counted before the restart.
    pub totals: BTreeMap<IpAddr, u64>,
    /// The loss of each IP the clients' counts were taken at (the daemon's
    /// restored losses): not a new move.
    pub moves: BTreeMap<IpAddr, u64>,
    /// `--census-window`: a silence this long ends a client's run.
    pub run_gap: Duration,
}

impl Memory {
    /// Take back what the previous daemon knew (before or after reads of
    /// this daemon's table: counts it made since are kept, added to).
    pub fn restore(&mut self, r: Restore) {
        self.run_gap_ns = u64::try_from(r.run_gap.as_nanos()).unwrap_or(u64::MAX);
        for (ip, n) in r.totals {
            *self.totals.entry(ip).or_default() += n;
        }
        self.moves.extend(r.moves);
        for k in r.clients {
            let key = (k.entry.ip, k.entry.mac);
            // Its entry in this daemon's table, as read (and counted) already.
            let kernel = self.seen.get(&key).map_or(0, |s| s.packets);
            self.seen.insert(
                key,
                Seen {
                    packets: k.entry.packets.saturating_add(kernel),
                    baseline: k.baseline,
                    run: k.run,
                    observed: k.observed,
                    stale_reported: k.stale_reported,
                    announced: k.announced,
                },
            );
            let entry = k.entry;
            self.carried.insert(key, Carried { entry, kernel });
        }
    }

    /// Clients carried from before a restart that still matter.
    pub fn carried(&self) -> usize {
        self.carried.len()
    }
}

/// This read's entries with the carried clients folded in; carried clients
/// that no longer matter are forgotten (their IP left the LB set or moved
/// again since, their entry of this daemon was evicted).
pub(super) fn merge<'a>(entries: &'a [Entry], cx: &Context, mem: &mut Memory) -> Cow<'a, [Entry]> {
    if mem.carried.is_empty() {
        return Cow::Borrowed(entries);
    }
    mem.carried.retain(|(ip, _), c| {
        cx.ips
            .get(ip)
            .is_some_and(|s| s.lost_ns.is_none_or(|lost| c.entry.last_ns >= lost))
    });
    let mut held = HashSet::with_capacity(mem.carried.len());
    let mut out = Vec::with_capacity(entries.len() + mem.carried.len());
    for e in entries {
        let key = (e.ip, e.mac);
        match mem.carried.get_mut(&key) {
            Some(c) if e.packets >= c.kernel => {
                c.kernel = e.packets;
                held.insert(key);
                out.push(joined(&c.entry, e, mem.run_gap_ns));
            }
            Some(_) => {
                mem.carried.remove(&key);
                out.push(*e);
            }
            None => out.push(*e),
        }
    }
    // Seen in this daemon's table before and gone from it now: evicted.
    mem.carried
        .retain(|key, c| held.contains(key) || c.kernel == 0);
    out.extend(
        (mem.carried.iter())
            .filter(|(key, _)| !held.contains(*key))
            .map(|(_, c)| c.entry),
    );
    Cow::Owned(out)
}

/// A kept entry and this daemon's entry of the same client, read as one.
fn joined(kept: &Entry, now: &Entry, run_gap_ns: u64) -> Entry {
    let run_goes_on = now.first_ns <= kept.last_ns.saturating_add(run_gap_ns);
    Entry {
        first_ns: if run_goes_on {
            kept.first_ns
        } else {
            now.first_ns
        },
        packets: kept.packets.saturating_add(now.packets),
        ..*now
    }
}

/// What is kept of the clients now, to hand to the next daemon: `entries`
/// (this daemon's last read) with the carried clients folded in, as the
/// last [`super::assess`] judged them, each with what is remembered of it.
pub fn kept(entries: &[Entry], mem: &Memory) -> Vec<Kept> {
    let mut out = Vec::with_capacity(entries.len() + mem.carried.len());
    let mut held = HashSet::new();
    for e in entries {
        let key = (e.ip, e.mac);
        let entry = match mem.carried.get(&key) {
            Some(c) if e.packets >= c.kernel => {
                held.insert(key);
                joined(&c.entry, e, mem.run_gap_ns)
            }
            _ => *e,
        };
        out.extend(mem.seen.get(&key).map(|s| kept_of(entry, s)));
    }
    for (key, c) in &mem.carried {
        if !held.contains(key) {
            out.extend(mem.seen.get(key).map(|s| kept_of(c.entry, s)));
        }
    }
    out
}

fn kept_of(entry: Entry, s: &Seen) -> Kept {
    Kept {
        entry,
        baseline: s.baseline,
        run: s.run,
        observed: s.observed,
        stale_reported: s.stale_reported,
        announced: s.announced,
    }
}

/// What [`Memory`] counted per LB IP (to hand to the next daemon).
pub fn totals(mem: &Memory) -> &BTreeMap<IpAddr, u64> {
    &mem.totals
}

#[cfg(test)]
mod tests;
