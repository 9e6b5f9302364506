//! The reader of the census's table of misdirected clients (packets that
//! arrived here for an LB IP that is `foreign` here), on fds of its own
//! for a task off the main loop.

use aya::maps::{HashMap, Map, MapData, PerCpuArray};
use guard_common::{
    ClientKey, ClientStat, ClientValue, MAP_CLIENTS, MAP_CLIENT_STATS, MAX_CLIENTS,
};

use super::{
    error::{DatapathError, Result},
    Datapath,
};
use crate::model::clients::Entry;

impl Datapath {
    /// A reader of the misdirected-clients table on fds of its own.
    pub fn clients_reader(&self) -> Result<ClientsReader> {
        if !self.census_loaded() {
            return Err(DatapathError::CensusNotLoaded);
        }
        Ok(ClientsReader {
            clients: Map::LruHashMap(self.dup_map(MAP_CLIENTS)?),
            stats: Map::PerCpuArray(self.dup_map(MAP_CLIENT_STATS)?),
        })
    }
}

/// The table of misdirected clients and its totals, read from userspace.
pub struct ClientsReader {
    clients: Map,
    stats: Map,
}

impl ClientsReader {
    /// Every entry of the table. Bounded: a table that churns under the walk
    /// (the kernel restarts a walk whose key was evicted) is read at most
    /// twice its capacity of entries.
    pub fn entries(&self) -> Result<Vec<Entry>> {
        let map: HashMap<&MapData, ClientKey, ClientValue> = HashMap::try_from(&self.clients)?;
        let mut out = Vec::new();
        for item in map.iter().take(2 * MAX_CLIENTS as usize) {
            // An entry evicted between the key walk and its lookup is skipped.
            let Ok((k, v)) = item else { continue };
            out.push(Entry {
                ip: guard_common::ip_of_key(k.ip),
                mac: k.mac,
                client_ip: guard_common::ip_of_key(v.client_ip),
                first_ns: v.first_ns,
                last_ns: v.last_ns,
                packets: v.packets,
                ifindex: v.ifindex,
                vlan: v.vlan,
            });
        }
        out.sort_by_key(|e| (e.ip, e.mac));
        out.dedup_by_key(|e| (e.ip, e.mac));
        Ok(out)
    }

    /// The totals, summed over CPUs, by [`ClientStat`].
    pub fn stats(&self) -> Result<Vec<(&'static str, u64)>> {
        let map: PerCpuArray<&MapData, u64> = PerCpuArray::try_from(&self.stats)?;
        ClientStat::ALL
            .iter()
            .map(|s| Ok((s.as_str(), map.get(&(*s as u32), 0)?.iter().sum())))
            .collect()
    }
}
