//! The claims kept incrementally: indexes from each object to the LB IPs it
//! affects, so that a changed Service, Lease or ServiceL2Status re-derives
//! the claims of those IPs only, with the same per-Service decision and
//! per-IP merge as the full [`Store::ownership`]. Time matters too: a Lease
//! reaching its deadline changes its Services' claims, so the Leases are
//! indexed by deadline and only those whose deadline was crossed since the
//! last look are re-evaluated.

use std::{
    collections::{btree_map::Entry, BTreeMap, BTreeSet},
    net::IpAddr,
    ops::Bound::{Excluded, Included},
    sync::Arc,
    time::Instant,
};

use super::store::{Announcer, Key, L2Status, LeaseInfo, LeaseState, ServiceInfo, Store};
use crate::model::cluster::OwnerRecord;

fn count<K: Ord>(m: &mut BTreeMap<K, usize>, k: K, add: bool) {
    match m.entry(k) {
        Entry::Vacant(v) if add => {
            v.insert(1);
        }
        Entry::Vacant(_) => {}
        Entry::Occupied(mut o) => {
            if add {
                *o.get_mut() += 1;
            } else if *o.get() <= 1 {
                o.remove();
            } else {
                *o.get_mut() -= 1;
            }
        }
    }
}

fn named(n: Option<&Arc<str>>) -> Option<Arc<str>> {
    n.filter(|n| !n.is_empty()).cloned()
}

impl Store {
    /// A store whose incremental claims follow `announcers`.
    pub fn new(announcers: Vec<Announcer>) -> Self {
        let mut m = Store::default();
        m.idx.announcers = announcers;
        m
    }

    /// `--settle-shared-ips`: settle split elections of Services that are
    /// all `externalTrafficPolicy: Cluster` (see [`Store::fold`]).
    pub fn settling(mut self, on: bool) -> Self {
        self.idx.settle_shared = on;
        self
    }

    /// The claims as of the last [`Store::refresh`].
    pub fn claims(&self) -> &BTreeMap<IpAddr, Arc<OwnerRecord>> {
        &self.idx.claims
    }

    /// Add (or take away) what a Lease in use counts for: its holder and
    /// its duration. Called around every change of the Lease or of its use.
    fn account(&mut self, lease: &Key, add: bool) {
        if !self.idx.lease_services.contains_key(lease) {
            return;
        }
        let Some(l) = self.leases.get(lease) else {
            return;
        };
        if !l.unreadable {
            count(&mut self.idx.durations, l.duration, add);
        }
        if let Some(h) = named(l.holder.as_ref()) {
            self.count_holder(h, add);
        }
    }

    /// The one copy of a node name (names no one uses any more are dropped
    /// once as many have gathered as are in use).
    pub(super) fn intern(&mut self, name: impl AsRef<str> + Into<Arc<str>>) -> Arc<str> {
        if let Some(a) = self.names.get(name.as_ref()) {
            return a.clone();
        }
        if self.names.len() >= 2 * self.idx.holders.len() + 64 {
            self.names.retain(|a| Arc::strong_count(a) > 1);
        }
        let a: Arc<str> = name.into();
        self.names.insert(a.clone());
        a
    }

    /// One more (or one fewer) Lease held by, or status naming, `h`.
    fn count_holder(&mut self, h: Arc<str>, add: bool) {
        let before = self.idx.holders.len();
        count(&mut self.idx.holders, h, add);
        if self.idx.holders.len() != before {
            self.idx.holders_version += 1;
        }
    }

    fn lease_keys(&self, svc: &Key, info: &ServiceInfo) -> BTreeSet<Key> {
        (self.idx.announcers.iter())
            .filter_map(|a| Self::lease_key(svc, info, a))
            .collect()
    }

