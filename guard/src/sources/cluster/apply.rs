//! A stream's events into the store: one object at a time as the watch
//! delivers them, a relist swapped in whole at its end (until then the last
//! known state holds: nothing vanishes because a list is in progress).
//!
//! An object that cannot be decoded is never a reason to take permission
//! away, nor to trust what can no longer be checked:
//! - a Lease keeps its Services' claims with the holder as far as it can
//!   still be read (or as last read), uncertain: the owner keeps its
//!   permission, another node's claim is judged unknown, for those IPs only;
//! - a Service or a ServiceL2Status keeps its last good version, uncertain
//!   the same way; one never read is not guarded (its frames pass) until a
//!   readable version comes;
//! - a relist never takes an unreadable object for a deleted one.

use std::{collections::BTreeMap, time::Instant};

use super::per_stream::StreamId;
use super::{
    decode::{self, Bad, Obj, Object},
    feed::{Feed, Read, Relist},
    objects::{self, LeaseFields},
    store::{Key, L2Status, ServiceInfo},
    stream::{Event, Stream, Update},
};

fn key_of_bad(b: &Bad) -> Option<Key> {
    Some(objects::key(
        b.namespace.as_deref().unwrap_or_default(),
        b.name.as_deref()?,
    ))
}

/// What one kind of object needs of the common path (`Feed::event`):
/// how it is read into what the store keeps, whether the store needs it,
/// how it is set, removed, or kept unreadable, and its relist's buffer.
trait Kind {
    /// As the stream decodes it.
    type Raw: Object;
    /// As the store keeps it.
    type Info: Clone;
    /// What the store keeps of `raw`; None: nothing (a Service that is not
    /// of type LoadBalancer, a status that names no node): gone.
    fn info(f: &Feed, raw: &Self::Raw) -> Option<Self::Info>;
    /// The store has it, or needs it for what it has (`info`: as read,
    /// None when unreadable).
    fn needed(f: &Feed, k: &Key, info: Option<&Self::Info>) -> bool;
    fn set(f: &mut Feed, k: Key, info: Self::Info, now: Instant);
    fn remove(f: &mut Feed, k: &Key);
    /// Its latest version cannot be read: what was read before stays, not
    /// trusted.
    fn unreadable(f: &mut Feed, k: Key, b: &Bad, now: Instant);
    /// The keys a relist of `stream` replaces (gone unless listed).
    fn owned(f: &Feed, stream: StreamId) -> Vec<Key>;
    fn relist() -> Relist;
    fn listed(r: &mut Relist) -> Option<&mut BTreeMap<Key, Read<Self::Info>>>;
    fn take(r: Relist) -> Option<BTreeMap<Key, Read<Self::Info>>>;
}

struct Services;
struct Leases;
struct Statuses;

impl Kind for Services {
    type Raw = decode::Service;
    type Info = ServiceInfo;
    fn info(f: &Feed, raw: &decode::Service) -> Option<ServiceInfo> {
        objects::service(raw, &f.cfg.filter)
    }
    fn needed(f: &Feed, k: &Key, _: Option<&ServiceInfo>) -> bool {
        f.store.services.contains_key(k)
    }
    fn set(f: &mut Feed, k: Key, info: ServiceInfo, _: Instant) {
        f.store.set_service(k, Some(info));
    }
    fn remove(f: &mut Feed, k: &Key) {
        f.store.set_service(k.clone(), None);
    }
    fn unreadable(f: &mut Feed, k: Key, _: &Bad, _: Instant) {
        if let Some(old) = f.store.services.get(&k).filter(|s| !s.unreadable) {
            let info = ServiceInfo {
                unreadable: true,
                ..old.clone()
            };
            f.store.set_service(k, Some(info));
        }
    }
    fn owned(f: &Feed, _: StreamId) -> Vec<Key> {
        f.store.services.keys().cloned().collect()
    }
    fn relist() -> Relist {
        Relist::Services(BTreeMap::new())
    }
    fn listed(r: &mut Relist) -> Option<&mut BTreeMap<Key, Read<ServiceInfo>>> {
        match r {
            Relist::Services(m) => Some(m),
            _ => None,
        }
    }
    fn take(r: Relist) -> Option<BTreeMap<Key, Read<ServiceInfo>>> {
        match r {
            Relist::Services(m) => Some(m),
            _ => None,
        }
    }
}

