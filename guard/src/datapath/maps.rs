//! Keeping the maps equal to the view: a generic reconciler that writes
//! changed entries in place before deleting stale ones (so protection never
//! has a gap) and records what it could not write, and the tables it keeps;
//! `apply.rs` drives them from the view.

use std::{
    collections::BTreeMap,
    net::{Ipv4Addr, Ipv6Addr},
};

use aya::{
    maps::{HashMap, MapData},
    Ebpf, Pod,
};
use guard_common::{
    IfAddrKey, IpKey, LbEntry, VlanKey, MAP_IF_ADDRS, MAP_IF_PRIMARY, MAP_LB_IPS, MAP_LB_IPS6,
    MAP_VLAN_UPPERS,
};

use super::{
    error::{errno, DatapathError, Result},
    filter::{ForeignFilter, LbFilter},
};

/// What one [`super::Datapath::apply`] changed, and what it could not.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ApplyReport {
    pub written: usize,
    pub removed: usize,
    /// Entries not brought to their desired state; each keeps its old value
    /// in the kernel (a new one: absent) and is tried again.
    pub failed: Vec<EntryFailure>,
}

impl ApplyReport {
    /// Entries that did not fit in a full map. An LB IP that did not fit is
    /// not in the LB set: its frames pass (fail safe). Retried on the next
    /// change and at each full reconcile.
    pub fn full(&self) -> impl Iterator<Item = &EntryFailure> {
        self.failed.iter().filter(|f| f.error == EntryError::Full)
    }

    /// Failures other than a full map: retried every second.
    pub fn errors(&self) -> impl Iterator<Item = &EntryFailure> {
        self.failed.iter().filter(|f| f.error != EntryError::Full)
    }
}

/// One entry the reconciler could not bring to its desired state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{entry} {}: {error}", .op.outcome())]
pub struct EntryFailure {
    /// The entry, as an operator reads it ("LB IP 198.51.100.7").
    pub entry: String,
    pub op: Op,
    pub error: EntryError,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Write,
    Remove,
}

impl Op {
    /// What became of an entry this operation failed for.
    fn outcome(self) -> &'static str {
        match self {
            Op::Write => "not written",
            Op::Remove => "not removed",
        }
    }
}

/// Why an entry is not as desired, by errno.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    /// E2BIG: the map holds `max_entries` already.
    #[error("the map is full")]
    Full,
    #[error("{}", std::io::Error::from_raw_os_error(*.0))]
    Errno(i32),
    /// An error without an errno, as aya words it.
    #[error("{0}")]
    Other(String),
}

impl EntryError {
    pub(super) fn of(e: &aya::maps::MapError) -> Self {
        match errno(e) {
            Some(libc::E2BIG) => EntryError::Full,
            Some(n) => EntryError::Errno(n),
            None => EntryError::Other(e.to_string()),
        }
    }
}

/// What else must happen when a key enters or leaves a map, or a value is
/// written (the LB filter's bits around `LB_IPS`, the census's foreign
/// filter around both LB maps' values).
pub(super) trait KeyHook<K, V> {
    /// Before a new key is written; an error keeps the key out.
    fn before_insert(&mut self, _k: &K) -> std::result::Result<(), EntryError> {
        Ok(())
    }
    /// Before `v` is written for `k` (a new key or a changed value).
    fn before_write(&mut self, _k: &K, _v: &V) {}
    /// After `v` was written for `k`.
    fn after_write(&mut self, _k: &K, _v: &V) {}
    /// After a key was removed.
    fn after_remove(&mut self, _k: &K) {}
}

/// Nothing else to do.
pub(super) struct NoHook;
impl<K, V> KeyHook<K, V> for NoHook {}

/// The hooks of `LB_IPS`: the LB filter's bit is set before a new IP
/// enters and cleared after it left; the census's foreign bit is set
/// when an entry comes to say `foreign` and cleared when it no longer does
/// (written to the kernel by the foreign filter's flush after the batch).
pub(super) struct LbHooks<'a> {
    pub(super) filter: &'a mut LbFilter,
    pub(super) foreign: &'a mut ForeignFilter,
}

