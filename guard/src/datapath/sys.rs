//! The few libc calls the guard makes about the host: the clock the BPF
//! program reads, and interface names and indexes.

use crate::datapath::error::DatapathError;

/// CLOCK_MONOTONIC in ns: the clock bpf_ktime_get_ns reads.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Every interface name in this network namespace.
pub fn interface_names() -> Vec<String> {
    let mut out = Vec::new();
    // SAFETY: if_nameindex returns an array terminated by a zero entry, freed below.
    unsafe {
        let list = libc::if_nameindex();
        if list.is_null() {
            return out;
        }
        let mut p = list;
        while (*p).if_index != 0 {
            out.push(
                std::ffi::CStr::from_ptr((*p).if_name)
                    .to_string_lossy()
                    .into_owned(),
            );
            p = p.add(1);
        }
        libc::if_freenameindex(list);
    }
    out
}

/// Check that `iface` exists in this network namespace.
pub fn ifindex(iface: &str) -> Result<u32, DatapathError> {
    let name =
        std::ffi::CString::new(iface).map_err(|_| DatapathError::NoInterface(iface.to_owned()))?;
    // SAFETY: `name` is a valid NUL-terminated string for the duration of the call.
    let idx = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if idx == 0 {
        return Err(DatapathError::NoInterface(iface.to_owned()));
    }
    Ok(idx)
}

/// The name of `ifindex` in this network namespace, if it still exists.
pub fn ifname(ifindex: u32) -> Option<String> {
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: buf has IF_NAMESIZE bytes as if_indextoname requires.
    let p = unsafe { libc::if_indextoname(ifindex, buf.as_mut_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: on success the buffer holds a NUL-terminated name.
    Some(
        unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned(),
    )
}

/// The MAC address of every Ethernet-like interface in this network
/// namespace (getifaddrs' AF_PACKET entries: no /sys needed).
pub fn link_macs() -> Vec<[u8; 6]> {
    link_macs_by_index().into_values().collect()
}

/// [`link_macs`], by interface index.
pub fn link_macs_by_index() -> std::collections::BTreeMap<u32, [u8; 6]> {
    link_addrs_by_index().macs
}

/// What the active census sends from: every interface's MAC and IPv6
/// link-local address, by interface index.
#[derive(Debug, Default)]
pub struct LinkAddrs {
    pub macs: std::collections::BTreeMap<u32, [u8; 6]>,
    /// fe80::/10, the first one listed wins.
    pub link_locals: std::collections::BTreeMap<u32, std::net::Ipv6Addr>,
}

/// [`LinkAddrs`] from one walk of getifaddrs (a node with a veth per pod
/// lists hundreds of entries; the census reads them every plan).
pub fn link_addrs_by_index() -> LinkAddrs {
    let mut out = LinkAddrs::default();
    each_address(|ifa| match ifa {
        Address::Link { ifindex, mac } => {
            out.macs.insert(ifindex, mac);
        }
        Address::V6 { ifindex, ip } => {
            if ip.segments()[0] & 0xffc0 == 0xfe80 {
                out.link_locals.entry(ifindex).or_insert(ip);
            }
        }
    });
    out
}

/// One entry of getifaddrs that the guard reads.
enum Address {
    /// An Ethernet-like link and its MAC (AF_PACKET, no /sys needed).
    Link { ifindex: u32, mac: [u8; 6] },
    V6 {
        ifindex: u32,
        ip: std::net::Ipv6Addr,
    },
}

/// Call `f` with every link and IPv6 address getifaddrs lists (nothing
/// when it fails).
fn each_address(mut f: impl FnMut(Address)) {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list` with a linked list we free below; an
    // AF_PACKET entry's address is a sockaddr_ll, an AF_INET6 one's a
    // sockaddr_in6; the names are NUL-terminated.
    unsafe {
        if libc::getifaddrs(&mut list) != 0 {
            return;
        }
        let mut p = list;
        while !p.is_null() {
            let a = (*p).ifa_addr;
            let family = if a.is_null() {
                -1
            } else {
                i32::from((*a).sa_family)
            };
            if family == libc::AF_PACKET {
                let ll = &*(a as *const libc::sockaddr_ll);
                if ll.sll_halen == 6 {
                    let mut mac = [0u8; 6];
                    mac.copy_from_slice(&ll.sll_addr[..6]);
                    f(Address::Link {
                        ifindex: ll.sll_ifindex as u32,
                        mac,
                    });
                }
            } else if family == libc::AF_INET6 {
                let sin6 = &*(a as *const libc::sockaddr_in6);
                let ifindex = libc::if_nametoindex((*p).ifa_name);
                if ifindex != 0 {
                    f(Address::V6 {
                        ifindex,
                        ip: std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                    });
                }
            }
            p = (*p).ifa_next;
        }
        libc::freeifaddrs(list);
    }
}

/// Give the allocator's free memory back to the system (after a relist:
/// its pages, freed, would otherwise stay resident).
pub fn release_free() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim takes no pointer and only returns free memory.
    unsafe {
        libc::malloc_trim(0);
    }
}
