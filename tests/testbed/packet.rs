//! AF_PACKET sockets: send frames the way a userspace speaker does (MetalLB,
//! kube-vip), and capture what a neighbour receives.

use std::{
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

use crate::{frames::Captured, netns::Netns};

const ETH_P_ALL: u16 = 0x0003;

/// A raw packet socket bound to one interface of one namespace.
pub struct RawSocket {
    fd: OwnedFd,
    ifindex: i32,
}

impl RawSocket {
    /// Open a socket on `iface` inside `ns` that receives every frame.
    pub fn open(ns: &Netns, iface: &str) -> Result<Self> {
        let iface = iface.to_owned();
        ns.enter(move || {
            let name = std::ffi::CString::new(iface.clone())?;
            // SAFETY: plain syscalls with valid arguments; errors checked.
            unsafe {
                let ifindex = libc::if_nametoindex(name.as_ptr()) as i32;
                if ifindex == 0 {
                    bail!("no interface {iface}");
                }
                let fd = libc::socket(libc::AF_PACKET, libc::SOCK_RAW, ETH_P_ALL.to_be() as i32);
                if fd < 0 {
                    bail!("socket(AF_PACKET): {}", std::io::Error::last_os_error());
                }
                let fd = OwnedFd::from_raw_fd(fd);
                let mut sll: libc::sockaddr_ll = std::mem::zeroed();
                sll.sll_family = libc::AF_PACKET as u16;
                sll.sll_protocol = ETH_P_ALL.to_be();
                sll.sll_ifindex = ifindex;
                let r = libc::bind(
                    fd.as_raw_fd(),
                    &sll as *const _ as *const libc::sockaddr,
                    std::mem::size_of::<libc::sockaddr_ll>() as u32,
                );
                if r != 0 {
                    bail!(
                        "bind(AF_PACKET, {iface}): {}",
                        std::io::Error::last_os_error()
                    );
                }
                Ok(RawSocket { fd, ifindex })
            }
        })
    }

    /// Send one complete Ethernet frame. `Ok(false)`: the kernel took it and
    /// it was dropped on egress (a TC program said so; sendto reports ENOBUFS).
    pub fn send(&self, frame: &[u8]) -> Result<bool> {
        // SAFETY: sockaddr_ll is plain data; the buffer outlives the call.
        unsafe {
            let mut sll: libc::sockaddr_ll = std::mem::zeroed();
            sll.sll_family = libc::AF_PACKET as u16;
            sll.sll_ifindex = self.ifindex;
            sll.sll_halen = 6;
            sll.sll_addr[..6].copy_from_slice(&frame[..6]);
            let n = libc::sendto(
                self.fd.as_raw_fd(),
                frame.as_ptr() as *const libc::c_void,
                frame.len(),
                0,
                &sll as *const _ as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            );
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::ENOBUFS) {
                    return Ok(false);
                }
                bail!("sendto: {e}");
            }
        }
        Ok(true)
    }

    /// Drop whatever is queued (frames from before the step under test).
    pub fn drain(&self) {
        while self
            .recv_raw(Duration::from_millis(1))
            .ok()
            .flatten()
            .is_some()
        {}
    }

    /// One frame, or None after `timeout`. A frame this namespace sent itself
    /// comes back empty.
    pub fn recv_raw(&self, timeout: Duration) -> Result<Option<Vec<u8>>> {
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut pfd, 1, ms) };
        if r < 0 {
            bail!("poll: {}", std::io::Error::last_os_error());
        }
        if r == 0 {
            return Ok(None);
        }
        let mut buf = vec![0u8; 2048];
        // SAFETY: buf and sll are writable for their lengths.
        let (n, sll) = unsafe {
            let mut sll: libc::sockaddr_ll = std::mem::zeroed();
            let mut len = std::mem::size_of::<libc::sockaddr_ll>() as u32;
            let n = libc::recvfrom(
                self.fd.as_raw_fd(),
                buf.as_mut_ptr() as *mut libc::c_void,
                buf.len(),
                0,
                &mut sll as *mut _ as *mut libc::sockaddr,
                &mut len,
            );
            (n, sll)
        };
        if n < 0 {
            return Err(std::io::Error::last_os_error()).context("recv");
        }
        if sll.sll_pkttype == libc::PACKET_OUTGOING {
            // Our own namespace's transmissions: not what a neighbour receives.
            return Ok(Some(Vec::new()));
        }
        buf.truncate(n as usize);
        Ok(Some(buf))
    }

    /// Every frame received for `window`.
    pub fn collect(&self, window: Duration) -> Result<Vec<Vec<u8>>> {
        let deadline = Instant::now() + window;
        let mut out = vec![];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(out);
            }
            if let Some(f) = self.recv_raw(left)? {
                if !f.is_empty() {
                    out.push(f);
                }
            }
        }
    }

    /// Every ARP frame received for `window` (tags the receiving kernel moved
    /// into metadata are not reported; the payload is what matters here).
    pub fn collect_arp(&self, window: Duration) -> Result<Vec<Captured>> {
        Ok(self
            .collect(window)?
            .iter()
            .filter_map(|f| Captured::parse(f))
            .collect())
    }

    /// Wait until an ARP frame matching `pred` arrives, up to `timeout`.
    pub fn wait_arp(
        &self,
        timeout: Duration,
        pred: impl Fn(&Captured) -> bool,
    ) -> Result<Option<Captured>> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            if let Some(f) = self.recv_raw(left)? {
                if let Some(c) = Captured::parse(&f) {
                    if pred(&c) {
                        return Ok(Some(c));
                    }
                }
            }
        }
    }
}
