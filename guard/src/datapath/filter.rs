//! The LB filter: one bit per hash of an LB IP in front of `LB_IPS`, so the
//! program proves "not an LB IP" with an inlined array read
//! (`guard_common::lb_filter_slot`); and the census's foreign filter, the
//! same for the LB IPs that are `foreign` here ([`ForeignFilter`]).
//!
//! Safe direction: a missing bit would let frames of that LB IP pass
//! unjudged, so a bit is set **before** its IP enters `LB_IPS` and cleared
//! only **after** the last IP on it has left. A bit set too many (a
//! collision, a failed clear) only costs the frame a hash lookup. The map is
//! not pinned: every load starts it empty and fills it from `LB_IPS` (the
//! reload of pinned maps, or the first write of the view) before anything is
//! attached; if that rebuild fails, the writer forgets what `LB_IPS` holds so
//! that its next write sets every entry's bit again.

use std::collections::{BTreeSet, HashMap, HashSet};

use aya::maps::{Array, Map, MapData, MapError};
use guard_common::{
    clients::{foreign_slot, FOREIGN_FILTER_WORDS},
    lb_filter_slot, IpKey, LB_FILTER_WORDS,
};

/// A bit array in the kernel, one bit per slot (word, bit), with how many
/// keys stand on each bit: a bit goes only when the last key on it leaves.
struct Bits {
    map: Option<Map>,
    counts: HashMap<(u32, u64), u32>,
    /// The words as last written to the kernel (as wanted, for those in
    /// `deferred`).
    words: Vec<u64>,
    /// Words changed but not written yet: Some for a filter written once
    /// per batch of changes ([`Bits::flush`]), None for one written at
    /// every change.
    deferred: Option<BTreeSet<u32>>,
}

impl Bits {
    fn new(map: Option<Map>, words: u32, deferred: bool) -> Self {
        Bits {
            map,
            counts: HashMap::new(),
            words: vec![0; words as usize],
            deferred: deferred.then(BTreeSet::new),
        }
    }

    fn write_word(&mut self, word: u32) -> Result<(), MapError> {
        if let Some(d) = self.deferred.as_mut() {
            d.insert(word);
            return Ok(());
        }
        self.write_now(word)
    }

    fn write_now(&mut self, word: u32) -> Result<(), MapError> {
        let Some(map) = self.map.as_mut() else {
            return Ok(());
        };
        let mut array: Array<&mut MapData, u64> = Array::try_from(map)?;
        array.set(word, self.words[word as usize], 0)
    }

    /// One more key on `slot`: its bit is set in the kernel, or the error
    /// says why not (and the key is not counted).
    fn add(&mut self, slot: (u32, u64)) -> Result<(), MapError> {
        let (word, bit) = slot;
        *self.counts.entry(slot).or_default() += 1;
        if self.words[word as usize] & bit != 0 {
            return Ok(());
        }
        self.words[word as usize] |= bit;
        if let Err(e) = self.write_word(word) {
            self.words[word as usize] &= !bit;
            self.remove(slot);
            return Err(e);
        }
        Ok(())
    }

    /// One key fewer on `slot`; its bit is cleared with the last one.
    fn remove(&mut self, slot: (u32, u64)) {
        let (word, bit) = slot;
        let Some(n) = self.counts.get_mut(&slot) else {
            return;
        };
        *n -= 1;
        if *n > 0 {
            return;
        }
        self.counts.remove(&slot);
        if self.words[word as usize] & bit == 0 {
            return;
        }
        self.words[word as usize] &= !bit;
        if self.write_word(word).is_err() {
            // Left set in the kernel: harmless (a hash lookup more); keep
            // our record true to the kernel's.
            self.words[word as usize] |= bit;
        }
    }

    /// Write the words changed since the last flush, once each; a word that
    /// fails stays to be written at the next.
    fn flush(&mut self) -> Result<(), MapError> {
        let Some(dirty) = self.deferred.take() else {
            return Ok(());
        };
        let mut left = BTreeSet::new();
        let mut result = Ok(());
        for word in dirty {
            if let Err(e) = self.write_now(word) {
                left.insert(word);
                result = Err(e);
            }
        }
        self.deferred = Some(left);
        result
    }

    /// Start again from `slots`: rewrite the words that differ from what
    /// was written last.
    fn rebuild(&mut self, slots: impl Iterator<Item = (u32, u64)>) -> Result<(), MapError> {
        self.flush()?;
        self.counts.clear();
        let mut want = vec![0u64; self.words.len()];
        for slot in slots {
            *self.counts.entry(slot).or_default() += 1;
            want[slot.0 as usize] |= slot.1;
        }
        let mut result = Ok(());
        for (word, want) in want.into_iter().enumerate() {
            let old = self.words[word];
            if want != old {
                self.words[word] = want;
                if let Err(e) = self.write_now(word as u32) {
                    // The kernel keeps the old word: our record says so, and
                    // the failure is reported.
                    self.words[word] = old;
                    result = Err(e);
                }
            }
        }
        result
    }

    fn map_id(&self) -> Option<u32> {
        let m = self.map.as_ref()?;
        Some(super::map_data::map_data(m)?.info().ok()?.id())
    }
}

pub(super) struct LbFilter {
    bits: Bits,
}

impl std::fmt::Debug for LbFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LbFilter")
            .field("bits", &self.bits.counts.len())
            .finish()
    }
}