    /// Insert, replace (Some) or remove (None) a Service.
    pub fn set_service(&mut self, key: Key, info: Option<ServiceInfo>) {
        if self.services.get(&key) == info.as_ref() {
            return;
        }
        if let Some(old) = self.services.remove(&key) {
            for ip in &old.ips {
                if let Entry::Occupied(mut o) = self.idx.ip_services.entry(*ip) {
                    o.get_mut().remove(&key);
                    if o.get().is_empty() {
                        o.remove();
                    }
                }
                self.idx.dirty_ips.insert(*ip);
            }
            for lk in self.lease_keys(&key, &old) {
                let last = (self.idx.lease_services.get(&lk))
                    .is_some_and(|s| s.len() == 1 && s.contains(&key));
                if last {
                    self.account(&lk, false);
                    self.idx.lease_services.remove(&lk);
                } else if let Some(s) = self.idx.lease_services.get_mut(&lk) {
                    s.remove(&key);
                }
            }
        }
        let Some(info) = info else { return };
        for ip in &info.ips {
            (self.idx.ip_services.entry(*ip).or_default()).insert(key.clone());
            self.idx.dirty_ips.insert(*ip);
        }
        for lk in self.lease_keys(&key, &info) {
            let first = !self.idx.lease_services.contains_key(&lk);
            (self.idx.lease_services.entry(lk.clone()).or_default()).insert(key.clone());
            if first {
                self.account(&lk, true);
            }
        }
        self.services.insert(key, info);
    }

    /// Replace every Service (a relist, as the feed's `apply` does it): only
    /// those that differ are re-derived.
    #[cfg(test)]
    pub fn replace_services(&mut self, listed: BTreeMap<Key, ServiceInfo>) {
        let gone: Vec<Key> = (self.services.keys())
            .filter(|k| !listed.contains_key(*k))
            .cloned()
            .collect();
        for k in gone {
            self.set_service(k, None);
        }
        for (k, info) in listed {
            self.set_service(k, Some(info));
        }
    }

    /// Insert, replace (Some) or remove (None) a Lease as recorded.
    pub(super) fn set_lease(&mut self, key: Key, info: Option<LeaseInfo>) {
        self.account(&key, false);
        if let Some(old) = self.leases.remove(&key).filter(|l| !l.unreadable) {
            if let Entry::Occupied(mut o) = self.idx.deadlines.entry(old.deadline()) {
                o.get_mut().remove(&key);
                if o.get().is_empty() {
                    o.remove();
                }
            }
        }
        if let Some(info) = info {
            // An unreadable Lease has no deadline the guard could know.
            if !info.unreadable {
                let at = info.deadline();
                (self.idx.deadlines.entry(at).or_default()).insert(key.clone());
            }
            self.leases.insert(key.clone(), info);
        }
        self.account(&key, true);
        self.lease_touched(&key);
    }

    /// A renewal (or a resync) that changes no claim: the same readable
    /// holder and duration, live before and after. Only its times and its
    /// place among the deadlines move; nothing is marked to re-derive. The
    /// Lease back when it is not such a renewal.
    pub(super) fn renew_in_place(
        &mut self,
        key: &Key,
        info: LeaseInfo,
        now: Instant,
    ) -> Option<LeaseInfo> {
        let Some(old) = self.leases.get_mut(key) else {
            return Some(info);
        };
        let live = |l: &LeaseInfo| matches!(l.state(now), LeaseState::Live(_));
        let same = !old.unreadable
            && !info.unreadable
            && old.holder == info.holder
            && old.duration == info.duration;
        if !same || !live(old) || !live(&info) {
            return Some(info);
        }
        let (from, to) = (old.deadline(), info.deadline());
        *old = info;
        if from != to {
            if let Entry::Occupied(mut o) = self.idx.deadlines.entry(from) {
                o.get_mut().remove(key);
                if o.get().is_empty() {
                    o.remove();
                }
            }
            (self.idx.deadlines.entry(to).or_default()).insert(key.clone());
        }
        None
    }

    pub fn remove_lease(&mut self, key: &Key) {
        if self.leases.contains_key(key) {
            self.set_lease(key.clone(), None);
        }
    }

    fn lease_touched(&mut self, key: &Key) {
        if let Some(s) = self.idx.lease_services.get(key) {
            self.idx.dirty_services.extend(s.iter().cloned());
        }
    }