impl Kind for Leases {
    type Raw = decode::Lease;
    type Info = LeaseFields;
    fn info(_: &Feed, raw: &decode::Lease) -> Option<LeaseFields> {
        Some(objects::lease(raw))
    }
    fn needed(f: &Feed, k: &Key, _: Option<&LeaseFields>) -> bool {
        f.store.leases.contains_key(k) || f.store.idx.lease_services.contains_key(k)
    }
    fn set(f: &mut Feed, k: Key, info: LeaseFields, now: Instant) {
        // upsert_lease keeps the observation time of a Lease whose holder
        // and renewTime did not change: a relist never extends a lease
        // that stopped being renewed.
        f.upsert_lease(k, info, now);
    }
    fn remove(f: &mut Feed, k: &Key) {
        f.clamp_warned.remove(k);
        f.store.remove_lease(k);
    }
    fn unreadable(f: &mut Feed, k: Key, b: &Bad, now: Instant) {
        let holder = objects::holder(b.holder.as_deref());
        f.store.lease_unreadable(k, holder, now);
    }
    fn owned(f: &Feed, _: StreamId) -> Vec<Key> {
        f.store.leases.keys().cloned().collect()
    }
    fn relist() -> Relist {
        Relist::Leases(BTreeMap::new())
    }
    fn listed(r: &mut Relist) -> Option<&mut BTreeMap<Key, Read<LeaseFields>>> {
        match r {
            Relist::Leases(m) => Some(m),
            _ => None,
        }
    }
    fn take(r: Relist) -> Option<BTreeMap<Key, Read<LeaseFields>>> {
        match r {
            Relist::Leases(m) => Some(m),
            _ => None,
        }
    }
}

impl Kind for Statuses {
    type Raw = decode::ServiceL2Status;
    type Info = L2Status;
    fn info(_: &Feed, raw: &decode::ServiceL2Status) -> Option<L2Status> {
        objects::l2status(raw)
    }
    fn needed(f: &Feed, k: &Key, info: Option<&L2Status>) -> bool {
        let names_known = info.is_some_and(|s| f.store.services.contains_key(&s.service));
        f.store.l2.contains_key(k) || names_known
    }
    fn set(f: &mut Feed, k: Key, info: L2Status, _: Instant) {
        f.store.set_l2(k, Some(info));
    }
    fn remove(f: &mut Feed, k: &Key) {
        f.store.set_l2(k.clone(), None);
    }
    fn unreadable(f: &mut Feed, k: Key, _: &Bad, _: Instant) {
        if let Some(old) = f.store.l2.get(&k).filter(|s| !s.unreadable) {
            let s = L2Status {
                unreadable: true,
                ..old.clone()
            };
            f.store.set_l2(k, Some(s));
        }
    }
    /// A status stream owns its namespace's entries only.
    fn owned(f: &Feed, stream: StreamId) -> Vec<Key> {
        let Some(Stream::L2 { namespace }) = f.streams.get(stream).map(|s| &s.kind) else {
            return Vec::new();
        };
        (f.store.l2.keys())
            .filter(|k| *k.ns == **namespace)
            .cloned()
            .collect()
    }
    fn relist() -> Relist {
        Relist::L2(BTreeMap::new())
    }
    fn listed(r: &mut Relist) -> Option<&mut BTreeMap<Key, Read<L2Status>>> {
        match r {
            Relist::L2(m) => Some(m),
            _ => None,
        }
    }
    fn take(r: Relist) -> Option<BTreeMap<Key, Read<L2Status>>> {
        match r {
            Relist::L2(m) => Some(m),
            _ => None,
        }
    }
}

impl Feed {
    /// An event of `stream`: into the store (at once for a change, at the
    /// end of a relist for a listed object).
    pub(super) fn apply(&mut self, stream: StreamId, upd: Update, now: Instant) {
        let done = match upd {
            Update::Svc(ev) => self.event::<Services>(stream, *ev, now),
            Update::Lease(ev) => self.event::<Leases>(stream, *ev, now),
            Update::L2(ev) => self.event::<Statuses>(stream, *ev, now),
        };
        if done {
            self.streams[stream].health.synced = true;
            // The relist's pages, decoded and dropped, would stay resident.
            crate::datapath::sys::release_free();
        }
    }