impl LbFilter {
    /// `map`: the program's LB_FILTER, taken out of the object (None: an
    /// object without it; then nothing is filtered, every ARP frame takes
    /// the hash lookup).
    pub(super) fn new(map: Option<Map>) -> Self {
        LbFilter {
            bits: Bits::new(map, LB_FILTER_WORDS, false),
        }
    }

    /// The kernel's id of the map (for the memory shown in the status).
    pub(super) fn map_id(&self) -> Option<u32> {
        self.bits.map_id()
    }

    /// Start again from `ips` (what `LB_IPS` holds after a reload): rewrite
    /// the words that differ from what was written last.
    pub(super) fn rebuild(&mut self, ips: impl Iterator<Item = u32>) -> Result<(), MapError> {
        self.bits.rebuild(ips.map(lb_filter_slot))
    }

    /// Before `ip` enters LB_IPS: its bit is set in the kernel, or the error
    /// says why not (and the IP must not be written).
    pub(super) fn admit(&mut self, ip: &u32) -> Result<(), MapError> {
        self.bits.add(lb_filter_slot(*ip))
    }

    /// After `ip` has left LB_IPS.
    pub(super) fn release(&mut self, ip: &u32) {
        self.bits.remove(lb_filter_slot(*ip));
    }
}

/// The census's foreign filter (`guard_common::clients`): one bit per hash
/// of every LB IP, of either family, that is `foreign` in the LB maps.
/// Safe direction: the census only observes, so a bit missing costs a few
/// packets not recorded and a bit too many a hash lookup; neither can stop
/// a frame. Its words are written once per batch of LB map writes
/// ([`ForeignFilter::flush`], right after them: microseconds), not once per
/// IP: filling 65,536 foreign IPs writes each word once.
pub(super) struct ForeignFilter {
    bits: Bits,
    /// The IPs whose bit is counted.
    foreign: HashSet<IpKey>,
}

impl std::fmt::Debug for ForeignFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForeignFilter")
            .field("foreign", &self.foreign.len())
            .finish()
    }
}

impl ForeignFilter {
    /// `map`: the program's FOREIGN_FILTER, taken out of the object (None:
    /// the census is off; nothing is written).
    pub(super) fn new(map: Option<Map>) -> Self {
        ForeignFilter {
            bits: Bits::new(map, FOREIGN_FILTER_WORDS, true),
            foreign: HashSet::new(),
        }
    }

    pub(super) fn map_id(&self) -> Option<u32> {
        self.bits.map_id()
    }

    /// `ip` is (or is about to be) foreign, or no longer is.
    pub(super) fn set(&mut self, ip: IpKey, foreign: bool) {
        if foreign == self.foreign.contains(&ip) {
            return;
        }
        if foreign {
            // A failed write leaves the IP out: tried again at its next change
            // or the next full rebuild.
            if self.bits.add(foreign_slot(&ip)).is_ok() {
                self.foreign.insert(ip);
            }
        } else {
            self.foreign.remove(&ip);
            self.bits.remove(foreign_slot(&ip));
        }
    }

    /// Write what changed since the last flush (after a batch of writes).
    pub(super) fn flush(&mut self) {
        if let Err(e) = self.bits.flush() {
            // Observe-only: retried at the next flush.
            tracing::debug!(error = %e, "writing the census's foreign filter");
        }
    }

    /// Start again from `ips`, every foreign LB IP.
    pub(super) fn rebuild(&mut self, ips: impl Iterator<Item = IpKey>) -> Result<(), MapError> {
        self.foreign = ips.collect();
        self.bits.rebuild(self.foreign.iter().map(foreign_slot))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without a kernel map the bookkeeping alone: a bit stays set while any
    /// IP on it is in the set, and goes when the last one leaves.
    #[test]
    fn bits_follow_the_set() {
        let mut f = LbFilter::new(None);
        let a = 0x0a40_0001;
        let (word, bit) = lb_filter_slot(a);
        f.admit(&a).unwrap();
        f.admit(&a).unwrap();
        assert_ne!(f.bits.words[word as usize] & bit, 0);
        f.release(&a);
        assert_ne!(
            f.bits.words[word as usize] & bit,
            0,
            "one IP still stands on it"
        );
        f.release(&a);
        assert_eq!(f.bits.words[word as usize] & bit, 0);
        f.release(&a);
        f.rebuild([a, a + 1].into_iter()).unwrap();
        assert_eq!(f.bits.counts.len(), 2);
        f.rebuild(std::iter::empty()).unwrap();
        assert!(f.bits.words.iter().all(|w| *w == 0));
    }

    /// The foreign filter follows each IP's state: set once however often it
    /// is said, cleared when it stops being foreign.
    #[test]
    fn foreign_bits_follow_the_state() {
        let mut f = ForeignFilter::new(None);
        let a = guard_common::v4_key(0xc633_6466);
        let (word, bit) = foreign_slot(&a);
        f.set(a, true);
        f.set(a, true);
        assert_ne!(f.bits.words[word as usize] & bit, 0);
        f.set(a, false);
        assert_eq!(f.bits.words[word as usize] & bit, 0);
        f.set(a, false);
        f.rebuild([a].into_iter()).unwrap();
        assert_ne!(f.bits.words[word as usize] & bit, 0);
        f.set(a, false);
        assert!(f.bits.words.iter().all(|w| *w == 0));
    }
}
