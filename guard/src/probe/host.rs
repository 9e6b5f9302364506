//! The real [`Host`]: the kernel's neighbour table for the probed interface
//! through rtnetlink (ARP entries for IPv4 targets, NDP ones for IPv6), and
//! TCP connects bound to that interface.

use std::{
    collections::{HashMap, HashSet},
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    time::Duration,
};

use anyhow::{Context as _, Result};
use futures::TryStreamExt as _;
use netlink_packet_route::{
    address::{AddressAttribute, AddressFlags},
    neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState},
    AddressFamily,
};
use rtnetlink::Handle;

use super::{ConnectError, Host, Neighbour};

/// CAP_NET_ADMIN: changing the neighbour table.
pub const CAP_NET_ADMIN: u32 = 12;

/// The probing host, on one interface.
pub struct NetHost {
    handle: Handle,
    ifindex: u32,
    iface: String,
}

impl NetHost {
    /// Needs a tokio runtime (the netlink connection runs as a task).
    pub fn open(iface: &str) -> Result<Self> {
        let ifindex = crate::datapath::sys::ifindex(iface)
            .map_err(|_| anyhow::anyhow!("no interface {iface:?} in this network namespace"))?;
        let (conn, handle, _) =
            rtnetlink::new_connection().context("cannot open an rtnetlink socket")?;
        tokio::spawn(conn);
        Ok(NetHost {
            handle,
            ifindex,
            iface: iface.to_owned(),
        })
    }

    /// The interface's primary IPv4 address (its first non-secondary), read
    /// with the interface source's netlink dump.
    pub async fn primary_ipv4(&self) -> Result<Option<Ipv4Addr>> {
        let table = crate::sources::addrs::dump(&self.handle).await?;
        Ok(table
            .v4_of_index(self.ifindex)
            .iter()
            .find(|a| !a.secondary)
            .map(|a| a.addr))
    }

    /// The interface's IPv6 link-local address, the source of the
    /// solicitations: the first one that passed duplicate address
    /// detection (not tentative, not dadfailed), else `None` (IPv6 off, or
    /// `addr_gen_mode none`).
    pub async fn link_local(&self) -> Result<Option<Ipv6Addr>> {
        let mut dump = self
            .handle
            .address()
            .get()
            .set_link_index_filter(self.ifindex)
            .execute();
        let unusable = AddressFlags::Tentative | AddressFlags::Dadfailed;
        while let Some(msg) = dump.try_next().await.context("netlink address dump")? {
            if msg.header.family != AddressFamily::Inet6 || msg.header.index != self.ifindex {
                continue;
            }
            let flags = msg.attributes.iter().find_map(|a| match a {
                AddressAttribute::Flags(f) => Some(*f),
                _ => None,
            });
            let addr = msg.attributes.iter().find_map(|a| match a {
                AddressAttribute::Address(IpAddr::V6(v6)) => Some(*v6),
                _ => None,
            });
            match (addr, flags) {
                (Some(a), f)
                    if a.is_unicast_link_local() && !f.is_some_and(|f| f.intersects(unusable)) =>
                {
                    return Ok(Some(a))
                }
                _ => {}
            }
        }
        Ok(None)
    }
}

fn family(ip: IpAddr) -> AddressFamily {
    match ip {
        IpAddr::V4(_) => AddressFamily::Inet,
        IpAddr::V6(_) => AddressFamily::Inet6,
    }
}

fn neighbour_address(ip: IpAddr) -> NeighbourAddress {
    match ip {
        IpAddr::V4(v4) => NeighbourAddress::Inet(v4),
        IpAddr::V6(v6) => NeighbourAddress::Inet6(v6),
    }
}

