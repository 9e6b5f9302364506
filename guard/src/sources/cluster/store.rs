//! The feed's store: what the cluster says about LB IPs and their owners
//! (the Services, Leases and ServiceL2Statuses the feed keeps), in plain
//! types, and the ownership rules over them.
//!
//! The watchers convert Services, Leases and ServiceL2Status objects into
//! these types (see `objects.rs`); everything that decides ownership is here,
//! as pure functions of the store and the time, so that it is tested without
//! an API server.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    sync::Arc,
    time::{Duration, Instant},
};

pub use super::keys::{Key, Keys};

use crate::model::cluster::OwnerRecord;

/// Lease durations the guard believes: client-go's default when unset or
/// not positive; at most an hour (a holder that claims more cannot make a
/// guard wait that long to notice it is gone).
pub const DEFAULT_LEASE: Duration = Duration::from_secs(15);
pub const MAX_LEASE: Duration = Duration::from_secs(3600);

/// A Service of type LoadBalancer that passed the class/label filters.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ServiceInfo {
    /// status.loadBalancer.ingress[].ip, plus spec.externalIPs when asked for.
    pub ips: Vec<IpAddr>,
    /// The `kube-vip.io/leaseName` annotation: `name` or `ns/name`.
    pub kube_vip_lease: Option<String>,
    /// Its latest version could not be decoded: this is the last good one,
    /// and its IPs' claims are not trusted (owned stays owned, foreign is
    /// judged unknown) until a readable version comes.
    pub unreadable: bool,
    /// `externalTrafficPolicy: Local`: only nodes with its endpoints serve
    /// it (a split election of its IP is never settled).
    pub local: bool,
}

/// A Lease as this guard observed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseInfo {
    /// Shared with every claim that names it (one copy per node name).
    pub holder: Option<Arc<str>>,
    pub duration: Duration,
    /// spec.renewTime as written by the holder, kept as a 64-bit digest
    /// ([`renew_digest`]): only ever compared, never interpreted (the
    /// holder's clock is not ours).
    pub renew: Option<u64>,
    /// When *this guard* last saw holder or renewTime change (client-go's
    /// `observedTime`). The lease is live until `observed + duration`.
    pub observed: Instant,
    /// When the API last told us about this Lease (an event, a list or a
    /// GET), changed or not. An expiry counts only once the API has been
    /// asked after the deadline: until then the guard may simply be blind.
    pub checked: Instant,
    /// Its latest version could not be decoded: `holder` is what could
    /// still be read of it (or the last good holder). Neither live nor
    /// expired as far as the guard can tell: its claims are not trusted
    /// (the holder keeps an uncertain claim) and it has no deadline.
    pub unreadable: bool,
}

/// What a Lease says at a moment, as far as this guard can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseState<'a> {
    /// Renewed within its duration.
    Live(&'a Arc<str>),
    /// Its duration passed without a renewal we saw, and the API has not
    /// been heard from since: the holder may have stopped, or we may be
    /// blind (a stuck watch). Not yet a reason to take permission away.
    Unconfirmed(&'a Arc<str>),
    /// The API confirmed, after the deadline, that it was not renewed.
    Expired,
    /// No holder.
    Vacant,
    /// Its latest version could not be read; the holder as far as known.
    Unreadable(Option<&'a Arc<str>>),
}

impl LeaseInfo {
    pub fn deadline(&self) -> Instant {
        self.observed + self.duration
    }

    pub fn state(&self, now: Instant) -> LeaseState<'_> {
        if self.unreadable {
            return LeaseState::Unreadable(self.holder.as_ref().filter(|h| !h.is_empty()));
        }
        let Some(holder) = self.holder.as_ref().filter(|h| !h.is_empty()) else {
            return LeaseState::Vacant;
        };
        if now < self.deadline() {
            LeaseState::Live(holder)
        } else if self.checked >= self.deadline() {
            LeaseState::Expired
        } else {
            LeaseState::Unconfirmed(holder)
        }
    }
}

/// A MetalLB ServiceL2Status: `node` announces the Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct L2Status {
    pub node: Option<Arc<str>>,
    pub service: Key,
    /// Its latest version could not be decoded: this is the last good one,
    /// not trusted (the node keeps an uncertain claim).
    pub unreadable: bool,
}