    /// Insert, replace (Some) or remove (None) a ServiceL2Status.
    pub fn set_l2(&mut self, key: Key, s: Option<L2Status>) {
        let s = s.map(|s| L2Status {
            node: s.node.map(|n| self.intern(n)),
            ..s
        });
        if self.l2.get(&key) == s.as_ref() {
            return;
        }
        if let Some(old) = self.l2.remove(&key) {
            if let Entry::Occupied(mut o) = self.idx.l2_of_service.entry(old.service.clone()) {
                o.get_mut().remove(&key);
                if o.get().is_empty() {
                    o.remove();
                }
            }
            if let Some(n) = named(old.node.as_ref()) {
                self.count_holder(n, false);
            }
            self.idx.dirty_services.insert(old.service);
        }
        let Some(s) = s else { return };
        (self.idx.l2_of_service.entry(s.service.clone()).or_default()).insert(key.clone());
        if let Some(n) = named(s.node.as_ref()) {
            self.count_holder(n, true);
        }
        self.idx.dirty_services.insert(s.service.clone());
        self.l2.insert(key, s);
    }

    /// Bring the claims to `now`: re-derive the IPs of every Service
    /// changed since the last refresh and of every Service whose Lease
    /// crossed its deadline in between. Returns the IPs whose claim changed
    /// (appeared, went or differs).
    pub fn refresh(&mut self, now: Instant) -> BTreeSet<IpAddr> {
        if let Some(prev) = self.idx.evaluated {
            let (lo, hi) = if prev <= now {
                (prev, now)
            } else {
                (now, prev)
            };
            let crossed: Vec<Key> = (self.idx.deadlines.range((Excluded(lo), Included(hi))))
                .flat_map(|(_, keys)| keys.iter().cloned())
                .collect();
            for k in crossed {
                self.lease_touched(&k);
            }
        }
        self.idx.evaluated = Some(now);
        let mut ips = std::mem::take(&mut self.idx.dirty_ips);
        for svc in std::mem::take(&mut self.idx.dirty_services) {
            if let Some(info) = self.services.get(&svc) {
                ips.extend(info.ips.iter().copied());
            }
        }
        let mut changed = BTreeSet::new();
        for ip in ips {
            let claim = self.claim_of(&ip, now);
            if self.idx.claims.get(&ip).map(|c| &**c) == claim.as_ref() {
                continue;
            }
            match claim {
                Some(c) => self.idx.claims.insert(ip, Arc::new(c)),
                None => self.idx.claims.remove(&ip),
            };
            changed.insert(ip);
        }
        changed
    }

