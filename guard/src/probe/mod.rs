//! `arp-guard probe`: ask the segment who answers ARP (IPv4) or Neighbor
//! Discovery (IPv6) for some IPs, over time, from any host on it (the
//! external load balancer's, say), and optionally try TCP through each
//! answer.
//!
//! One successful request proves nothing in an ARP race, so the probe asks
//! every `interval` for a while and keeps, per IP, every MAC that claimed it
//! with counts and first/last times. The logic is pure ([`prober`]); the
//! packet I/O and the host's neighbour table and TCP are behind two small
//! traits ([`PacketIo`], [`Host`]), as MetalLB's layer2 code keeps its
//! announcer apart from the socket, so the whole loop ([`run`]) is
//! unit-tested with fakes and a paused clock. The real ones: an AF_PACKET
//! socket ([`packet`]) and rtnetlink plus tokio's TCP ([`host`]).
//!
//! A tool beside the daemon: it reads interface addresses with the sources'
//! netlink reader and nothing of the daemon; only `commands` and `cli` use it.

pub mod host;
pub mod packet;
pub mod prober;
pub mod report;
mod run;

use std::{
    collections::{HashMap, HashSet},
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    time::Duration,
};

pub use prober::{ConnectError, MAX_IPS};
pub use run::run;

/// What `--neigh` does to the host's neighbour entry around each connect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NeighMode {
    /// Leave it: connect through whatever the host has cached.
    Keep,
    /// Delete it before each connect, so the kernel resolves the IP afresh
    /// and the ARP (or NDP) race decides (the field engineer's loop).
    Flush,
    /// Make it permanent, to each responder in turn, so that each MAC is
    /// tested on its own; removed (or the previous permanent entry put
    /// back) at the end.
    Pin,
}

impl NeighMode {
    pub fn as_str(self) -> &'static str {
        match self {
            NeighMode::Keep => "keep",
            NeighMode::Flush => "flush",
            NeighMode::Pin => "pin",
        }
    }
}

/// The TCP connects of a probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectPlan {
    /// Per probed IP (same order as [`Plan::ips`]): the port, if any.
    pub ports: Vec<Option<u16>>,
    pub timeout: Duration,
    pub neigh: NeighMode,
}

/// What to probe, how often and for how long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// IPv4 (asked with ARP) and IPv6 (asked with Neighbor Solicitations).
    pub ips: Vec<IpAddr>,
    /// The sender IP of the ARP requests (0.0.0.0: RFC 5227 ARP probes).
    pub source: Ipv4Addr,
    /// The source of the Neighbor Solicitations (the interface's
    /// link-local by default); unused without IPv6 targets. Never `::`: a
    /// solicitation from `::` is duplicate address detection, which would
    /// make a node adding the address give it up.
    pub source6: Ipv6Addr,
    pub interval: Duration,
    /// Requests per IP; the probe lasts `rounds` x `interval`.
    pub rounds: u64,
    /// No round starts after this long (connects slower than the interval
    /// stretch the rounds).
    pub duration: Option<Duration>,
    pub connect: Option<ConnectPlan>,
}

/// Frames on one interface. `recv` waits for the next frame and is
/// cancelled (dropped) at each deadline, so it must lose nothing then.
#[allow(async_fn_in_trait)] // run on one thread: no Send bound wanted
pub trait PacketIo {
    /// The interface's MAC: the requests' sender.
    fn mac(&self) -> [u8; 6];
    async fn send(&mut self, frame: &[u8]) -> io::Result<()>;
    /// Copy the next frame into `buf` (truncating it) and return its length.
    async fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize>;
}

/// A neighbour entry of the probing host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Neighbour {
    pub mac: [u8; 6],
    pub permanent: bool,
}

/// The probing host's side of a connect: its neighbour table for the
/// probed interface, and TCP.
#[allow(async_fn_in_trait)] // run on one thread: no Send bound wanted
pub trait Host {
    /// The usable entries (not incomplete or failed) of the IPs in
    /// `wanted` (ARP entries for IPv4, NDP ones for IPv6).
    async fn neighbours(&self, wanted: &HashSet<IpAddr>) -> io::Result<HashMap<IpAddr, Neighbour>>;
    /// Delete the entry for `ip` (none there is fine).
    async fn flush(&self, ip: IpAddr) -> io::Result<()>;
    /// Set a permanent entry `ip` -> `mac`, replacing any.
    async fn pin(&self, ip: IpAddr, mac: [u8; 6]) -> io::Result<()>;
    async fn connect(&self, ip: IpAddr, port: u16, timeout: Duration) -> Result<(), ConnectError>;
}

/// Something the loop reports as it happens (the table output prints them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    NewResponder(prober::NewResponder),
}
