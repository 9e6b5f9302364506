//! The real [`PacketIo`]: AF_PACKET raw sockets bound to one interface,
//! non-blocking, driven by tokio's `AsyncFd`: one for ARP frames (IPv4
//! targets), one for IPv6 frames (IPv6 targets) with a classic BPF filter
//! that lets only what may be Neighbor Discovery reach the probe, so a busy
//! host's IPv6 traffic is not copied to it.

use std::{
    io,
    mem::size_of,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
};

use anyhow::{bail, Context as _, Result};
use guard_common::{
    frame::{ARPHRD_ETHER, ETH_P_ARP},
    ndp::{
        ETH_P_IPV6, ND_NEIGHBOR_ADVERT, ND_NEIGHBOR_SOLICIT, NEXTHDR_DEST, NEXTHDR_HOP,
        NEXTHDR_ICMPV6, NEXTHDR_ROUTING,
    },
};
use tokio::io::unix::{AsyncFd, AsyncFdReadyGuard};

use super::PacketIo;

/// The AF_PACKET sockets of one interface: ARP, IPv6, or both.
#[derive(Debug)]
pub struct PacketSocket {
    arp: Option<AsyncFd<OwnedFd>>,
    ipv6: Option<AsyncFd<OwnedFd>>,
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
            "arp-guard probe sends and receives raw ARP and NDP frames, which needs CAP_NET_RAW \
             (uid {uid} lacks it): run it as root, or grant the capability \
             (`setcap cap_net_raw+ep arp-guard`; in Kubernetes add NET_RAW to the container's \
             securityContext.capabilities)"
        )
    } else {
        anyhow::Error::new(e).context("socket(AF_PACKET, SOCK_RAW)")
    }
}

const fn insn(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// Classic BPF, run by the kernel on each IPv6 frame before it is queued:
/// keep ICMPv6 Neighbor Solicitations and Advertisements, and anything whose
/// first next header is an extension header (the parser follows those);
/// drop the rest. Offsets are in the frame (Ethernet header first).
const ND_FILTER: [libc::sock_filter; 12] = {
    const LDB_ABS: u16 = (libc::BPF_LD | libc::BPF_B | libc::BPF_ABS) as u16;
    const JEQ: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
    const RET: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
    /// Ethernet (14) + the next-header byte of the IPv6 header (6).
    const NEXT_HEADER: u32 = 14 + 6;
    /// Ethernet (14) + the IPv6 header (40): the ICMPv6 type.
    const ICMP_TYPE: u32 = 14 + 40;
    [
        /* 0 */ insn(LDB_ABS, 0, 0, NEXT_HEADER),
        /* 1 */ insn(JEQ, 5, 0, NEXTHDR_ICMPV6 as u32), // -> 7
        /* 2 */ insn(JEQ, 3, 0, NEXTHDR_HOP as u32), // -> 6
        /* 3 */ insn(JEQ, 2, 0, NEXTHDR_ROUTING as u32), // -> 6
        /* 4 */ insn(JEQ, 1, 0, NEXTHDR_DEST as u32), // -> 6
        /* 5 */ insn(RET, 0, 0, 0),
        /* 6 */ insn(RET, 0, 0, u32::MAX),
        /* 7 */ insn(LDB_ABS, 0, 0, ICMP_TYPE),
        /* 8 */ insn(JEQ, 2, 0, ND_NEIGHBOR_SOLICIT as u32), // -> 11
        /* 9 */ insn(JEQ, 1, 0, ND_NEIGHBOR_ADVERT as u32), // -> 11
        /* 10 */ insn(RET, 0, 0, 0),
        /* 11 */ insn(RET, 0, 0, u32::MAX),
    ]
};

/// A non-blocking packet socket bound to `protocol` on `ifindex`, with
/// `filter` attached before it is bound (so nothing unfiltered is queued);
/// returns it with the interface's hardware type and address.
fn open_bound(
    ifindex: i32,
    protocol: u16,
    filter: Option<&[libc::sock_filter]>,
) -> Result<(OwnedFd, libc::sockaddr_ll)> {
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
    if let Some(f) = filter {
        let prog = libc::sock_fprog {
            len: f.len() as u16,
            filter: f.as_ptr().cast_mut(),
        };
        // SAFETY: `prog` points at `f`, valid for the call (the kernel copies it).
        let r = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_ATTACH_FILTER,
                (&prog as *const libc::sock_fprog).cast(),
                size_of::<libc::sock_fprog>() as u32,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error()).context("attaching the NDP filter");
        }
    }
    let sll = sockaddr(ifindex, protocol);
    // SAFETY: `sll` is a valid sockaddr_ll for the length given.
    let r = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&sll as *const libc::sockaddr_ll).cast(),
            size_of::<libc::sockaddr_ll>() as u32,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error()).context("bind");
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
    Ok((fd, name))
}

