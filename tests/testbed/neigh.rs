//! A namespace's neighbour entry read over rtnetlink, in the test's own
//! process. The tests poll the neighbour cache (every 20 ms while they wait
//! for an entry, for seconds where none must come): `ip neigh show` in that
//! loop was most of some tests' time, under the VM lane's emulation most of
//! all (each run of `ip` loads eight shared libraries), and a large part of
//! the CPU of a whole `cargo xtask test`.

use std::net::IpAddr;

use anyhow::{bail, ensure, Context as _, Result};

const RTM_NEWNEIGH: u16 = 28;
const RTM_GETNEIGH: u16 = 30;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_DUMP: u16 = 0x300;
const NDA_DST: u16 = 1;
const NDA_LLADDR: u16 = 2;
/// `struct nlmsghdr` and `struct ndmsg`.
const NLMSG_HDR: usize = 16;
const NDMSG: usize = 12;

/// The kernel's NUD_* states, in bit order, as `ip neigh` names them.
const STATES: [&str; 8] = [
    "INCOMPLETE",
    "REACHABLE",
    "STALE",
    "DELAY",
    "PROBE",
    "FAILED",
    "NOARP",
    "PERMANENT",
];
const NUD_NOARP: u16 = 0x40;

/// The entry for `ip` on `ifindex` in the calling thread's namespace:
/// (lladdr, state), as `ip neigh show to <ip> dev <iface>` shows it (the
/// last state name it prints; entries `ip` hides, NOARP and NONE, are none).
pub(crate) fn entry(ifindex: u32, ip: IpAddr) -> Result<Option<(Option<[u8; 6]>, String)>> {
    let (family, want): (u8, Vec<u8>) = match ip {
        IpAddr::V4(a) => (libc::AF_INET as u8, a.octets().to_vec()),
        IpAddr::V6(a) => (libc::AF_INET6 as u8, a.octets().to_vec()),
    };
    let sock = Socket::open()?;
    let mut req = [0u8; NLMSG_HDR + NDMSG];
    req[0..4].copy_from_slice(&((NLMSG_HDR + NDMSG) as u32).to_ne_bytes());
    req[4..6].copy_from_slice(&RTM_GETNEIGH.to_ne_bytes());
    req[6..8].copy_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    req[8..12].copy_from_slice(&1u32.to_ne_bytes());
    req[NLMSG_HDR] = family;
    sock.send(&req)?;
    let mut found = None;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = sock.recv(&mut buf)?;
        let mut msgs = &buf[..n];
        while msgs.len() >= NLMSG_HDR {
            let len = u32::from_ne_bytes(msgs[0..4].try_into()?) as usize;
            let kind = u16::from_ne_bytes(msgs[4..6].try_into()?);
            ensure!(
                (NLMSG_HDR..=msgs.len()).contains(&len),
                "a netlink message of {len} bytes"
            );
            match kind {
                NLMSG_DONE => return Ok(found),
                NLMSG_ERROR => {
                    ensure!(len >= NLMSG_HDR + 4, "a short netlink error");
                    let errno = i32::from_ne_bytes(msgs[16..20].try_into()?);
                    bail!(
                        "RTM_GETNEIGH: {}",
                        std::io::Error::from_raw_os_error(-errno)
                    );
                }
                RTM_NEWNEIGH if found.is_none() => {
                    found = matching(&msgs[NLMSG_HDR..len], ifindex, &want)?;
                }
                _ => {}
            }
            msgs = &msgs[align(len).min(msgs.len())..];
        }
    }
}

