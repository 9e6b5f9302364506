//! The per-IP counter map's size, and the reclaiming of the rows of IPs that
//! left the LB set.

use aya::maps::MapData;
use guard_common::{CounterKey, CounterValue};

use super::error::Result;

/// Rows of the per-IP counter map for a given LB IP capacity: room for
/// several decisions (kinds, origins, verdicts, interfaces) per IP, four per
/// IP of each family (`LB_IPS` and `LB_IPS6` each hold `lb_ips`). Allocated
/// on use. Rows of IPs that left the LB set are reclaimed
/// ([`Datapath::reclaim_counters`]).
pub fn counter_capacity(lb_ips: u32) -> u32 {
    lb_ips.saturating_mul(8).clamp(1024, 8 * 1024 * 1024)
}

/// Deletes the counter rows of IPs that have been out of the LB map for a
/// grace period (long enough for a scrape to see their last values), so that
/// churn cannot fill the map and leave new IPs uncounted. It walks the whole
/// map, so it runs off the main loop.
pub struct CounterReclaimer {
    map: aya::maps::Map,
    /// LB IPs with counter rows that are no longer in the LB set, and since when.
    gone: std::collections::HashMap<guard_common::IpKey, std::time::Instant>,
}

impl CounterReclaimer {
    pub(super) fn new(map: aya::maps::Map) -> Self {
        CounterReclaimer {
            map,
            gone: Default::default(),
        }
    }

    /// Returns how many rows went.
    pub fn reclaim(
        &mut self,
        lb: &std::collections::HashSet<guard_common::IpKey>,
        now: std::time::Instant,
        grace: std::time::Duration,
    ) -> Result<usize> {
        let mut map: aya::maps::PerCpuHashMap<&mut MapData, CounterKey, CounterValue> =
            aya::maps::PerCpuHashMap::try_from(&mut self.map)?;
        let keys: Vec<CounterKey> = map.keys().filter_map(Result::ok).collect();
        let mut gone_now = std::collections::HashSet::new();
        let mut removed = 0;
        for k in keys {
            if lb.contains(&k.ip) {
                continue;
            }
            gone_now.insert(k.ip);
            let since = *self.gone.entry(k.ip).or_insert(now);
            if now.saturating_duration_since(since) >= grace && map.remove(&k).is_ok() {
                removed += 1;
            }
        }
        self.gone.retain(|ip, _| gone_now.contains(ip));
        Ok(removed)
    }
}
