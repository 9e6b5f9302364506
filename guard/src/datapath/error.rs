//! What can go wrong in the datapath, typed where a caller decides on it
//! (fall back from TCX to netlink, replace a filter left behind, tell a
//! full map from a failed write, name the daemon holding the pins), and
//! matched by errno, never by message text.

use std::io;

/// A `DatapathError::Msg` from format arguments.
macro_rules! dp_err {
    ($($arg:tt)*) => {
        $crate::datapath::error::DatapathError::Msg(format!($($arg)*))
    };
}
pub(crate) use dp_err;

/// Any error, for sources kept as they are.
/// The datapath's result: its own error unless another is named.
pub type Result<T, E = DatapathError> = std::result::Result<T, E>;

pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

#[derive(Debug, thiserror::Error)]
pub enum DatapathError {
    #[error("interface {0} not found in this network namespace")]
    NoInterface(String),
    #[error("the kernel refused to load the BPF program: run as root or with CAP_BPF, CAP_NET_ADMIN and CAP_PERFMON (before Linux 5.11 BPF memory also counts against RLIMIT_MEMLOCK: raise it, e.g. LimitMEMLOCK=infinity for the container runtime, or add CAP_SYS_RESOURCE)")]
    LoadNotPermitted(#[source] BoxError),
    #[error("this kernel has no BPF support (bpf() returned ENOSYS)")]
    NoBpf(#[source] BoxError),
    #[error("the kernel rejected the BPF object; arp-guard needs Linux >= 5.10 with BPF_SYSCALL")]
    LoadRejected(#[source] BoxError),
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
    #[error("another arp-guard{} uses --pin-dir {dir}; one daemon per pin directory", .pid.map(|p| format!(" (pid {p})")).unwrap_or_default())]
    PinsLocked { dir: String, pid: Option<u32> },
    #[error("--pin-dir {0}: not on a bpffs (mount one: mount -t bpf bpf /sys/fs/bpf)")]
    NotBpffs(String),
    /// The daemon's own sender (re-sent announcements, refreshes).
    #[error("opening the socket that re-sends held announcements: {what}")]
    Wire {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("{what}")]
    Other {
        what: String,
        #[source]
        source: BoxError,
    },
    #[error("{0}")]
    Msg(String),
}

/// The errors of aya and the OS that the datapath passes on with `?`.
macro_rules! from_source {
    ($($t:ty => $what:literal),* $(,)?) => {$(
        impl From<$t> for DatapathError {
            fn from(e: $t) -> Self {
                DatapathError::Other { what: $what.into(), source: Box::new(e) }
            }
        }
    )*};
}
from_source!(
    io::Error => "I/O",
    aya::maps::MapError => "BPF map operation",
    aya::programs::ProgramError => "BPF program operation",
    aya::programs::links::LinkError => "BPF link operation",
    aya::pin::PinError => "pinning a BPF object",
);

/// Give an error a sentence: `result.ctx("doing X")?`.
pub trait Ctx<T> {
    fn ctx(self, what: impl Into<String>) -> Result<T, DatapathError>;
    fn with_ctx(self, what: impl FnOnce() -> String) -> Result<T, DatapathError>;
}

impl<T, E: Into<BoxError>> Ctx<T> for Result<T, E> {
    fn ctx(self, what: impl Into<String>) -> Result<T, DatapathError> {
        self.map_err(|e| DatapathError::Other {
            what: what.into(),
            source: e.into(),
        })
    }
    fn with_ctx(self, what: impl FnOnce() -> String) -> Result<T, DatapathError> {
        self.map_err(|e| DatapathError::Other {
            what: what(),
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
        _ => DatapathError::Other {
            what: "loading the BPF program".into(),
            source: e,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_is_found_through_the_chain() {
        let inner = io::Error::from_raw_os_error(libc::EEXIST);
        let e = DatapathError::Other {
            what: "adding a clsact qdisc".into(),
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
