//! The real [`Host`]: the kernel's neighbour table for the probed interface
//! through rtnetlink, and TCP connects bound to that interface.

use std::{
    collections::{HashMap, HashSet},
    io,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    time::Duration,
};

use anyhow::{Context as _, Result};
use futures::TryStreamExt as _;
use netlink_packet_route::{
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

fn entry(msg: &NeighbourMessage) -> Option<(Ipv4Addr, Neighbour)> {
    let ip = msg.attributes.iter().find_map(|a| match a {
        NeighbourAttribute::Destination(NeighbourAddress::Inet(ip)) => Some(*ip),
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
    async fn neighbours(
        &self,
        wanted: &HashSet<Ipv4Addr>,
    ) -> io::Result<HashMap<Ipv4Addr, Neighbour>> {
        let mut out = HashMap::new();
        let mut dump = self
            .handle
            .neighbours()
            .get()
            .set_address_family(AddressFamily::Inet)
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
        Ok(out)
    }

    async fn flush(&self, ip: Ipv4Addr) -> io::Result<()> {
        let mut msg = NeighbourMessage::default();
        msg.header.family = AddressFamily::Inet;
        msg.header.ifindex = self.ifindex;
        msg.attributes
            .push(NeighbourAttribute::Destination(NeighbourAddress::Inet(ip)));
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

    async fn pin(&self, ip: Ipv4Addr, mac: [u8; 6]) -> io::Result<()> {
        self.handle
            .neighbours()
            .add(self.ifindex, IpAddr::V4(ip))
            .link_layer_address(&mac)
            .state(NeighbourState::Permanent)
            .replace()
            .execute()
            .await
            .map_err(|e| netlink_error(e, &format!("pinning {ip}")))
    }

    async fn connect(
        &self,
        ip: Ipv4Addr,
        port: u16,
        timeout: Duration,
    ) -> Result<(), ConnectError> {
        let attempt = async {
            let socket = tokio::net::TcpSocket::new_v4()?;
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
