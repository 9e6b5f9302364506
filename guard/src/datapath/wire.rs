//! Frames the daemon puts on the wire itself: announcements it held back,
//! re-sent when the IP becomes owned here, and unicast refreshes for stale
//! clients. One AF_PACKET socket that receives nothing (protocol 0, never
//! bound) and marks what it sends with [`GUARD_MARK`]: the guard's own
//! program knows those frames (origin `guard`) and lets them pass.
//!
//! Opening it needs CAP_NET_RAW (an AF_PACKET socket) and CAP_NET_ADMIN
//! (SO_MARK); the DaemonSet grants both.

use std::{
    io,
    mem::size_of,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
};

use guard_common::GUARD_MARK;

use super::error::DatapathError;

/// The daemon's own sender.
#[derive(Debug)]
pub struct Wire {
    fd: OwnedFd,
}

impl Wire {
    /// Open the socket and mark it.
    pub fn open() -> Result<Self, DatapathError> {
        // SAFETY: plain syscall; the result is checked.
        let raw = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        };
        if raw < 0 {
            return Err(DatapathError::Wire {
                what: "socket(AF_PACKET, SOCK_RAW) (needs CAP_NET_RAW)",
                source: io::Error::last_os_error(),
            });
        }
        // SAFETY: `raw` is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let mark = GUARD_MARK;
        // SAFETY: `mark` outlives the call; its size is given.
        let r = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_MARK,
                (&mark as *const u32).cast(),
                size_of::<u32>() as u32,
            )
        };
        if r != 0 {
            return Err(DatapathError::Wire {
                what: "setsockopt(SO_MARK) (needs CAP_NET_ADMIN)",
                source: io::Error::last_os_error(),
            });
        }
        Ok(Wire { fd })
    }

    /// Send `frame` (a whole Ethernet frame) out of `ifindex` as it is. Never
    /// blocks: a full queue is an error (EAGAIN), for the caller to count.
    pub fn send(&self, ifindex: u32, frame: &[u8]) -> io::Result<()> {
        // SAFETY: sockaddr_ll is plain old data; all zeroes is a valid value.
        let mut to: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        to.sll_family = libc::AF_PACKET as u16;
        to.sll_ifindex = i32::try_from(ifindex).map_err(|_| io::ErrorKind::InvalidInput)?;
        to.sll_halen = 6;
        if let Some(dst) = frame.get(..6) {
            to.sll_addr[..6].copy_from_slice(dst);
        }
        // SAFETY: the frame and `to` outlive the call.
        let n = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                0,
                (&to as *const libc::sockaddr_ll).cast(),
                size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}