/// A netlink failure as an I/O error, EPERM explained.
fn netlink_error(e: rtnetlink::Error, what: &str) -> io::Error {
    let e = match e {
        rtnetlink::Error::NetlinkError(m) => m.to_io(),
        other => io::Error::other(other.to_string()),
    };
    if e.raw_os_error() == Some(libc::EPERM) {
        return io::Error::new(
            e.kind(),
            format!(
                "{what}: changing the neighbour table (--neigh flush or pin) needs CAP_NET_ADMIN"
            ),
        );
    }
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

fn entry(msg: &NeighbourMessage) -> Option<(IpAddr, Neighbour)> {
    let ip = msg.attributes.iter().find_map(|a| match a {
        NeighbourAttribute::Destination(NeighbourAddress::Inet(ip)) => Some(IpAddr::V4(*ip)),
        NeighbourAttribute::Destination(NeighbourAddress::Inet6(ip)) => Some(IpAddr::V6(*ip)),
        _ => None,
    })?;
    let mac = msg.attributes.iter().find_map(|a| match a {
        NeighbourAttribute::LinkLayerAddress(l) => <[u8; 6]>::try_from(l.as_slice()).ok(),
        _ => None,
    })?;
    let state = msg.header.state;
    if matches!(
        state,
        NeighbourState::Incomplete | NeighbourState::Failed | NeighbourState::None
    ) {
        return None;
    }
    let permanent = state == NeighbourState::Permanent;
    Some((ip, Neighbour { mac, permanent }))
}

impl Host for NetHost {
    async fn neighbours(&self, wanted: &HashSet<IpAddr>) -> io::Result<HashMap<IpAddr, Neighbour>> {
        let mut out = HashMap::new();
        // One dump per family asked about (ARP, NDP).
        for (v6, family) in [(false, AddressFamily::Inet), (true, AddressFamily::Inet6)] {
            if !wanted.iter().any(|ip| ip.is_ipv6() == v6) {
                continue;
            }
            let mut dump = self
                .handle
                .neighbours()
                .get()
                .set_address_family(family)
                .execute();
            while let Some(msg) = dump
                .try_next()
                .await
                .map_err(|e| netlink_error(e, "reading the neighbour table"))?
            {
                if msg.header.ifindex != self.ifindex {
                    continue;
                }
                if let Some((ip, n)) = entry(&msg).filter(|(ip, _)| wanted.contains(ip)) {
                    out.insert(ip, n);
                }
            }
        }
        Ok(out)
    }

    async fn flush(&self, ip: IpAddr) -> io::Result<()> {
        let mut msg = NeighbourMessage::default();
        msg.header.family = family(ip);
        msg.header.ifindex = self.ifindex;
        msg.attributes
            .push(NeighbourAttribute::Destination(neighbour_address(ip)));
        match self.handle.neighbours().del(msg).execute().await {
            Ok(()) => Ok(()),
            Err(e) => {
                let e = netlink_error(e, &format!("deleting the neighbour entry of {ip}"));
                if e.kind() == io::ErrorKind::NotFound {
                    Ok(())
                } else {
                    Err(e)
                }
            }
        }
    }

    async fn pin(&self, ip: IpAddr, mac: [u8; 6]) -> io::Result<()> {
        self.handle
            .neighbours()
            .add(self.ifindex, ip)
            .link_layer_address(&mac)
            .state(NeighbourState::Permanent)
            .replace()
            .execute()
            .await
            .map_err(|e| netlink_error(e, &format!("pinning {ip}")))
    }

    async fn connect(&self, ip: IpAddr, port: u16, timeout: Duration) -> Result<(), ConnectError> {
        let attempt = async {
            let socket = match ip {
                IpAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
                IpAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
            };
            // Out of the probed interface, whatever the routes say.
            socket.bind_device(Some(self.iface.as_bytes()))?;
            socket.connect(SocketAddr::from((ip, port))).await
        };
        match tokio::time::timeout(timeout, attempt).await {
            Err(_) => Err(ConnectError::TimedOut),
            Ok(Ok(_stream)) => Ok(()),
            Ok(Err(e)) => Err(match e.kind() {
                io::ErrorKind::ConnectionRefused => ConnectError::Refused,
                io::ErrorKind::TimedOut => ConnectError::TimedOut,
                io::ErrorKind::HostUnreachable | io::ErrorKind::NetworkUnreachable => {
                    ConnectError::Unreachable
                }
                _ => ConnectError::Other,
            }),
        }
    }
}
