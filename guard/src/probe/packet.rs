//! The real [`PacketIo`]: an AF_PACKET raw socket bound to one interface
//! for ARP frames, non-blocking, driven by tokio's `AsyncFd`.

use std::{
    io,
    mem::size_of,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
};

use anyhow::{bail, Context as _, Result};
use guard_common::frame::{ARPHRD_ETHER, ETH_P_ARP};
use tokio::io::unix::AsyncFd;

use super::PacketIo;

/// An AF_PACKET socket receiving the ARP frames of one interface.
#[derive(Debug)]
pub struct PacketSocket {
    fd: AsyncFd<OwnedFd>,
    ifindex: i32,
    mac: [u8; 6],
}

fn sockaddr(ifindex: i32, protocol: u16) -> libc::sockaddr_ll {
    // SAFETY: sockaddr_ll is plain old data; all zeroes is a valid value.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = protocol.to_be();
    sll.sll_ifindex = ifindex;
    sll
}

/// What a refused socket(2) means for the user.
fn explain_socket_error(e: io::Error) -> anyhow::Error {
    if matches!(e.raw_os_error(), Some(libc::EPERM) | Some(libc::EACCES)) {
        // SAFETY: geteuid has no preconditions.
        let uid = unsafe { libc::geteuid() };
        anyhow::anyhow!(
            "arp-guard probe sends and receives raw ARP frames, which needs CAP_NET_RAW \
             (uid {uid} lacks it): run it as root, or grant the capability \
             (`setcap cap_net_raw+ep arp-guard`; in Kubernetes add NET_RAW to the container's \
             securityContext.capabilities)"
        )
    } else {
        anyhow::Error::new(e).context("socket(AF_PACKET, SOCK_RAW)")
    }
}

impl PacketSocket {
    /// Open a packet socket on `iface` (an Ethernet interface in this network
    /// namespace). Needs CAP_NET_RAW.
    pub fn open(iface: &str) -> Result<Self> {
        let ifindex = crate::datapath::sys::ifindex(iface)
            .map_err(|_| anyhow::anyhow!("no interface {iface:?} in this network namespace"))?;
        let ifindex = i32::try_from(ifindex).context("ifindex")?;
        // Protocol 0 receives nothing until bound: no frame of another
        // interface slips in between socket(2) and bind(2).
        // SAFETY: plain syscall; the result is checked.
        let raw = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        };
        if raw < 0 {
            return Err(explain_socket_error(io::Error::last_os_error()));
        }
        // SAFETY: `raw` is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let sll = sockaddr(ifindex, ETH_P_ARP);
        // SAFETY: `sll` is a valid sockaddr_ll for the length given.
        let r = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&sll as *const libc::sockaddr_ll).cast(),
                size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error()).with_context(|| format!("bind to {iface}"));
        }
        let mut name = sockaddr(0, 0);
        let mut len = size_of::<libc::sockaddr_ll>() as u32;
        // SAFETY: `name` is writable for `len` bytes.
        let r = unsafe {
            libc::getsockname(
                fd.as_raw_fd(),
                (&mut name as *mut libc::sockaddr_ll).cast(),
                &mut len,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error()).context("getsockname");
        }
        if name.sll_hatype != ARPHRD_ETHER || name.sll_halen != 6 {
            bail!(
                "{iface} is not an Ethernet interface (ARP hardware type {})",
                name.sll_hatype
            );
        }
        let mut mac = [0u8; 6];
        mac.copy_from_slice(&name.sll_addr[..6]);
        // SAFETY: the socket is owned by the AsyncFd from here on and is
        // neither replaced nor closed while registered.
        let fd = unsafe { AsyncFd::register(fd) }.context("registering the packet socket")?;
        Ok(PacketSocket { fd, ifindex, mac })
    }
}

impl PacketIo for PacketSocket {
    fn mac(&self) -> [u8; 6] {
        self.mac
    }

    async fn send(&mut self, frame: &[u8]) -> io::Result<()> {
        let mut to = sockaddr(self.ifindex, ETH_P_ARP);
        to.sll_halen = 6;
        if let Some(dst) = frame.get(..6) {
            to.sll_addr[..6].copy_from_slice(dst);
        }
        loop {
            let mut guard = self.fd.writable().await?;
            let sent = guard.try_io(|fd| {
                // SAFETY: the frame and `to` outlive the call.
                let n = unsafe {
                    libc::sendto(
                        fd.as_raw_fd(),
                        frame.as_ptr().cast(),
                        frame.len(),
                        0,
                        (&to as *const libc::sockaddr_ll).cast(),
                        size_of::<libc::sockaddr_ll>() as u32,
                    )
                };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(())
                }
            });
            match sent {
                Ok(r) => return r,
                Err(_would_block) => continue,
            }
        }
    }

    async fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let mut guard = self.fd.readable().await?;
            let got = guard.try_io(|fd| {
                let mut from = sockaddr(0, 0);
                let mut len = size_of::<libc::sockaddr_ll>() as u32;
                // SAFETY: `buf` and `from` are writable for the lengths given.
                let n = unsafe {
                    libc::recvfrom(
                        fd.as_raw_fd(),
                        buf.as_mut_ptr().cast(),
                        buf.len(),
                        0,
                        (&mut from as *mut libc::sockaddr_ll).cast(),
                        &mut len,
                    )
                };
                if n < 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok((n as usize, from.sll_pkttype))
            });
            match got {
                // Our own transmissions (and the kernel's ARP requests) come
                // back as outgoing: not what the segment said.
                Ok(Ok((_, pkttype))) if pkttype == libc::PACKET_OUTGOING => continue,
                Ok(Ok((n, _))) => return Ok(n),
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
    }
}