/// One RTM_NEWNEIGH's body, if it is the entry asked for and `ip` shows it.
fn matching(body: &[u8], ifindex: u32, want: &[u8]) -> Result<Option<(Option<[u8; 6]>, String)>> {
    ensure!(body.len() >= NDMSG, "a short ndmsg");
    let index = i32::from_ne_bytes(body[4..8].try_into()?);
    let state = u16::from_ne_bytes(body[8..10].try_into()?);
    // What `ip neigh show` leaves out unless asked: NOARP and NONE.
    if index as u32 != ifindex || state & 0xff & !NUD_NOARP == 0 {
        return Ok(None);
    }
    let (mut dst, mut lladdr) = (None, None);
    let mut attrs = &body[NDMSG..];
    while attrs.len() >= 4 {
        let len = u16::from_ne_bytes(attrs[0..2].try_into()?) as usize;
        let kind = u16::from_ne_bytes(attrs[2..4].try_into()?);
        ensure!((4..=attrs.len()).contains(&len), "an rtattr of {len} bytes");
        let data = &attrs[4..len];
        match kind {
            NDA_DST => dst = Some(data),
            NDA_LLADDR if data.len() == 6 => lladdr = Some(<[u8; 6]>::try_from(data)?),
            _ => {}
        }
        attrs = &attrs[align(len).min(attrs.len())..];
    }
    if dst != Some(want) {
        return Ok(None);
    }
    let name = (0..8)
        .rev()
        .find(|b| state & (1 << b) != 0)
        .map_or("NONE", |b| STATES[b]);
    Ok(Some((lladdr, name.to_owned())))
}

fn align(len: usize) -> usize {
    (len + 3) & !3
}

/// A NETLINK_ROUTE socket of the calling thread's namespace.
struct Socket(std::os::fd::OwnedFd);

impl Socket {
    fn open() -> Result<Self> {
        use std::os::fd::FromRawFd as _;
        // SAFETY: socket(2) with constant arguments; the fd is checked, then owned.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error()).context("a netlink socket");
        }
        // SAFETY: fd is a new, valid descriptor nobody else owns.
        Ok(Socket(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }))
    }

    fn send(&self, msg: &[u8]) -> Result<()> {
        use std::os::fd::AsRawFd as _;
        // SAFETY: msg is a valid buffer of msg.len() bytes; a null address
        // sends to the kernel (the socket is unbound, its peer is pid 0).
        let n = unsafe { libc::send(self.0.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) };
        ensure!(
            n == msg.len() as isize,
            "sending RTM_GETNEIGH: {}",
            std::io::Error::last_os_error()
        );
        Ok(())
    }

    fn recv(&self, buf: &mut [u8]) -> Result<usize> {
        use std::os::fd::AsRawFd as _;
        // SAFETY: buf is a valid, writable buffer of buf.len() bytes.
        let n = unsafe { libc::recv(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(std::io::Error::last_os_error()).context("reading the neighbour dump");
        }
        Ok(n as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(kind: u16, data: &[u8]) -> Vec<u8> {
        let mut a = Vec::new();
        a.extend(((4 + data.len()) as u16).to_ne_bytes());
        a.extend(kind.to_ne_bytes());
        a.extend(data);
        a.resize(align(a.len()), 0);
        a
    }

    fn body(ifindex: i32, state: u16, dst: &[u8], mac: Option<[u8; 6]>) -> Vec<u8> {
        let mut b = vec![libc::AF_INET as u8, 0, 0, 0];
        b.extend(ifindex.to_ne_bytes());
        b.extend(state.to_ne_bytes());
        b.extend([0, 0]);
        b.extend(attr(NDA_DST, dst));
        if let Some(m) = mac {
            b.extend(attr(NDA_LLADDR, &m));
        }
        b
    }

    #[test]
    fn an_entry_is_matched_by_device_and_address_and_named_as_ip_names_it() {
        let ip = [198, 51, 100, 7];
        let mac = [2, 0, 0, 0, 0, 9];
        let stale = body(3, 0x04, &ip, Some(mac));
        assert_eq!(
            matching(&stale, 3, &ip).unwrap(),
            Some((Some(mac), "STALE".into()))
        );
        assert_eq!(matching(&stale, 4, &ip).unwrap(), None, "another device");
        assert_eq!(matching(&stale, 3, &[198, 51, 100, 8]).unwrap(), None);
        let incomplete = body(3, 0x01, &ip, None);
        assert_eq!(
            matching(&incomplete, 3, &ip).unwrap(),
            Some((None, "INCOMPLETE".into()))
        );
        // Hidden by `ip neigh show`: NOARP and NONE.
        assert_eq!(matching(&body(3, 0x40, &ip, None), 3, &ip).unwrap(), None);
        assert_eq!(matching(&body(3, 0, &ip, None), 3, &ip).unwrap(), None);
        assert!(matching(&[0u8; 5], 3, &ip).is_err(), "short");
    }
}
