//! The LB filter: one bit per hash of an LB IP in front of `LB_IPS`, so the
//! program proves "not an LB IP" with an inlined array read
//! (`guard_common::lb_filter_slot`).
//!
//! Safe direction: a missing bit would let frames of that LB IP pass
//! unjudged, so a bit is set **before** its IP enters `LB_IPS` and cleared
//! only **after** the last IP on it has left. A bit set too many (a
//! collision, a failed clear) only costs the frame a hash lookup. The map is
//! not pinned: every load starts it empty and fills it from `LB_IPS` (the
//! reload of pinned maps, or the first write of the view) before anything is
//! attached; if that rebuild fails, the writer forgets what `LB_IPS` holds so
//! that its next write sets every entry's bit again.

use std::collections::HashMap;

use aya::maps::{Array, Map, MapData, MapError};
use guard_common::{lb_filter_slot, LB_FILTER_WORDS};

pub(super) struct LbFilter {
    map: Option<Map>,
    /// How many IPs of `LB_IPS` stand on each bit, by (word, bit).
    counts: HashMap<(u32, u64), u32>,
    /// The words as last written to the kernel.
    words: Vec<u64>,
}

impl std::fmt::Debug for LbFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LbFilter")
            .field("bits", &self.counts.len())
            .finish()
    }
}

impl LbFilter {
    /// `map`: the program's LB_FILTER, taken out of the object (None: an
    /// object without it; then nothing is filtered, every ARP frame takes
    /// the hash lookup).
    pub(super) fn new(map: Option<Map>) -> Self {
        LbFilter {
            map,
            counts: HashMap::new(),
            words: vec![0; LB_FILTER_WORDS as usize],
        }
    }

    /// The kernel's id of the map (for the memory shown in the status).
    pub(super) fn map_id(&self) -> Option<u32> {
        let m = self.map.as_ref()?;
        Some(super::map_data(m)?.info().ok()?.id())
    }

    fn write_word(&mut self, word: u32) -> Result<(), MapError> {
        let Some(map) = self.map.as_mut() else {
            return Ok(());
        };
        let mut array: Array<&mut MapData, u64> = Array::try_from(map)?;
        array.set(word, self.words[word as usize], 0)
    }

    /// Start again from `ips` (what `LB_IPS` holds after a reload): rewrite
    /// the words that differ from what was written last.
    pub(super) fn rebuild(&mut self, ips: impl Iterator<Item = u32>) -> Result<(), MapError> {
        self.counts.clear();
        let mut want = vec![0u64; LB_FILTER_WORDS as usize];
        for ip in ips {
            let slot = lb_filter_slot(ip);
            *self.counts.entry(slot).or_default() += 1;
            want[slot.0 as usize] |= slot.1;
        }
        let mut result = Ok(());
        for word in 0..LB_FILTER_WORDS {
            if want[word as usize] != self.words[word as usize] {
                let old = self.words[word as usize];
                self.words[word as usize] = want[word as usize];
                if let Err(e) = self.write_word(word) {
                    // The kernel keeps the old word: our record says so, and
                    // the failure is reported.
                    self.words[word as usize] = old;
                    result = Err(e);
                }
            }
        }
        result
    }
}

impl LbFilter {
    /// Before `ip` enters LB_IPS: its bit is set in the kernel, or the error
    /// says why not (and the IP must not be written).
    pub(super) fn admit(&mut self, ip: &u32) -> Result<(), MapError> {
        let (word, bit) = lb_filter_slot(*ip);
        *self.counts.entry((word, bit)).or_default() += 1;
        if self.words[word as usize] & bit != 0 {
            return Ok(());
        }
        self.words[word as usize] |= bit;
        if let Err(e) = self.write_word(word) {
            // Not in the kernel: the IP must not enter LB_IPS as if it were.
            self.words[word as usize] &= !bit;
            self.release(ip);
            return Err(e);
        }
        Ok(())
    }

    /// After `ip` has left LB_IPS.
    pub(super) fn release(&mut self, ip: &u32) {
        let slot @ (word, bit) = lb_filter_slot(*ip);
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
        assert_ne!(f.words[word as usize] & bit, 0);
        f.release(&a);
        assert_ne!(f.words[word as usize] & bit, 0, "one IP still stands on it");
        f.release(&a);
        assert_eq!(f.words[word as usize] & bit, 0);
        f.release(&a);
        f.rebuild([a, a + 1].into_iter()).unwrap();
        assert_eq!(f.counts.len(), 2);
        f.rebuild(std::iter::empty()).unwrap();
        assert!(f.words.iter().all(|w| *w == 0));
    }
}
