//! Where the history a daemon leaves for the next one is stored
//! (`model::history` is its content): under `--pin-dir`, beside the pins
//! it belongs with, so that it survives exactly what they survive (a
//! restart, a rolling upgrade, SIGKILL; not a reboot, nor `--on-exit
//! remove`, nor `arp-guard uninstall`). bpffs holds no regular files, so it
//! is a pinned BPF array of 4 KiB pages (`DIR/history`, created by the
//! daemon, never seen by the program), sized to its content: each write
//! fills a new map, pins it at `DIR/history_tmp` (bpffs refuses dots in
//! names) and renames it over the
//! old one. The rename is atomic: a reader sees the old history or the
//! new, never a torn one (a daemon killed mid-write leaves the old one and
//! a stray temporary pin, replaced by the next write). bpffs lives in
//! memory: there is nothing to fsync. A pinned object that is not such a
//! map, or larger than a history can be, is not read.

use std::path::{Path, PathBuf};

use aya::maps::{Array, Map, MapData, MapType};

use super::{
    error::{Blame as _, DatapathError, Result},
    Datapath,
};

/// The history's pin under `--pin-dir`.
pub const HISTORY_PIN: &str = "history";
const PAGE: usize = 4096;
type Page = [u8; PAGE];

pub fn history_path(dir: &Path) -> PathBuf {
    dir.join(HISTORY_PIN)
}

fn tmp_path(dir: &Path) -> PathBuf {
    dir.join(format!("{HISTORY_PIN}_tmp"))
}

/// The stored history's bytes (pages, zero-padded): None when there is
/// none. At most `max` bytes are read: a larger map is refused unread.
pub fn read(dir: &Path, max: usize) -> Result<Option<Vec<u8>>> {
    let path = history_path(dir);
    if std::fs::symlink_metadata(&path).is_err() {
        return Ok(None);
    }
    let data = MapData::from_pin(&path).at_path("opening", &path)?;
    let info = data.info()?;
    let pages = info.max_entries() as usize;
    let kind = info.map_type().ok();
    if kind != Some(MapType::Array)
        || info.key_size() != 4
        || info.value_size() as usize != PAGE
        || pages.saturating_mul(PAGE) > max.next_multiple_of(PAGE)
    {
        let why = format!(
            "not a history: a {kind:?} map of {} entries of {} bytes (a history is an array of at most {} pages of {PAGE} bytes)",
            pages,
            info.value_size(),
            max.div_ceil(PAGE)
        );
        return Err(DatapathError::Path {
            op: "reading",
            path,
            source: why.into(),
        });
    }
    let array: Array<MapData, Page> = Array::try_from(Map::Array(data))?;
    let mut out = Vec::with_capacity(pages * PAGE);
    for i in 0..pages as u32 {
        out.extend_from_slice(&array.get(&i, 0)?);
    }
    Ok(Some(out))
}

/// Store `bytes` as the history, replacing the one stored (atomically).
pub fn write(dir: &Path, bytes: &[u8]) -> Result<()> {
    let pages = bytes.len().div_ceil(PAGE).max(1);
    let count = u32::try_from(pages).map_err(|_| DatapathError::Path {
        op: "writing",
        path: history_path(dir),
        source: "too large".into(),
    })?;
    let mut array: Array<MapData, Page> = Array::create(count, 0)?;
    for (i, chunk) in bytes.chunks(PAGE).enumerate() {
        let mut page = [0u8; PAGE];
        page[..chunk.len()].copy_from_slice(chunk);
        // i < pages, which fits in u32 (checked above).
        array.set(i as u32, page, 0)?;
    }
    let tmp = tmp_path(dir);
    // A temporary pin a killed writer left behind.
    let _ = std::fs::remove_file(&tmp);
    array.pin(&tmp).at_path("pinning the history at", &tmp)?;
    let path = history_path(dir);
    std::fs::rename(&tmp, &path).at_path("renaming the history to", &path)
}

impl Datapath {
    /// The last heartbeat in the heartbeat map (CLOCK_MONOTONIC ns): before
    /// this daemon's first, the previous daemon's, when its pinned map was
    /// taken over. None when there is none.
    pub fn last_heartbeat(&self) -> Option<u64> {
        let map = self.ebpf.map(guard_common::MAP_HEARTBEAT)?;
        let hb: Array<&MapData, u64> = Array::try_from(map).ok()?;
        hb.get(&0, 0).ok().filter(|ns| *ns != 0)
    }
}