impl KeyHook<u32, LbEntry> for LbHooks<'_> {
    fn before_insert(&mut self, ip: &u32) -> std::result::Result<(), EntryError> {
        self.filter.admit(ip).map_err(|e| EntryError::of(&e))
    }
    fn before_write(&mut self, ip: &u32, v: &LbEntry) {
        if is_foreign(v) {
            self.foreign.set(guard_common::v4_key(*ip), true);
        }
    }
    fn after_write(&mut self, ip: &u32, v: &LbEntry) {
        if !is_foreign(v) {
            self.foreign.set(guard_common::v4_key(*ip), false);
        }
    }
    fn after_remove(&mut self, ip: &u32) {
        self.filter.release(ip);
        self.foreign.set(guard_common::v4_key(*ip), false);
    }
}

/// The hooks of `LB_IPS6`: the census's foreign bit, as for `LB_IPS`.
pub(super) struct Lb6Hooks<'a>(pub(super) &'a mut ForeignFilter);

impl KeyHook<IpKey, LbEntry> for Lb6Hooks<'_> {
    fn before_write(&mut self, ip: &IpKey, v: &LbEntry) {
        if is_foreign(v) {
            self.0.set(*ip, true);
        }
    }
    fn after_write(&mut self, ip: &IpKey, v: &LbEntry) {
        if !is_foreign(v) {
            self.0.set(*ip, false);
        }
    }
    fn after_remove(&mut self, ip: &IpKey) {
        self.0.set(*ip, false);
    }
}

fn is_foreign(e: &LbEntry) -> bool {
    e.state == guard_common::Ownership::Foreign as u8
}

/// One map as the reconciler keeps it: what the kernel holds (as we wrote
/// or last read it) and, per entry, why it is not as desired.
#[derive(Debug)]
pub(super) struct Table<K, V> {
    name: &'static str,
    pub(super) applied: BTreeMap<K, V>,
    status: BTreeMap<K, EntryError>,
    describe: fn(&K) -> String,
}

impl<K: Pod + Ord, V: Pod + PartialEq> Table<K, V> {
    pub(super) fn new(name: &'static str, describe: fn(&K) -> String) -> Self {
        Table {
            name,
            applied: BTreeMap::new(),
            status: BTreeMap::new(),
            describe,
        }
    }

    /// Entries that did not fit in the full map at the last reconcile.
    pub(super) fn full(&self) -> usize {
        self.status
            .values()
            .filter(|e| **e == EntryError::Full)
            .count()
    }