    /// Whether to take in an object (`known`: the store has it, or needs
    /// it for what it has). Under memory pressure, after the first sync, a
    /// new one is not: counted, logged once per stream, and the stream is
    /// relisted once the pressure is gone. Nothing known is ever dropped.
    fn admit(&mut self, stream: StreamId, known: bool) -> bool {
        if known || !self.streams[stream].health.synced || !self.ops.under_memory_pressure() {
            return true;
        }
        self.ops.feed_not_admitted(&self.streams[stream].name);
        if self.not_admitted.insert(stream) {
            tracing::warn!(
                stream = %self.streams[stream].name,
                "memory pressure: a new object is not taken in (what is guarded stays guarded); \
                 the stream is relisted once memory is back under the limit"
            );
        }
        false
    }

    /// An object that cannot be decoded, seen by `stream`: counted, logged
    /// once; its key when it has one.
    fn bad(&mut self, stream: StreamId, b: &Bad) -> Option<Key> {
        let key = key_of_bad(b);
        self.undecodable(stream, key.as_ref(), b);
        key
    }

    /// One event of kind `K`; true at the end of a relist.
    fn event<K: Kind>(&mut self, stream: StreamId, ev: Event<K::Raw>, now: Instant) -> bool {
        match ev {
            Event::Listing => self.streams[stream].relist = Some(K::relist()),
            Event::Listed(o) => self.listed::<K>(stream, o),
            Event::ListDone => return self.relisted::<K>(stream, now),
            Event::Apply(Obj::Good(raw)) => {
                let info = K::info(self, &raw);
                let Some(k) = objects::key_of(&Obj::Good(raw)) else {
                    return false;
                };
                match info {
                    // Nothing the store keeps (a Service no longer of type
                    // LoadBalancer): a deletion, never refused.
                    None => {
                        self.readable(stream, &k);
                        K::remove(self, &k);
                    }
                    Some(info) => {
                        let known = K::needed(self, &k, Some(&info));
                        if self.admit(stream, known) {
                            self.readable(stream, &k);
                            K::set(self, k, info, now);
                        }
                    }
                }
            }
            Event::Apply(Obj::Bad(b)) => {
                if let Some(k) = self.bad(stream, &b) {
                    K::unreadable(self, k, &b, now);
                }
            }
            Event::Delete(o) => match objects::key_of(&o) {
                Some(k) => {
                    self.readable(stream, &k);
                    K::remove(self, &k);
                }
                None => {
                    if let Obj::Bad(b) = o {
                        self.bad(stream, &b);
                    }
                }
            },
        }
        false
    }

    /// One object of a relist, into its buffer (if the store takes it).
    fn listed<K: Kind>(&mut self, stream: StreamId, o: Obj<K::Raw>) {
        let item = match o {
            Obj::Good(raw) => {
                // Nothing the store keeps: not listed (so gone at the end).
                let info = K::info(self, &raw);
                (info.zip(objects::key_of(&Obj::Good(raw)))).map(|(i, k)| (k, Read::Good(i)))
            }
            Obj::Bad(b) => self.bad(stream, &b).map(|k| (k, Read::Bad(b))),
        };
        let item = item.filter(|(k, r)| {
            let info = match r {
                Read::Good(i) => Some(i),
                Read::Bad(_) => None,
            };
            let known = K::needed(self, k, info);
            self.admit(stream, known)
        });
        let buffer = self.streams[stream].relist.as_mut().and_then(K::listed);
        if let (Some((k, r)), Some(m)) = (item, buffer) {
            m.insert(k, r);
        }
    }

    /// The end of a relist: what it listed replaces what the stream owned
    /// (an unreadable object keeps its last good version, not trusted).
    fn relisted<K: Kind>(&mut self, stream: StreamId, now: Instant) -> bool {
        let Some(listed) = self.streams[stream].relist.take().and_then(K::take) else {
            return false;
        };
        let gone: Vec<Key> = (K::owned(self, stream).into_iter())
            .filter(|k| !listed.contains_key(k))
            .collect();
        for k in gone {
            self.readable(stream, &k);
            K::remove(self, &k);
        }
        for (k, r) in listed {
            match r {
                Read::Good(info) => {
                    self.readable(stream, &k);
                    K::set(self, k, info, now);
                }
                Read::Bad(b) => K::unreadable(self, k, &b, now),
            }
        }
        true
    }
}
