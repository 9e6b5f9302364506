//! Pins under a bpffs directory, so that the guard outlives its daemon and a
//! restarted daemon takes over without a gap.
//!
//! Layout of `--pin-dir DIR`:
//! - `DIR/map_<NAME>`: the program's maps (policy, addresses, counters,
//!   config, heartbeat). A restarted daemon reuses them, content included.
//! - `DIR/prog`: the program last loaded (for bpftool; the links hold it).
//! - `DIR/link_<ifindex>`: the TCX link on that interface. A restarted daemon
//!   swaps its new program into this link in one `BPF_LINK_UPDATE`, so the
//!   interface is never without a guard.

use super::error::{Blame as _, DatapathError, Result};

use std::{
    io,
    path::{Path, PathBuf},
};

use aya::{maps::MapData, programs::links::PinnedLink};
use guard_common::{
    Config, CounterKey, CounterValue, IfAddrKey, LbEntry, VlanKey, MAP_CONFIG, MAP_COUNTERS,
    MAP_HEARTBEAT, MAP_IF_ADDRS, MAP_IF_PRIMARY, MAP_LB_IPS, MAP_LB_IPS6, MAP_STATS,
    MAP_VLAN_UPPERS, MAX_IF_ADDRS,
};

/// statfs(2) magic of bpffs.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;
/// Where bpffs lives on a node.
pub const DEFAULT_BPFFS: &str = "/sys/fs/bpf";

/// The maps that are pinned, with the key size, value size and capacity the
/// current program expects. A pinned map with another layout (an older
/// arp-guard) is not reused.
pub fn pinned_maps(lb_capacity: u32) -> [(&'static str, u32, u32, u32); 9] {
    use std::mem::size_of;
    [
        (
            MAP_LB_IPS,
            size_of::<u32>() as u32,
            size_of::<LbEntry>() as u32,
            lb_capacity,
        ),
        (
            MAP_LB_IPS6,
            size_of::<guard_common::IpKey>() as u32,
            size_of::<LbEntry>() as u32,
            lb_capacity,
        ),
        (MAP_IF_ADDRS, size_of::<IfAddrKey>() as u32, 1, MAX_IF_ADDRS),
        (MAP_IF_PRIMARY, 4, 4, MAX_IF_ADDRS),
        (
            MAP_VLAN_UPPERS,
            size_of::<VlanKey>() as u32,
            4,
            MAX_IF_ADDRS,
        ),
        (
            MAP_COUNTERS,
            size_of::<CounterKey>() as u32,
            size_of::<CounterValue>() as u32,
            super::reclaim::counter_capacity(lb_capacity),
        ),
        (MAP_STATS, 4, 8, guard_common::Stat::COUNT),
        (MAP_CONFIG, 4, size_of::<Config>() as u32, 1),
        (MAP_HEARTBEAT, 4, 8, 1),
    ]
}

pub fn map_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("map_{name}"))
}

pub fn prog_path(dir: &Path) -> PathBuf {
    dir.join("prog")
}

pub fn link_path(dir: &Path, ifindex: u32) -> PathBuf {
    dir.join(format!("link_{ifindex}"))
}

fn is_bpffs(path: &Path) -> bool {
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: statfs writes into the struct we own; the path is NUL-terminated.
    unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        libc::statfs(c.as_ptr(), &mut st) == 0 && st.f_type as i64 == BPF_FS_MAGIC
    }
}

/// Make sure `dir` exists on a bpffs, mounting one at /sys/fs/bpf if `dir`
/// lives there and nothing is mounted (as on a node without systemd's mount).
pub fn ensure_bpffs(dir: &Path) -> Result<()> {
    let mut probe = dir.to_path_buf();
    while !probe.exists() {
        if !probe.pop() {
            break;
        }
    }
    if !is_bpffs(&probe) {
        if dir.starts_with(DEFAULT_BPFFS) && !is_bpffs(Path::new(DEFAULT_BPFFS)) {
            std::fs::create_dir_all(DEFAULT_BPFFS).ok();
            let (src, target, fstype) = (c"bpf", c"/sys/fs/bpf", c"bpf");
            // SAFETY: constant NUL-terminated strings; no data argument.
            let r = unsafe {
                libc::mount(
                    src.as_ptr(),
                    target.as_ptr(),
                    fstype.as_ptr(),
                    0,
                    std::ptr::null(),
                )
            };
            if r != 0 {
                return Err(DatapathError::MountBpffs {
                    dir: DEFAULT_BPFFS.to_owned(),
                    source: io::Error::last_os_error(),
                });
            }
            tracing::info!("mounted bpffs at {DEFAULT_BPFFS}");
        } else if !is_bpffs(&probe) {
            return Err(DatapathError::NotBpffs(dir.display().to_string()));
        }
    }
    std::fs::create_dir_all(dir).at_path("creating", dir)?;
    Ok(())
}