/// Which announcer's records say who owns a Service's IPs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Announcer {
    /// Lease `cilium-l2announce-<svc-ns>-<svc-name>` in this namespace.
    Cilium { namespace: String },
    /// Lease `kubevip-<svc-name>` in the Service's namespace, or the one the
    /// `kube-vip.io/leaseName` annotation names.
    KubeVipPerService,
    /// One Lease whose holder announces every Service.
    KubeVipGlobal { lease: Key },
    /// ServiceL2Status objects in this namespace.
    MetalLb { namespace: String },
}

impl Announcer {
    pub fn name(&self) -> &'static str {
        match self {
            Announcer::Cilium { .. } => "cilium",
            Announcer::KubeVipPerService | Announcer::KubeVipGlobal { .. } => "kube-vip",
            Announcer::MetalLb { .. } => "metallb",
        }
    }
}

#[derive(Debug, Default, Clone)]
/// The indexes behind the incremental claims (kept by `index.rs`).
pub struct Index {
    pub(super) announcers: Vec<Announcer>,
    /// `--settle-shared-ips`: a split election of Services that are all
    /// `externalTrafficPolicy: Cluster` is settled on one node.
    pub(super) settle_shared: bool,
    /// LB IP -> the Services that carry it (an IP can be shared).
    pub(super) ip_services: BTreeMap<IpAddr, Keys>,
    /// Lease -> the Services it decides (for the announcers in use). Its
    /// keys are the Leases in use.
    pub(super) lease_services: BTreeMap<Key, Keys>,
    /// Service -> the ServiceL2Status objects naming it.
    pub(super) l2_of_service: BTreeMap<Key, Keys>,
    /// Lease deadline -> Leases.
    pub(super) deadlines: BTreeMap<Instant, Keys>,
    /// Holders of Leases in use and announcing nodes, counted.
    pub(super) holders: BTreeMap<Arc<str>, usize>,
    /// Bumped whenever the set of `holders` changes.
    pub(super) holders_version: u64,
    /// Durations of the Leases in use, counted.
    pub(super) durations: BTreeMap<Duration, usize>,
    pub(super) dirty_services: BTreeSet<Key>,
    pub(super) dirty_ips: BTreeSet<IpAddr>,
    /// Every LB IP's claim as of `evaluated`.
    pub(super) claims: BTreeMap<IpAddr, Arc<OwnerRecord>>,
    pub(super) evaluated: Option<Instant>,
}

/// The objects the feed delivered, and the claims derived from them, kept
/// incrementally (`index.rs`): read the maps freely, change them only
/// through the methods, which keep the indexes and mark what to re-derive.
#[derive(Debug, Default, Clone)]
pub struct Store {
    pub services: BTreeMap<Key, ServiceInfo>,
    pub leases: BTreeMap<Key, LeaseInfo>,
    pub l2: BTreeMap<Key, L2Status>,
    pub(super) idx: Index,
    /// Node names, one copy each, shared by Leases, statuses and claims.
    pub(super) names: BTreeSet<Arc<str>>,
}

/// A digest of a renewTime for comparisons (keyed per process, so that no
/// one can make two renewTimes collide on purpose).
pub fn renew_digest(renew: &str) -> u64 {
    use std::hash::BuildHasher as _;
    static KEY: std::sync::OnceLock<std::collections::hash_map::RandomState> =
        std::sync::OnceLock::new();
    KEY.get_or_init(Default::default).hash_one(renew)
}

impl Store {
    /// Record a Lease as seen now. Keeps the observation time when neither
    /// holder nor renewTime changed (a resync or an unrelated field update).
    /// Returns whether holder or renewTime changed (a renewal we had not
    /// seen), for an existing Lease.
    pub fn upsert_lease(
        &mut self,
        key: Key,
        holder: Option<String>,
        duration: Duration,
        renew: Option<String>,
        now: Instant,
    ) -> bool {
        let holder = holder.map(|h| self.intern(h));
        let renew = renew.as_deref().map(renew_digest);
        let (observed, renewed) = match self.leases.get(&key) {
            Some(old) if old.holder == holder && old.renew == renew => (old.observed, false),
            Some(_) => (now, true),
            None => (now, false),
        };
        let info = LeaseInfo {
            holder,
            duration,
            renew,
            observed,
            checked: now,
            unreadable: false,
        };
        if let Some(info) = self.renew_in_place(&key, info, now) {
            self.set_lease(key, Some(info));
        }
        renewed
    }