    /// One IP's claim from the Services carrying it, in the order the full
    /// derivation folds them.
    fn claim_of(&self, ip: &IpAddr, now: Instant) -> Option<OwnerRecord> {
        let svcs = self.idx.ip_services.get(ip)?;
        let claims = (svcs.iter())
            .filter_map(|svc| {
                let info = self.services.get(svc)?;
                Some((
                    self.decision(svc, info, &self.idx.announcers, now),
                    info.local,
                ))
            })
            .collect();
        Self::fold(claims, self.idx.settle_shared)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use crate::testing::Rng;

    const IPS: [&str; 6] = [
        "10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "fd00::1",
    ];
    const NODES: [Option<&str>; 4] = [Some("node-a"), Some("node-b"), Some(""), None];

    fn svc_key(r: &mut Rng) -> Key {
        Key::new(
            *r.pick(&["default", "shop"]),
            *r.pick(&["web", "api", "db", "dns"]),
        )
    }

    /// The O(all) derivations the indexes replace, as the reference.
    fn referenced(m: &Store, a: &[Announcer]) -> BTreeSet<Key> {
        (m.services.iter())
            .flat_map(|(s, i)| a.iter().filter_map(move |a| Store::lease_key(s, i, a)))
            .collect()
    }

    fn check(m: &Store, a: &[Announcer], now: Instant) {
        let claims: BTreeMap<IpAddr, OwnerRecord> = (m.claims().iter())
            .map(|(ip, c)| (*ip, OwnerRecord::clone(c)))
            .collect();
        assert_eq!(claims, m.ownership(a, now));
        let used = referenced(m, a);
        let holders: BTreeSet<&str> = (used.iter())
            .filter_map(|k| m.leases.get(k)?.holder.as_deref())
            .chain(m.l2.values().filter_map(|s| s.node.as_deref()))
            .filter(|n| !n.is_empty())
            .collect();
        assert_eq!(m.named_nodes(), holders);
        let max = used
            .iter()
            .filter_map(|k| m.leases.get(k))
            .filter(|l| !l.unreadable)
            .map(|l| l.duration)
            .max();
        assert_eq!(m.max_lease_duration(), max);
        let unconfirmed: Vec<(Key, Instant)> = (used.iter())
            .filter_map(|k| {
                let l = m.leases.get(k)?;
                matches!(l.state(now), LeaseState::Unconfirmed(_))
                    .then(|| (k.clone(), l.deadline()))
            })
            .collect();
        assert_eq!(m.unconfirmed(now), unconfirmed);
    }

    /// After any sequence of Service, Lease and ServiceL2Status changes and
    /// the passing of time, the incremental claims equal the full
    /// derivation, and the IPs reported changed are exactly those whose
    /// claim differs.
    #[test]
    fn incremental_claims_equal_the_full_derivation() {
        let announcer_sets = [
            vec![
                Announcer::Cilium {
                    namespace: "kube-system".into(),
                },
                Announcer::MetalLb {
                    namespace: "metallb-system".into(),
                },
            ],
            vec![Announcer::KubeVipPerService],
            vec![Announcer::KubeVipGlobal {
                lease: Key::new("kube-system", "plndr-svcs-lock"),
            }],
        ];
        for (seed, a) in (1..=30u64).zip(announcer_sets.iter().cycle()) {
            let mut r = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            let mut m = Store::new(a.clone());
            let mut now = Instant::now();
            let mut prev = BTreeMap::new();
            for _ in 0..400 {
                match r.below(8) {
                    0 | 1 => {
                        let n = r.below(3);
                        let ips = (0..n).map(|_| r.pick(&IPS).parse().unwrap()).collect();
                        let vip = [None, Some("custom"), Some("infra/lock")];
                        let info = ServiceInfo {
                            ips,
                            kube_vip_lease: r.pick(&vip).map(Into::into),
                            unreadable: r.below(8) == 0,
                            local: r.below(2) == 0,
                        };
                        m.set_service(svc_key(&mut r), Some(info));
                    }
                    2 => m.set_service(svc_key(&mut r), None),
                    3 | 4 => {
                        let s = svc_key(&mut r);
                        let key = match r.below(4) {
                            0 => Key::new(
                                "kube-system",
                                format!("cilium-l2announce-{}-{}", s.ns, s.name),
                            ),
                            1 => Key::new(s.ns.clone(), format!("kubevip-{}", s.name)),
                            2 => Key::new("kube-system", "plndr-svcs-lock"),
                            _ => {
                                Key::new(*r.pick(&["shop", "infra"]), *r.pick(&["custom", "lock"]))
                            }
                        };
                        if r.below(5) == 0 {
                            m.remove_lease(&key);
                        } else if r.below(8) == 0 {
                            m.lease_unreadable(key, r.pick(&NODES).map(Into::into), now);
                        } else {
                            let holder = r.pick(&NODES).map(Into::into);
                            let d = Duration::from_secs(*r.pick(&[5, 10, 15]));
                            let renew = Some(r.pick(&["r1", "r2", "r3"]).to_string());
                            m.upsert_lease(key, holder, d, renew, now);
                        }
                    }
                    5 => {
                        let key = Key::new(
                            *r.pick(&["metallb-system", "other"]),
                            *r.pick(&["l2-1", "l2-2", "l2-3"]),
                        );
                        let s = (r.below(4) > 0).then(|| L2Status {
                            node: r.pick(&NODES).map(Into::into),
                            service: svc_key(&mut r),
                            unreadable: r.below(6) == 0,
                        });
                        m.set_l2(key, s);
                    }
                    6 => {
                        // A relist: some Services stay, some change, some go.
                        let mut listed = m.services.clone();
                        listed.retain(|_, _| r.below(3) > 0);
                        m.replace_services(listed);
                    }
                    _ => now += Duration::from_millis(r.below(9000) as u64),
                }
                let changed = m.refresh(now);
                let cur = m.claims().clone();
                let differ: BTreeSet<IpAddr> = (prev.keys().chain(cur.keys()))
                    .filter(|ip| prev.get(*ip) != cur.get(*ip))
                    .copied()
                    .collect();
                assert_eq!(changed, differ, "seed {seed}");
                check(&m, a, now);
                prev = cur;
            }
        }
    }
}