impl PacketSocket {
    /// Open the packet sockets on `iface` (an Ethernet interface in this
    /// network namespace): ARP when `arp`, IPv6 when `ipv6`. Needs CAP_NET_RAW.
    pub fn open(iface: &str, arp: bool, ipv6: bool) -> Result<Self> {
        let ifindex = crate::datapath::sys::ifindex(iface)
            .map_err(|_| anyhow::anyhow!("no interface {iface:?} in this network namespace"))?;
        let ifindex = i32::try_from(ifindex).context("ifindex")?;
        let mut mac = None;
        let mut open = |wanted: bool, protocol: u16, filter| -> Result<Option<AsyncFd<OwnedFd>>> {
            if !wanted {
                return Ok(None);
            }
            let (fd, name) = open_bound(ifindex, protocol, filter)
                .with_context(|| format!("opening a packet socket on {iface}"))?;
            if name.sll_hatype != ARPHRD_ETHER || name.sll_halen != 6 {
                bail!(
                    "{iface} is not an Ethernet interface (ARP hardware type {})",
                    name.sll_hatype
                );
            }
            let mut m = [0u8; 6];
            m.copy_from_slice(&name.sll_addr[..6]);
            mac = Some(m);
            // SAFETY: the socket is owned by the AsyncFd from here on and is
            // neither replaced nor closed while registered.
            let fd = unsafe { AsyncFd::register(fd) }.context("registering the packet socket")?;
            Ok(Some(fd))
        };
        let arp = open(arp, ETH_P_ARP, None)?;
        let ipv6 = open(ipv6, ETH_P_IPV6, Some(&ND_FILTER[..]))?;
        let Some(mac) = mac else {
            bail!("nothing to probe: no IPv4 or IPv6 target");
        };
        Ok(PacketSocket {
            arp,
            ipv6,
            ifindex,
            mac,
        })
    }
}

/// Readiness of `fd`, or never for a socket not opened.
async fn readable(fd: &Option<AsyncFd<OwnedFd>>) -> io::Result<AsyncFdReadyGuard<'_, OwnedFd>> {
    match fd {
        Some(fd) => fd.readable().await,
        None => std::future::pending().await,
    }
}

/// Read one frame from a ready socket: `None` when there was none after all
/// (readiness cleared) or it was our own transmission.
fn read_ready(
    mut guard: AsyncFdReadyGuard<'_, OwnedFd>,
    buf: &mut [u8],
) -> Option<io::Result<usize>> {
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
        // Our own transmissions (and the kernel's ARP requests) come back
        // as outgoing: not what the segment said.
        Ok(Ok((_, pkttype))) if pkttype == libc::PACKET_OUTGOING => None,
        Ok(Ok((n, _))) => Some(Ok(n)),
        Ok(Err(e)) => Some(Err(e)),
        Err(_would_block) => None,
    }
}

impl PacketIo for PacketSocket {
    fn mac(&self) -> [u8; 6] {
        self.mac
    }

    async fn send(&mut self, frame: &[u8]) -> io::Result<()> {
        let ethertype = match frame.get(12..14) {
            Some(t) => u16::from_be_bytes([t[0], t[1]]),
            None => return Err(io::Error::from(io::ErrorKind::InvalidInput)),
        };
        let fd = match ethertype {
            ETH_P_IPV6 => self.ipv6.as_ref(),
            _ => self.arp.as_ref(),
        }
        .ok_or_else(|| io::Error::new(io::ErrorKind::Unsupported, "no socket for this family"))?;
        let mut to = sockaddr(self.ifindex, ethertype);
        to.sll_halen = 6;
        to.sll_addr[..6].copy_from_slice(&frame[..6]);
        loop {
            let mut guard = fd.writable().await?;
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
        // Cancel-safe: waiting for readiness loses nothing, and a frame is
        // read only once one socket is ready.
        loop {
            let got = tokio::select! {
                g = readable(&self.arp) => read_ready(g?, buf),
                g = readable(&self.ipv6) => read_ready(g?, buf),
            };
            if let Some(r) = got {
                return r;
            }
        }
    }
}