    /// A Lease whose latest version could not be decoded: `holder` is what
    /// could be read of it (else the last good holder stays).
    pub fn lease_unreadable(&mut self, key: Key, holder: Option<String>, now: Instant) {
        let holder = holder.map(|h| self.intern(h));
        let info = match self.leases.get(&key) {
            Some(old) => LeaseInfo {
                holder: holder.or_else(|| old.holder.clone()),
                unreadable: true,
                checked: now,
                ..old.clone()
            },
            None => LeaseInfo {
                holder,
                duration: DEFAULT_LEASE,
                renew: None,
                observed: now,
                checked: now,
                unreadable: true,
            },
        };
        self.set_lease(key, Some(info));
    }

    /// The longest duration of the Leases in use (the feed's default
    /// staleness threshold).
    pub fn max_lease_duration(&self) -> Option<Duration> {
        self.idx.durations.keys().next_back().copied()
    }

    /// The earliest future moment at which a lease reaches its deadline:
    /// when the ownership must be looked at again even if nothing else
    /// happens.
    pub fn next_expiry(&self, now: Instant) -> Option<Instant> {
        use std::ops::Bound::{Excluded, Unbounded};
        let mut after = self.idx.deadlines.range((Excluded(now), Unbounded));
        after.next().map(|(t, _)| *t)
    }

    /// Leases some Service depends on that passed their deadline without
    /// the API being heard from since: each must be confirmed with a GET
    /// before it changes anything. With the deadline (since when). Only
    /// Leases past their deadline are looked at.
    pub fn unconfirmed(&self, now: Instant) -> Vec<(Key, Instant)> {
        let mut out: Vec<(Key, Instant)> = (self.idx.deadlines.range(..=now))
            .flat_map(|(_, keys)| keys.iter())
            .filter(|k| self.idx.lease_services.contains_key(*k))
            .filter_map(|k| {
                let l = self.leases.get(k)?;
                matches!(l.state(now), LeaseState::Unconfirmed(_))
                    .then(|| (k.clone(), l.deadline()))
            })
            .collect();
        out.sort();
        out
    }

    /// The Lease that decides `svc` for a Lease-based announcer.
    pub(super) fn lease_key(svc: &Key, info: &ServiceInfo, a: &Announcer) -> Option<Key> {
        match a {
            Announcer::Cilium { namespace } => Some(Key::new(
                namespace.clone(),
                format!("cilium-l2announce-{}-{}", svc.ns, svc.name),
            )),
            Announcer::KubeVipPerService => Some(match info.kube_vip_lease.as_deref() {
                Some(n) => match n.split_once('/') {
                    Some((ns, name)) => Key::new(ns, name),
                    None => Key::new(svc.ns.clone(), n),
                },
                None => Key::new(svc.ns.clone(), format!("kubevip-{}", svc.name)),
            }),
            Announcer::KubeVipGlobal { lease } => Some(lease.clone()),
            Announcer::MetalLb { .. } => None,
        }
    }

    /// The owner of one Service according to one announcer: Some(claim) if
    /// that announcer has a record for it (an empty or expired one too).
    fn service_claim(
        &self,
        svc: &Key,
        info: &ServiceInfo,
        a: &Announcer,
        now: Instant,
    ) -> Option<OwnerRecord> {
        let lease_claim = |key: Key| {
            let lease = self.leases.get(&key)?;
            Some(match lease.state(now) {
                LeaseState::Live(h) => OwnerRecord {
                    owner: Some(h.clone()),
                    why: format!("Lease {key} held by {h}").into(),
                    certain: true,
                    service: None,
                    split: None,
                },
                LeaseState::Unconfirmed(h) => OwnerRecord {
                    owner: Some(h.clone()),
                    why: format!(
                        "Lease {key} held by {h}, not renewed within its duration as far as \
                         this guard saw; waiting for the API to confirm"
                    )
                    .into(),
                    certain: false,
                    service: None,
                    split: None,
                },
                LeaseState::Expired => OwnerRecord {
                    owner: None,
                    why: format!(
                        "Lease {key} expired (holder {} stopped renewing)",
                        lease.holder.as_deref().unwrap_or("")
                    )
                    .into(),
                    certain: true,
                    service: None,
                    split: None,
                },
                LeaseState::Vacant => OwnerRecord {
                    owner: None,
                    why: format!("Lease {key} has no holder").into(),
                    certain: true,
                    service: None,
                    split: None,
                },
                LeaseState::Unreadable(h) => OwnerRecord {
                    owner: h.cloned(),
                    why: format!(
                        "Lease {key} cannot be decoded (holder as last read: {}); not trusted",
                        h.map_or("none", |h| &**h)
                    )
                    .into(),
                    certain: false,
                    service: None,
                    split: None,
                },
            })
        };
        match a {
            Announcer::Cilium { .. }
            | Announcer::KubeVipPerService
            | Announcer::KubeVipGlobal { .. } => lease_claim(Self::lease_key(svc, info, a)?),
            Announcer::MetalLb { namespace } => self.metallb_claim(svc, namespace),
        }
    }

