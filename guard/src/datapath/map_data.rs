//! The kernel map behind an aya map, whatever its kind: what pinning, map
//! ids and the program's inventory need, and nothing typed.

use aya::maps::MapData;

/// The map's file behind any of the kinds the program declares.
pub(super) fn map_data_mut(m: &mut aya::maps::Map) -> Option<&mut MapData> {
    use aya::maps::Map::*;
    match m {
        Array(d) | HashMap(d) | LruHashMap(d) | PerCpuArray(d) | PerCpuHashMap(d) | RingBuf(d) => {
            Some(d)
        }
        _ => None,
    }
}

/// As [`map_data_mut`], shared.
pub(super) fn map_data(m: &aya::maps::Map) -> Option<&MapData> {
    use aya::maps::Map::*;
    match m {
        Array(d) | HashMap(d) | LruHashMap(d) | PerCpuArray(d) | PerCpuHashMap(d) | RingBuf(d) => {
            Some(d)
        }
        _ => None,
    }
}