    /// The kernel map as a typed hash map, or a failure in `report` naming it.
    fn open<'m>(
        &self,
        map: Option<&'m mut aya::maps::Map>,
        report: &mut ApplyReport,
    ) -> Option<HashMap<&'m mut MapData, K, V>> {
        let error = match map.map(HashMap::try_from).transpose() {
            Ok(Some(m)) => return Some(m),
            Ok(None) => EntryError::Other("map missing from the object".into()),
            Err(e) => EntryError::of(&e),
        };
        report.failed.push(EntryFailure {
            entry: format!("map {}", self.name),
            op: Op::Write,
            error,
        });
        None
    }

    /// Bring the kernel map to `desired`: changed entries are written in
    /// place before stale ones are deleted (so protection never has a gap),
    /// and entries that met a full map get a second chance once stale ones
    /// are gone. `additive`: delete nothing.
    pub(super) fn reconcile(
        &mut self,
        map: Option<&mut aya::maps::Map>,
        desired: &BTreeMap<K, V>,
        additive: bool,
        report: &mut ApplyReport,
        hook: &mut dyn KeyHook<K, V>,
    ) {
        let Some(mut map) = self.open(map, report) else {
            return;
        };
        self.status.retain(|k, _| desired.contains_key(k));
        let stale: Vec<K> = self
            .applied
            .keys()
            .filter(|k| !desired.contains_key(k))
            .copied()
            .collect();
        let changes = desired.iter().map(|(k, v)| (*k, Some(*v)));
        let changes = changes.chain(stale.into_iter().map(|k| (k, None)));
        self.sync(&mut map, changes, additive, report, hook);
    }

    /// Bring only the entries `keys` to `desired` (None: absent), leaving
    /// every other entry as it is: the cost of one change, whatever the size
    /// of the map. Same order and second chance as [`Table::reconcile`].
    pub(super) fn apply_keys(
        &mut self,
        map: Option<&mut aya::maps::Map>,
        keys: impl Iterator<Item = (K, Option<V>)>,
        additive: bool,
        report: &mut ApplyReport,
        hook: &mut dyn KeyHook<K, V>,
    ) {
        let Some(mut map) = self.open(map, report) else {
            return;
        };
        self.sync(&mut map, keys, additive, report, hook);
    }

    /// The one loop of both: every changed entry of `changes` written (None:
    /// to be removed), then the removals (unless `additive`), then a second
    /// write of the entries that met a full map.
    fn sync(
        &mut self,
        map: &mut HashMap<&mut MapData, K, V>,
        changes: impl Iterator<Item = (K, Option<V>)>,
        additive: bool,
        report: &mut ApplyReport,
        hook: &mut dyn KeyHook<K, V>,
    ) {
        let fail = |report: &mut ApplyReport, entry: String, op, error| {
            report.failed.push(EntryFailure { entry, op, error })
        };
        let (mut full, mut stale) = (Vec::new(), Vec::new());
        for (k, v) in changes {
            let Some(v) = v else {
                self.status.remove(&k);
                stale.push(k);
                continue;
            };
            if self.applied.get(&k) == Some(&v) {
                self.status.remove(&k);
                continue;
            }
            match self.write(map, &k, &v, report, hook) {
                Err(EntryError::Full) => full.push((k, v)),
                Err(e) => fail(report, (self.describe)(&k), Op::Write, e),
                Ok(()) => {}
            }
        }
        for k in stale.into_iter().filter(|_| !additive) {
            if !self.applied.contains_key(&k) {
                continue;
            }
            match map.remove(&k) {
                Ok(()) => {
                    self.applied.remove(&k);
                    hook.after_remove(&k);
                    report.removed += 1;
                }
                Err(e) => fail(report, (self.describe)(&k), Op::Remove, EntryError::of(&e)),
            }
        }
        for (k, v) in full {
            if let Err(e) = self.write(map, &k, &v, report, hook) {
                fail(report, (self.describe)(&k), Op::Write, e);
            }
        }
    }

    fn write(
        &mut self,
        map: &mut HashMap<&mut MapData, K, V>,
        k: &K,
        v: &V,
        report: &mut ApplyReport,
        hook: &mut dyn KeyHook<K, V>,
    ) -> std::result::Result<(), EntryError> {
        let new = !self.applied.contains_key(k);
        if new {
            if let Err(e) = hook.before_insert(k) {
                self.status.insert(*k, e.clone());
                return Err(e);
            }
        }
        hook.before_write(k, v);
        match map.insert(k, v, 0) {
            Ok(()) => {
                self.applied.insert(*k, *v);
                self.status.remove(k);
                report.written += 1;
                hook.after_write(k, v);
                Ok(())
            }
            Err(e) => {
                if new {
                    hook.after_remove(k);
                }
                let e = EntryError::of(&e);
                self.status.insert(*k, e.clone());
                Err(e)
            }
        }
    }

    /// Re-read what the kernel map holds; returns how many entries differed
    /// from our record (drift: changed or deleted behind our back).
    pub(super) fn reload(&mut self, ebpf: &Ebpf) -> Result<usize> {
        let map = ebpf
            .map(self.name)
            .ok_or_else(|| DatapathError::NoMap(self.name.to_owned()))?;
        let map: HashMap<&MapData, K, V> = HashMap::try_from(map)?;
        let kernel = map.iter().collect::<Result<BTreeMap<K, V>, _>>()?;
        let n = differing(&kernel, &self.applied);
        self.applied = kernel;
        Ok(n)
    }
}