    /// MetalLB's claim on one Service: the node its ServiceL2Status objects
    /// (in `namespace`) name, if they agree.
    fn metallb_claim(&self, svc: &Key, namespace: &str) -> Option<OwnerRecord> {
        let statuses = (self.idx.l2_of_service.get(svc))
            .into_iter()
            .flatten()
            .filter(|k| &*k.ns == namespace)
            .filter_map(|k| self.l2.get(k));
        let (mut nodes, mut readable) = (BTreeSet::<&Arc<str>>::new(), true);
        for s in statuses {
            readable &= !s.unreadable;
            nodes.extend(s.node.as_ref());
        }
        let n = *nodes.first()?;
        if nodes.len() > 1 {
            let all: Vec<&str> = nodes.iter().map(|n| &***n).collect();
            return Some(OwnerRecord {
                owner: None,
                why: format!(
                    "ServiceL2Status for {svc} names several nodes ({}): owner unknown",
                    all.join(", ")
                )
                .into(),
                certain: readable,
                service: None,
                split: None,
            });
        }
        let why = if readable {
            format!("ServiceL2Status for {svc}: node {n}")
        } else {
            format!("ServiceL2Status for {svc}: node {n} as last read; it cannot be decoded now, not trusted")
        };
        Some(OwnerRecord {
            owner: Some(n.clone()),
            why: why.into(),
            certain: readable,
            service: None,
            split: None,
        })
    }

    /// The claim of one Service: the first announcer (in the order given)
    /// that has a record for it decides.
    pub(super) fn decision(
        &self,
        svc: &Key,
        info: &ServiceInfo,
        announcers: &[Announcer],
        now: Instant,
    ) -> OwnerRecord {
        let mut claim = announcers
            .iter()
            .find_map(|a| self.service_claim(svc, info, a, now))
            .unwrap_or_else(|| OwnerRecord {
                owner: None,
                why: format!("Service {svc}: no announcer record").into(),
                certain: true,
                service: None,
                split: None,
            });
        claim.service = Some(crate::model::cluster::ServiceRef {
            namespace: svc.ns.clone(),
            name: svc.name.clone(),
        });
        if info.unreadable {
            claim.certain = false;
            claim.why = format!(
                "{}; Service {svc} cannot be decoded now (its last good version is used), not trusted",
                claim.why
            ).into();
        }
        claim
    }

    /// Ownership of every LB IP the Services carry, derived from scratch
    /// (the reference the incremental claims are tested against). For each
    /// Service the first announcer (in the order given) that has a record
    /// decides; an IP shared by Services whose owners disagree has no owner.
    #[cfg(test)]
    pub fn ownership(
        &self,
        announcers: &[Announcer],
        now: Instant,
    ) -> BTreeMap<IpAddr, OwnerRecord> {
        let mut claims: BTreeMap<IpAddr, Vec<(OwnerRecord, bool)>> = BTreeMap::new();
        for (svc, info) in &self.services {
            let claim = self.decision(svc, info, announcers, now);
            // An IP listed twice (an ingress IP that is an external IP too)
            // counts once per Service.
            for ip in info.ips.iter().collect::<BTreeSet<_>>() {
                claims
                    .entry(*ip)
                    .or_default()
                    .push((claim.clone(), info.local));
            }
        }
        (claims.into_iter())
            .filter_map(|(ip, c)| Some((ip, Self::fold(c, self.idx.settle_shared)?)))
            .collect()
    }

