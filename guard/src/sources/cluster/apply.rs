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

use super::{
    decode::{self, Bad, Obj},
    feed::{Feed, Read, Relist},
    objects,
    store::{Key, L2Status, ServiceInfo},
    stream::{Event, Stream, Update},
};

fn key_of_bad(b: &Bad) -> Option<Key> {
    Some(objects::key(
        b.namespace.as_deref().unwrap_or_default(),
        b.name.as_deref()?,
    ))
}

impl Feed {
    /// An event of `stream`: into the store (at once for a change, at the
    /// end of a relist for a listed object).
    pub(super) fn apply(&mut self, stream: usize, upd: Update, now: Instant) {
        let done = match upd {
            Update::Svc(ev) => self.services(stream, *ev),
            Update::Lease(ev) => self.leases(stream, *ev, now),
            Update::L2(ev) => self.statuses(stream, *ev),
        };
        if done {
            self.streams[stream].health.synced = true;
            // The relist's pages, decoded and dropped, would stay resident.
            crate::datapath::sys::release_free();
        }
    }

    /// The relist `stream` has in progress.
    fn relist(&mut self, stream: usize) -> &mut Option<Relist> {
        &mut self.streams[stream].relist
    }

    /// Whether to take in an object (`known`: the store has it, or needs
    /// it for what it has). Under memory pressure, after the first sync, a
    /// new one is not: counted, logged once per stream, and the stream is
    /// relisted once the pressure is gone. Nothing known is ever dropped.
    fn admit(&mut self, stream: usize, known: bool) -> bool {
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
    fn bad(&mut self, stream: usize, b: &Bad) -> Option<Key> {
        let key = key_of_bad(b);
        self.undecodable(stream, key.as_ref(), b);
        key
    }

    /// A Service event; true at the end of a relist.
    fn services(&mut self, stream: usize, ev: Event<decode::Service>) -> bool {
        let filter = &self.cfg.filter;
        match ev {
            Event::Listing => self.streams[stream].relist = Some(Relist::Services(BTreeMap::new())),
            Event::Listed(o) => {
                let item = match o {
                    Obj::Good(s) => (objects::service(&s, filter))
                        .zip(objects::key_of(&Obj::Good(s)))
                        .map(|(info, k)| (k, Read::Good(info))),
                    Obj::Bad(b) => self.bad(stream, &b).map(|k| (k, Read::Bad(b))),
                };
                let item = item.filter(|(k, _)| {
                    let known = self.store.services.contains_key(k);
                    self.admit(stream, known)
                });
                if let (Some((k, r)), Some(Relist::Services(m))) = (item, self.relist(stream)) {
                    m.insert(k, r);
                }
            }
            Event::ListDone => {
                let Some(Relist::Services(listed)) = self.streams[stream].relist.take() else {
                    return false;
                };
                let gone: Vec<Key> = (self.store.services.keys())
                    .filter(|k| !listed.contains_key(*k))
                    .cloned()
                    .collect();
                for k in gone {
                    self.readable(stream, &k);
                    self.store.set_service(k, None);
                }
                for (k, r) in listed {
                    match r {
                        Read::Good(info) => {
                            self.readable(stream, &k);
                            self.store.set_service(k, Some(info));
                        }
                        Read::Bad(_) => self.service_unreadable(k),
                    }
                }
                return true;
            }
            Event::Apply(Obj::Good(s)) => {
                let info = objects::service(&s, filter);
                if let Some(k) = objects::key_of(&Obj::Good(s)) {
                    let known = self.store.services.contains_key(&k) || info.is_none();
                    if self.admit(stream, known) {
                        self.readable(stream, &k);
                        self.store.set_service(k, info);
                    }
                }
            }
            Event::Apply(Obj::Bad(b)) => {
                if let Some(k) = self.bad(stream, &b) {
                    self.service_unreadable(k);
                }
            }
            Event::Delete(o) => match objects::key_of(&o) {
                Some(k) => {
                    self.readable(stream, &k);
                    self.store.set_service(k, None);
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

    /// A Service's latest version cannot be read: its last good one stays,
    /// not trusted.
    fn service_unreadable(&mut self, k: Key) {
        if let Some(old) = self.store.services.get(&k).filter(|s| !s.unreadable) {
            let info = ServiceInfo {
                unreadable: true,
                ..old.clone()
            };
            self.store.set_service(k, Some(info));
        }
    }

    /// A Lease event; true at the end of a relist.
    fn leases(&mut self, stream: usize, ev: Event<decode::Lease>, now: Instant) -> bool {
        match ev {
            Event::Listing => self.streams[stream].relist = Some(Relist::Leases(BTreeMap::new())),
            Event::Listed(o) => {
                let item = match o {
                    Obj::Good(l) => {
                        let f = objects::lease(&l);
                        objects::key_of(&Obj::Good(l)).map(|k| (k, Read::Good(f)))
                    }
                    Obj::Bad(b) => self.bad(stream, &b).map(|k| (k, Read::Bad(b))),
                };
                let item = item.filter(|(k, _)| {
                    let known = self.lease_needed(k);
                    self.admit(stream, known)
                });
                if let (Some((k, r)), Some(Relist::Leases(m))) = (item, self.relist(stream)) {
                    m.insert(k, r);
                }
            }
            Event::ListDone => {
                let Some(Relist::Leases(listed)) = self.streams[stream].relist.take() else {
                    return false;
                };
                // upsert_lease keeps the observation time of a Lease whose
                // holder and renewTime did not change: a relist never extends
                // a lease that stopped being renewed.
                let gone: Vec<Key> = (self.store.leases.keys())
                    .filter(|k| !listed.contains_key(*k))
                    .cloned()
                    .collect();
                for k in gone {
                    self.readable(stream, &k);
                    self.store.remove_lease(&k);
                }
                self.clamp_warned.retain(|k| listed.contains_key(k));
                for (k, r) in listed {
                    match r {
                        Read::Good(f) => {
                            self.readable(stream, &k);
                            self.upsert_lease(k, f, now);
                        }
                        Read::Bad(b) => {
                            let holder = objects::holder(b.holder.as_deref());
                            self.store.lease_unreadable(k, holder, now);
                        }
                    }
                }
                return true;
            }
            Event::Apply(Obj::Good(l)) => {
                let f = objects::lease(&l);
                if let Some(k) = objects::key_of(&Obj::Good(l)) {
                    let known = self.lease_needed(&k);
                    if self.admit(stream, known) {
                        self.readable(stream, &k);
                        self.upsert_lease(k, f, now);
                    }
                }
            }
            Event::Apply(Obj::Bad(b)) => {
                if let Some(k) = self.bad(stream, &b) {
                    let holder = objects::holder(b.holder.as_deref());
                    self.store.lease_unreadable(k, holder, now);
                }
            }
            Event::Delete(o) => match objects::key_of(&o) {
                Some(k) => {
                    self.readable(stream, &k);
                    self.clamp_warned.remove(&k);
                    self.store.remove_lease(&k);
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

    /// A ServiceL2Status event; true at the end of a relist.
    fn statuses(&mut self, stream: usize, ev: Event<decode::L2Status>) -> bool {
        match ev {
            Event::Listing => self.streams[stream].relist = Some(Relist::L2(BTreeMap::new())),
            Event::Listed(o) => {
                let item = match o {
                    Obj::Good(s) => {
                        let status = objects::l2status(&s);
                        objects::key_of(&Obj::Good(s)).map(|k| (k, Read::Good(status)))
                    }
                    Obj::Bad(b) => self.bad(stream, &b).map(|k| (k, Read::Bad(b))),
                };
                let item = item.filter(|(k, r)| {
                    let known = self.status_needed(k, r);
                    self.admit(stream, known)
                });
                if let (Some((k, r)), Some(Relist::L2(m))) = (item, self.relist(stream)) {
                    m.insert(k, r);
                }
            }
            Event::ListDone => {
                let Some(Relist::L2(listed)) = self.streams[stream].relist.take() else {
                    return false;
                };
                let Some(Stream::L2 { namespace }) =
                    self.streams.get(stream).map(|s| s.kind.clone())
                else {
                    return false;
                };
                // This stream owns its namespace's entries only.
                let gone: Vec<Key> = (self.store.l2.keys())
                    .filter(|k| *k.ns == *namespace && !listed.contains_key(*k))
                    .cloned()
                    .collect();
                for k in gone {
                    self.readable(stream, &k);
                    self.store.set_l2(k, None);
                }
                for (k, r) in listed {
                    match r {
                        Read::Good(s) => {
                            self.readable(stream, &k);
                            self.store.set_l2(k, s);
                        }
                        Read::Bad(_) => self.status_unreadable(k),
                    }
                }
                return true;
            }
            Event::Apply(Obj::Good(s)) => {
                let status = objects::l2status(&s);
                if let Some(k) = objects::key_of(&Obj::Good(s)) {
                    let known = self.status_needed(&k, &Read::Good(status.clone()));
                    if self.admit(stream, known) {
                        self.readable(stream, &k);
                        self.store.set_l2(k, status);
                    }
                }
            }
            Event::Apply(Obj::Bad(b)) => {
                if let Some(k) = self.bad(stream, &b) {
                    self.status_unreadable(k);
                }
            }
            Event::Delete(o) => match objects::key_of(&o) {
                Some(k) => {
                    self.readable(stream, &k);
                    self.store.set_l2(k, None);
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

    /// A Lease the store has, or that a Service it has depends on.
    fn lease_needed(&self, k: &Key) -> bool {
        self.store.leases.contains_key(k) || self.store.idx.lease_services.contains_key(k)
    }

    /// A ServiceL2Status the store has, or that names a Service it has.
    fn status_needed(&self, k: &Key, r: &Read<Option<L2Status>>) -> bool {
        let names_known =
            matches!(r, Read::Good(Some(s)) if self.store.services.contains_key(&s.service));
        self.store.l2.contains_key(k) || names_known
    }

    /// A ServiceL2Status's latest version cannot be read: its last good
    /// one stays, not trusted.
    fn status_unreadable(&mut self, k: Key) {
        if let Some(old) = self.store.l2.get(&k).filter(|s| !s.unreadable) {
            let s = L2Status {
                unreadable: true,
                ..old.clone()
            };
            self.store.set_l2(k, Some(s));
        }
    }
}