/// The maps the view is written into, and the filter in front of LB_IPS.
#[derive(Debug)]
pub(super) struct Tables {
    pub(super) lb: Table<u32, LbEntry>,
    /// The IPv6 LB set (no filter in front: only NDP frames look it up).
    pub(super) lb6: Table<IpKey, LbEntry>,
    pub(super) filter: LbFilter,
    /// The census's foreign filter, kept equal to the foreign entries of
    /// both LB maps.
    pub(super) foreign: ForeignFilter,
    pub(super) if_addrs: Table<IfAddrKey, u8>,
    pub(super) if_primary: Table<u32, u32>,
    pub(super) vlan_uppers: Table<VlanKey, u32>,
}

impl Tables {
    /// `filter`, `foreign`: the program's LB_FILTER and FOREIGN_FILTER
    /// maps, taken out of the object.
    pub(super) fn new(filter: Option<aya::maps::Map>, foreign: Option<aya::maps::Map>) -> Self {
        Tables {
            lb: Table::new(MAP_LB_IPS, |k| format!("LB IP {}", Ipv4Addr::from(*k))),
            lb6: Table::new(MAP_LB_IPS6, |k| format!("LB IP {}", Ipv6Addr::from(*k))),
            filter: LbFilter::new(filter),
            foreign: ForeignFilter::new(foreign),
            if_addrs: Table::new(MAP_IF_ADDRS, |k| {
                format!(
                    "address {} on ifindex {}",
                    Ipv4Addr::from(k.addr),
                    k.ifindex
                )
            }),
            if_primary: Table::new(MAP_IF_PRIMARY, |k| {
                format!("primary address of ifindex {k}")
            }),
            vlan_uppers: Table::new(MAP_VLAN_UPPERS, |k| {
                format!("VLAN {} on ifindex {}", k.vid, k.lower)
            }),
        }
    }
}

impl Tables {
    /// The LB IPs of both maps whose entry says `foreign`, as keys.
    pub(super) fn foreign_ips(&self) -> impl Iterator<Item = IpKey> + '_ {
        let foreign = guard_common::Ownership::Foreign as u8;
        let v4 = (self.lb.applied.iter())
            .filter(move |(_, e)| e.state == foreign)
            .map(|(ip, _)| guard_common::v4_key(*ip));
        let v6 = (self.lb6.applied.iter())
            .filter(move |(_, e)| e.state == foreign)
            .map(|(ip, _)| *ip);
        v4.chain(v6)
    }
}

/// Entries that differ between what a map holds and our record of it: keys
/// on one side only, and keys whose values differ (by content, so a
/// same-size swap is drift too).
fn differing<K: Ord, V: PartialEq>(kernel: &BTreeMap<K, V>, ours: &BTreeMap<K, V>) -> usize {
    let changed_or_extra = kernel
        .iter()
        .filter(|(k, v)| ours.get(k) != Some(v))
        .count();
    let missing = ours.keys().filter(|k| !kernel.contains_key(k)).count();
    changed_or_extra + missing
}

#[cfg(test)]
mod tests {
    use super::differing;
    use std::collections::BTreeMap;

    #[test]
    fn drift_is_seen_by_content() {
        let ours = BTreeMap::from([(1, 1u8), (2, 1)]);
        assert_eq!(differing(&ours, &ours), 0);
        // Same size, another key: one extra, one missing.
        assert_eq!(differing(&BTreeMap::from([(1, 1), (3, 1)]), &ours), 2);
        // Same keys, another value.
        assert_eq!(differing(&BTreeMap::from([(1, 1), (2, 9)]), &ours), 1);
        assert_eq!(differing(&BTreeMap::new(), &ours), 2);
        assert_eq!(differing(&ours, &BTreeMap::new()), 2);
    }
}