    /// Changes whenever [`Store::named_nodes`] does.
    pub fn holders_version(&self) -> u64 {
        self.idx.holders_version
    }

    /// Every holder of a Lease in use and every announcing node (to spot a
    /// node name that matches none of them).
    pub fn named_nodes(&self) -> BTreeSet<&str> {
        self.idx.holders.keys().map(|h| &**h).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn svc(m: &mut Store, ns: &str, name: &str, ips: &[&str]) {
        m.set_service(
            Key::new(ns, name),
            Some(ServiceInfo {
                ips: ips.iter().map(|s| ip(s)).collect(),
                kube_vip_lease: None,
                unreadable: false,
                local: false,
            }),
        );
    }

    const SEC: Duration = Duration::from_secs(1);

    #[test]
    fn cilium_lease_gives_owner_until_it_stops_being_renewed() {
        let t0 = Instant::now();
        let cilium = [Announcer::Cilium {
            namespace: "kube-system".into(),
        }];
        let mut m = Store::new(cilium.to_vec());
        svc(&mut m, "default", "web", &["198.51.100.10", "fd00::10"]);
        let key = Key::new("kube-system", "cilium-l2announce-default-web");
        m.upsert_lease(
            key.clone(),
            Some("node-a".into()),
            15 * SEC,
            Some("r1".into()),
            t0,
        );
        let o = m.ownership(&cilium, t0 + 5 * SEC);
        assert_eq!(o[&ip("198.51.100.10")].owner.as_deref(), Some("node-a"));
        assert_eq!(
            o[&ip("fd00::10")].owner.as_deref(),
            Some("node-a"),
            "IPv6 ingress kept for NDP"
        );
        // Renewed at t0+10 (renewTime changed): live until t0+25.
        m.upsert_lease(
            key.clone(),
            Some("node-a".into()),
            15 * SEC,
            Some("r2".into()),
            t0 + 10 * SEC,
        );
        assert_eq!(
            m.ownership(&cilium, t0 + 20 * SEC)[&ip("198.51.100.10")]
                .owner
                .as_deref(),
            Some("node-a")
        );
        // A resync with the same renewTime does not extend it.
        m.upsert_lease(
            key.clone(),
            Some("node-a".into()),
            15 * SEC,
            Some("r2".into()),
            t0 + 24 * SEC,
        );
        // Past the deadline (25 s) with the API last heard at 24 s: the
        // holder keeps an uncertain claim until the API confirms.
        let o = m.ownership(&cilium, t0 + 26 * SEC);
        let c = &o[&ip("198.51.100.10")];
        assert_eq!((c.owner.as_deref(), c.certain), (Some("node-a"), false));
        assert_eq!(
            m.unconfirmed(t0 + 26 * SEC),
            vec![(key.clone(), t0 + 25 * SEC)]
        );
        // The API, asked after the deadline, shows no renewal: expired.
        m.upsert_lease(
            key.clone(),
            Some("node-a".into()),
            15 * SEC,
            Some("r2".into()),
            t0 + 26 * SEC,
        );
        let o = m.ownership(&cilium, t0 + 26 * SEC);
        assert_eq!(
            o[&ip("198.51.100.10")].owner,
            None,
            "expired: unknown, not foreign"
        );
        assert!(o[&ip("198.51.100.10")].certain);
        assert!(o[&ip("198.51.100.10")].why.contains("expired"), "{:?}", o);
        assert!(m.unconfirmed(t0 + 26 * SEC).is_empty());
        assert_eq!(m.next_expiry(t0 + 26 * SEC), None);
        assert_eq!(m.next_expiry(t0 + 11 * SEC), Some(t0 + 25 * SEC));
    }

    #[test]
    fn holderless_lease_means_no_owner() {
        let t0 = Instant::now();
        let mut m = Store::default();
        svc(&mut m, "default", "web", &["198.51.100.10"]);
        m.upsert_lease(
            Key::new("kube-system", "cilium-l2announce-default-web"),
            Some(String::new()),
            15 * SEC,
            None,
            t0,
        );
        let o = m.ownership(
            &[Announcer::Cilium {
                namespace: "kube-system".into(),
            }],
            t0,
        );
        assert_eq!(o[&ip("198.51.100.10")].owner, None);
        assert!(o[&ip("198.51.100.10")].why.contains("no holder"));
    }

    #[test]
    fn kube_vip_lease_names() {
        let t0 = Instant::now();
        let mut m = Store::default();
        svc(&mut m, "shop", "checkout", &["198.51.100.20"]);
        m.set_service(
            Key::new("shop", "cart"),
            Some(ServiceInfo {
                ips: vec![ip("198.51.100.21")],
                kube_vip_lease: Some("custom".into()),
                unreadable: false,
                local: false,
            }),
        );
        m.set_service(
            Key::new("shop", "pay"),
            Some(ServiceInfo {
                ips: vec![ip("198.51.100.22")],
                kube_vip_lease: Some("infra/pay-lock".into()),
                unreadable: false,
                local: false,
            }),
        );
        m.upsert_lease(
            Key::new("shop", "kubevip-checkout"),
            Some("n1".into()),
            15 * SEC,
            None,
            t0,
        );
        m.upsert_lease(
            Key::new("shop", "custom"),
            Some("n2".into()),
            15 * SEC,
            None,
            t0,
        );
        m.upsert_lease(
            Key::new("infra", "pay-lock"),
            Some("n3".into()),
            15 * SEC,
            None,
            t0,
        );
        let o = m.ownership(&[Announcer::KubeVipPerService], t0);
        assert_eq!(o[&ip("198.51.100.20")].owner.as_deref(), Some("n1"));
        assert_eq!(o[&ip("198.51.100.21")].owner.as_deref(), Some("n2"));
        assert_eq!(o[&ip("198.51.100.22")].owner.as_deref(), Some("n3"));
        // Global mode: one lease announces all.
        m.upsert_lease(
            Key::new("kube-system", "plndr-svcs-lock"),
            Some("n9".into()),
            15 * SEC,
            None,
            t0,
        );
        let o = m.ownership(
            &[Announcer::KubeVipGlobal {
                lease: Key::new("kube-system", "plndr-svcs-lock"),
            }],
            t0,
        );
        assert!(o.values().all(|c| c.owner.as_deref() == Some("n9")));
    }

    #[test]
    fn metallb_l2status_and_conflicts() {
        let t0 = Instant::now();
        let mut m = Store::default();
        svc(&mut m, "default", "web", &["198.51.100.30"]);
        let mlb = [Announcer::MetalLb {
            namespace: "metallb-system".into(),
        }];
        assert_eq!(
            m.ownership(&mlb, t0)[&ip("198.51.100.30")].owner,
            None,
            "no status yet"
        );
        m.set_l2(
            Key::new("metallb-system", "l2-abc"),
            Some(L2Status {
                node: Some("n1".into()),
                service: Key::new("default", "web"),
                unreadable: false,
            }),
        );
        assert_eq!(
            m.ownership(&mlb, t0)[&ip("198.51.100.30")].owner.as_deref(),
            Some("n1")
        );
        // Status objects in another namespace are not MetalLB's.
        m.set_l2(
            Key::new("other", "l2-x"),
            Some(L2Status {
                node: Some("n7".into()),
                service: Key::new("default", "web"),
                unreadable: false,
            }),
        );
        assert_eq!(
            m.ownership(&mlb, t0)[&ip("198.51.100.30")].owner.as_deref(),
            Some("n1")
        );
        // Two speakers claim it: unknown, never one of them picked at random.
        m.set_l2(
            Key::new("metallb-system", "l2-def"),
            Some(L2Status {
                node: Some("n2".into()),
                service: Key::new("default", "web"),
                unreadable: false,
            }),
        );
        let c = &m.ownership(&mlb, t0)[&ip("198.51.100.30")];
        assert_eq!(c.owner, None);
        assert!(c.why.contains("n1, n2"), "{c:?}");
    }

    #[test]
    fn shared_ip_with_disagreeing_owners_has_none() {
        let t0 = Instant::now();
        let mut m = Store::default();
        svc(&mut m, "a", "tcp", &["198.51.100.40"]);
        svc(&mut m, "a", "udp", &["198.51.100.40"]);
        let mlb = [Announcer::MetalLb {
            namespace: "metallb-system".into(),
        }];
        m.set_l2(
            Key::new("metallb-system", "l2-1"),
            Some(L2Status {
                node: Some("n1".into()),
                service: Key::new("a", "tcp"),
                unreadable: false,
            }),
        );
        m.set_l2(
            Key::new("metallb-system", "l2-2"),
            Some(L2Status {
                node: Some("n1".into()),
                service: Key::new("a", "udp"),
                unreadable: false,
            }),
        );
        assert_eq!(
            m.ownership(&mlb, t0)[&ip("198.51.100.40")].owner.as_deref(),
            Some("n1")
        );
        m.set_l2(
            Key::new("metallb-system", "l2-2"),
            Some(L2Status {
                node: Some("n2".into()),
                service: Key::new("a", "udp"),
                unreadable: false,
            }),
        );
        let r = &m.ownership(&mlb, t0)[&ip("198.51.100.40")];
        assert_eq!(r.owner, None);
        // A split election, named: each Service with the node it names.
        let split = r.split.as_deref().expect("a split election");
        assert_eq!(split.holders(), ["n1", "n2"]);
        let names: Vec<&str> = split.services.iter().map(|s| &*s.service).collect();
        assert_eq!(names, ["a/tcp", "a/udp"]);
        assert_eq!(split.settled_on, None);
        assert!(
            split.settle.contains("--settle-shared-ips is off"),
            "{}",
            split.settle
        );

        // Settled, on the node of the first Service by namespace/name,
        // only while every Service is externalTrafficPolicy: Cluster.
        m.idx.settle_shared = true;
        let r = &m.ownership(&mlb, t0)[&ip("198.51.100.40")];
        assert_eq!(r.owner.as_deref(), Some("n1"), "{}", r.why);
        assert_eq!(
            r.split.as_deref().and_then(|s| s.settled_on.as_deref()),
            Some("n1")
        );
        let info = m.services.get(&Key::new("a", "udp")).cloned().unwrap();
        m.set_service(
            Key::new("a", "udp"),
            Some(ServiceInfo {
                local: true,
                ..info
            }),
        );
        let r = &m.ownership(&mlb, t0)[&ip("198.51.100.40")];
        assert_eq!(r.owner, None, "never settled with a Local Service");
        let split = r.split.as_deref().unwrap();
        assert!(
            split
                .settle
                .contains("a/udp is externalTrafficPolicy: Local"),
            "{}",
            split.settle
        );

        // One record without a holder is no split (one node announces).
        m.set_l2(Key::new("metallb-system", "l2-2"), None);
        let r = &m.ownership(&mlb, t0)[&ip("198.51.100.40")];
        assert!(r.split.is_none());
    }

    #[test]
    fn first_announcer_with_a_record_decides() {
        let t0 = Instant::now();
        let both = [
            Announcer::Cilium {
                namespace: "kube-system".into(),
            },
            Announcer::MetalLb {
                namespace: "metallb-system".into(),
            },
        ];
        let mut m = Store::new(both.to_vec());
        svc(&mut m, "default", "web", &["198.51.100.50"]);
        m.set_l2(
            Key::new("metallb-system", "l2-1"),
            Some(L2Status {
                node: Some("n2".into()),
                service: Key::new("default", "web"),
                unreadable: false,
            }),
        );
        assert_eq!(
            m.ownership(&both, t0)[&ip("198.51.100.50")]
                .owner
                .as_deref(),
            Some("n2"),
            "no Cilium lease: MetalLB decides"
        );
        m.upsert_lease(
            Key::new("kube-system", "cilium-l2announce-default-web"),
            Some("n1".into()),
            15 * SEC,
            None,
            t0,
        );
        assert_eq!(
            m.ownership(&both, t0)[&ip("198.51.100.50")]
                .owner
                .as_deref(),
            Some("n1")
        );
        assert_eq!(m.named_nodes(), BTreeSet::from(["n1", "n2"]));
        // A Lease no Service depends on (a controller's leader election) is not counted.
        m.upsert_lease(
            Key::new("kube-system", "some-controller"),
            Some("pod-x".into()),
            60 * SEC,
            None,
            t0,
        );
        assert_eq!(m.named_nodes(), BTreeSet::from(["n1", "n2"]));
        assert_eq!(m.max_lease_duration(), Some(15 * SEC));
    }
}