/// Remove map pins whose layout is not what this program expects, so that
/// the loader creates fresh maps instead of failing. The old program keeps
/// its maps (it holds them) until its link is swapped to the new program.
pub fn drop_incompatible_maps(dir: &Path, lb_capacity: u32) {
    for (name, key, value, max) in pinned_maps(lb_capacity) {
        let path = map_path(dir, name);
        if !path.exists() {
            continue;
        }
        let fits = MapData::from_pin(&path)
            .ok()
            .and_then(|m| m.info().ok())
            .is_some_and(|i| {
                i.key_size() == key && i.value_size() == value && i.max_entries() == max
            });
        if !fits {
            tracing::warn!(
                map = name,
                "pinned map has another layout or size; creating a new one"
            );
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// Pin the program at `DIR/prog`, replacing an earlier one's pin.
pub fn pin_program(prog: &mut aya::programs::SchedClassifier, dir: &Path) -> Result<()> {
    let path = prog_path(dir);
    let _ = std::fs::remove_file(&path);
    prog.pin(&path).at_path("pinning the program at", &path)
}

/// Remove every pin under `dir`: links are detached (their last reference
/// goes), maps and the program are freed once nothing else holds them.
pub fn uninstall(dir: &Path) -> Result<Vec<String>> {
    let mut done = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(done),
        Err(e) => return Err(e).at_path("reading", dir),
    };
    for e in entries.flatten() {
        let path = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("link_") {
            let link = PinnedLink::from_pin(&path).at_path("opening", &path)?;
            // Unpinned and dropped: the link's last reference is gone, so it detaches.
            drop(link.unpin().at_path("unpinning", &path)?);
        } else {
            std::fs::remove_file(&path).at_path("removing", &path)?;
        }
        done.push(name);
    }
    std::fs::remove_dir(dir).at_path("removing", dir)?;
    Ok(done)
}

/// An exclusive lock on a pin directory, held for the life of a daemon: a
/// second daemon on the same pins would otherwise run beside the first and,
/// exiting, remove the pins the first relies on. flock(2) on the directory
/// itself (bpffs holds no regular files); the kernel releases it when the
/// holder exits, however it exits.
#[derive(Debug)]
pub struct PinLock {
    _dir: std::fs::File,
}

/// Take the lock on `dir`, or say which process holds it.
pub fn lock(dir: &Path) -> Result<PinLock> {
    use std::os::{fd::AsRawFd as _, unix::fs::OpenOptionsExt as _};
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY)
        .open(dir)
        .at_path("opening", dir)?;
    // SAFETY: flock on an fd we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(PinLock { _dir: file });
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
        return Err(err).at_path("locking", dir);
    }
    Err(DatapathError::PinsLocked {
        dir: dir.display().to_string(),
        pid: holder(dir),
    })
}

/// The lock on `dir` for a one-off job (uninstall), held until dropped:
/// `Err(pid)` while a daemon holds it (the pid if it can be told). A
/// directory that does not exist needs no lock.
pub fn try_lock(dir: &Path) -> std::result::Result<Option<PinLock>, Option<u32>> {
    if !dir.exists() {
        return Ok(None);
    }
    lock(dir).map(Some).map_err(|_| holder(dir))
}

/// The pid holding a flock on `dir`, from /proc/locks ("MAJ:MIN:INODE",
/// major and minor in hex).
fn holder(dir: &Path) -> Option<u32> {
    use std::os::unix::fs::MetadataExt as _;
    let meta = std::fs::metadata(dir).ok()?;
    let dev = meta.dev();
    let want = format!(
        "{:02x}:{:02x}:{}",
        libc::major(dev),
        libc::minor(dev),
        meta.ino()
    );
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    locks.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.get(1) == Some(&"FLOCK") && f.get(5) == Some(&want.as_str()))
            .then(|| f.get(4)?.parse().ok())
            .flatten()
            // A holder in another pid namespace reads as 0: unknown.
            .filter(|pid| *pid != 0)
    })
}

/// Is `dir` still there on a bpffs (it can be unmounted under us)?
pub fn intact(dir: &Path) -> bool {
    dir.exists() && is_bpffs(dir)
}
