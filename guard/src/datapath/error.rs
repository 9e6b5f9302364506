//! What can go wrong in the datapath, typed where a caller decides on it
//! (fall back from TCX to netlink, replace a filter left behind, tell a
//! full map from a failed write, name the daemon holding the pins), and
//! matched by errno, never by message text.

use std::{io, path::PathBuf};

/// The datapath's result: its own error unless another is named.
pub type Result<T, E = DatapathError> = std::result::Result<T, E>;

pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Each variant names what failed and its culprit (the interface, the path,
/// the map or program); the errno stays in the source chain ([`errno`]).
#[derive(Debug, thiserror::Error)]
pub enum DatapathError {
    #[error("interface {0} not found in this network namespace")]
    NoInterface(String),
    #[error("the kernel refused to load the BPF program: run as root or with CAP_BPF, CAP_NET_ADMIN and CAP_PERFMON (before Linux 5.11 BPF memory also counts against RLIMIT_MEMLOCK: raise it for the container runtime, e.g. LimitMEMLOCK=infinity in containerd's systemd unit; a seccomp profile that denies bpf(2) fails the same way)")]
    LoadNotPermitted(#[source] BoxError),
    #[error("this kernel has no BPF support (bpf() returned ENOSYS)")]
    NoBpf(#[source] BoxError),
    #[error("the kernel rejected the BPF object; arp-guard needs Linux >= 5.10 with BPF_SYSCALL")]
    LoadRejected(#[source] BoxError),
    /// A load that failed for a reason none of the above names.
    #[error("loading the BPF program")]
    Load(#[source] BoxError),
    /// The embedded object lacks a program this build expects.
    #[error("program {0} missing from the embedded object")]
    NoProgram(&'static str),
    /// The embedded object lacks a map this build expects.
    #[error("map {0} missing from the embedded object")]
    NoMap(String),
    /// The responder census was not loaded (or failed to): nothing to read.
    #[error("the census is not loaded")]
    CensusNotLoaded,
    #[error("attaching to {iface} egress with TCX (needs Linux >= 6.6)")]
    Tcx {
        iface: String,
        #[source]
        source: BoxError,
    },
    #[error("attaching to {iface} egress with a netlink clsact filter")]
    Netlink {
        iface: String,
        #[source]
        source: BoxError,
    },
    /// Another operation on an interface's TC hooks (its clsact qdisc, a
    /// filter left behind, its TCX programs).
    #[error("{op} {iface}")]
    Interface {
        /// What was being done, ending in a preposition ("adding a clsact qdisc to").
        op: String,
        iface: String,
        #[source]
        source: BoxError,
    },
    /// Reading the TC filters of an interface over rtnetlink.
    #[error("dumping the egress filters of ifindex {ifindex}")]
    FilterDump {
        ifindex: u32,
        #[source]
        source: BoxError,
    },
    #[error("another arp-guard{} uses --pin-dir {dir}; one daemon per pin directory", .pid.map(|p| format!(" (pid {p})")).unwrap_or_default())]
    PinsLocked { dir: String, pid: Option<u32> },
    #[error("--pin-dir {0}: not on a bpffs (mount one: mount -t bpf bpf /sys/fs/bpf)")]
    NotBpffs(String),
    #[error("{dir} is not a bpffs and mounting one there failed: mount it on the node (mount -t bpf bpf {dir})")]
    MountBpffs {
        dir: String,
        #[source]
        source: io::Error,
    },
    /// A file, directory or pin: what was done to which path.
    #[error("{op} {}", .path.display())]
    Path {
        /// What was being done ("removing", "pinning the program at").
        op: &'static str,
        path: PathBuf,
        #[source]
        source: BoxError,
    },
    /// One of our maps on a duplicated fd (for a reader off the main loop).
    #[error("duplicating the fd of map {map}")]
    DupMap {
        map: String,
        #[source]
        source: io::Error,
    },
    /// Writing a map as a whole (the LB filter rebuilt from LB_IPS).
    #[error("writing {map}")]
    WriteMap {
        map: &'static str,
        #[source]
        source: BoxError,
    },
    /// The daemon's own sender (re-sent announcements, refreshes).
    #[error("opening the socket that re-sends held announcements: {what}")]
    Wire {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    /// A program run by BPF_PROG_TEST_RUN (tests and benches only).
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    #[error("BPF_PROG_TEST_RUN")]
    TestRun(#[source] aya::programs::ProgramError),
    // What aya and the OS report, passed on with `?` where the operation
    // names its culprit no better than the source does.
    #[error("I/O")]
    Io(#[from] io::Error),
    #[error("BPF map operation")]
    Map(#[from] aya::maps::MapError),
    #[error("BPF program operation")]
    Program(#[from] aya::programs::ProgramError),
    #[error("BPF link operation")]
    Link(#[from] aya::programs::links::LinkError),
    #[error("pinning a BPF object")]
    Pin(#[from] aya::pin::PinError),
}

/// Blame an error on the path or interface it concerns:
/// `result.at_path("removing", &path)?`, `result.on_iface("adding a clsact qdisc to", iface)?`.
pub trait Blame<T> {
    fn at_path(self, op: &'static str, path: &std::path::Path) -> Result<T, DatapathError>;
    fn on_iface(self, op: impl Into<String>, iface: &str) -> Result<T, DatapathError>;
}

impl<T, E: Into<BoxError>> Blame<T> for Result<T, E> {
    fn at_path(self, op: &'static str, path: &std::path::Path) -> Result<T, DatapathError> {
        self.map_err(|e| DatapathError::Path {
            op,
            path: path.to_owned(),
            source: e.into(),
        })
    }
    fn on_iface(self, op: impl Into<String>, iface: &str) -> Result<T, DatapathError> {
        self.map_err(|e| DatapathError::Interface {
            op: op.into(),
            iface: iface.to_owned(),
            source: e.into(),
        })
    }
}

/// The errno anywhere in an error's chain: io::Error, aya's syscall and
/// netlink errors carry it.
pub fn errno(e: &(dyn std::error::Error + 'static)) -> Option<i32> {
    let mut cur = Some(e);
    while let Some(err) = cur {
        let found = err
            .downcast_ref::<io::Error>()
            .and_then(io::Error::raw_os_error)
            .or_else(|| {
                err.downcast_ref::<aya::sys::SyscallError>()
                    .and_then(|s| s.io_error.raw_os_error())
            })
            .or_else(|| {
                err.downcast_ref::<aya::sys::NetlinkError>()
                    .and_then(aya::sys::NetlinkError::raw_os_error)
            });
        if found.is_some() {
            return found;
        }
        cur = err.source();
    }
    None
}

/// Turn the kernel's terse errno on a load into what an operator can act on.
pub fn load_error(e: impl Into<BoxError>) -> DatapathError {
    let e: BoxError = e.into();
    match errno(e.as_ref()) {
        Some(libc::EPERM) | Some(libc::EACCES) => DatapathError::LoadNotPermitted(e),
        Some(libc::ENOSYS) => DatapathError::NoBpf(e),
        Some(libc::EINVAL) => DatapathError::LoadRejected(e),
        _ => DatapathError::Load(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_is_found_through_the_chain() {
        let inner = io::Error::from_raw_os_error(libc::EEXIST);
        let e = DatapathError::Interface {
            op: "adding a clsact qdisc to".into(),
            iface: "eth9".into(),
            source: Box::new(inner),
        };
        assert_eq!(errno(&e), Some(libc::EEXIST));
        assert!(matches!(
            load_error(io::Error::from_raw_os_error(libc::EPERM)),
            DatapathError::LoadNotPermitted(_)
        ));
        assert_eq!(errno(&io::Error::other("no errno")), None);
    }
}
