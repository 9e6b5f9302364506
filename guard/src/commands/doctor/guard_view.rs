//! The running guard as doctor can see it: its API's status document, else
//! what its pins hold, and the programs on each interface's TC egress.
//! Whatever cannot be seen (no daemon, no permission) is noted, never fatal.

use std::{
    collections::BTreeMap,
    net::{Ipv4Addr, Ipv6Addr, SocketAddr},
    path::Path,
    time::Duration,
};

use guard_common::{Mode, Ownership};

use crate::{
    api::{client, types::StatusDoc},
    datapath::{
        error::errno,
        inspect::{self, NetlinkFilter, Pinned},
        monotonic_ns,
    },
    telemetry::status::{Interface, InterfaceState},
};

/// The programs on one interface's egress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain {
    /// TCX programs in the order they run (names), or why unknown.
    pub tcx: Result<Vec<String>, String>,
    /// BPF filters on the clsact egress (they run after every TCX program).
    pub netlink: Result<Vec<NetlinkFilter>, String>,
}

/// How an interface carries the guard, as far as can be seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attached {
    /// The daemon says so (state and detail: tcx, netlink-clsact, the error).
    Daemon(InterfaceState, String),
    /// A pinned TCX link for it under --pin-dir.
    PinnedLink,
    /// Found in the kernel's TC egress (`tcx` or `netlink-clsact`).
    Kernel(&'static str),
    /// Not there by any means looked at.
    No,
}

#[derive(Debug, Clone, Default)]
pub struct GuardView {
    pub api: String,
    pub pin_dir: String,
    /// What was tried and did not work, one sentence each.
    pub tried: Vec<String>,
    pub status: Option<StatusDoc>,
    pub pinned: Option<Pinned>,
    /// CLOCK_MONOTONIC when the pins were read (the heartbeat's clock).
    pub now_ns: u64,
    pub chains: BTreeMap<String, Chain>,
}

impl GuardView {
    /// Ask the daemon's API; read the pins too when it does not answer.
    pub async fn read(api: SocketAddr, pin_dir: &Path) -> Self {
        let mut v = GuardView {
            api: api.to_string(),
            pin_dir: pin_dir.display().to_string(),
            now_ns: monotonic_ns(),
            ..Default::default()
        };
        match client::get(api, "/status").await {
            Ok((200, body)) => match serde_json::from_str::<StatusDoc>(&body) {
                Ok(doc) => v.status = Some(doc),
                Err(e) => v.tried.push(format!(
                    "the API on {api} answered /status with what this arp-guard cannot read ({e})"
                )),
            },
            Ok((code, body)) => v.tried.push(format!(
                "the API on {api} answered {code}: {}",
                body.trim().chars().take(200).collect::<String>()
            )),
            Err(e) => v.tried.push(format!("{e:#}")),
        }
        if v.status.is_none() {
            match inspect::read_pinned(pin_dir) {
                Ok(p) => {
                    for problem in &p.problems {
                        v.tried.push(format!("pins: {problem}"));
                    }
                    v.pinned = Some(p);
                }
                Err(e) => v.tried.push(format!("pins: {}", chain_text(&e))),
            }
        }
        v
    }

    /// List the TC egress programs of each interface (name, ifindex).
    pub async fn read_chains(&mut self, ifaces: &[(String, Option<u32>)]) {
        for (name, index) in ifaces {
            let tcx = inspect::tcx_egress(name).map_err(|e| match errno(&e) {
                Some(libc::EPERM) | Some(libc::EACCES) => {
                    "listing TCX programs by name needs CAP_NET_ADMIN and CAP_SYS_ADMIN (root)"
                        .to_owned()
                }
                _ => chain_text(&e),
            });
            let netlink = match index {
                Some(i) => inspect::netlink_egress(*i)
                    .await
                    .map_err(|e| chain_text(&e)),
                None => Err("no ifindex".to_owned()),
            };
            self.chains.insert(name.clone(), Chain { tcx, netlink });
        }
    }

    /// Whether a guard was seen at all (API, or pinned maps or links; a
    /// guard of another version may have a CONFIG this build cannot read).
    pub fn seen(&self) -> bool {
        self.status.is_some()
            || self
                .pinned
                .as_ref()
                .is_some_and(|p| p.config.is_some() || p.lb.is_some() || !p.links.is_empty())
    }

    /// The IPv4 LB IPs the guard enforces (the ARP checks' subject), with
    /// their state.
    pub fn lb(&self) -> Option<BTreeMap<Ipv4Addr, Ownership>> {
        if let Some(doc) = &self.status {
            let v4 = doc.ips.iter().filter_map(|r| match r.ip {
                std::net::IpAddr::V4(v4) => Some((v4, r.entry.state)),
                std::net::IpAddr::V6(_) => None,
            });
            return Some(v4.collect());
        }
        self.pinned.as_ref()?.lb.clone()
    }

    /// The IPv6 LB IPs the guard enforces, with their state: from its API,
    /// else from its pins (as the IPv4 ones).
    pub fn lb6(&self) -> Option<BTreeMap<Ipv6Addr, Ownership>> {
        if let Some(doc) = &self.status {
            let v6 = doc.ips.iter().filter_map(|r| match r.ip {
                std::net::IpAddr::V6(v6) => Some((v6, r.entry.state)),
                std::net::IpAddr::V4(_) => None,
            });
            return Some(v6.collect());
        }
        self.pinned.as_ref()?.lb6.clone()
    }

    /// `enforce` or `monitor`.
    pub fn mode(&self) -> Option<String> {
        if let Some(st) = self.status.as_ref().and_then(|d| d.status.as_ref()) {
            return Some(st.mode.clone());
        }
        let c = self.pinned.as_ref()?.config?;
        Mode::from_u8(c.mode).map(|m| m.as_str().to_owned())
    }

    /// The age of the heartbeat in the pinned maps, with the gate's
    /// thresholds (stale, dead): None without pins or before the first.
    pub fn heartbeat(&self) -> Option<(Duration, Duration, Duration)> {
        let p = self.pinned.as_ref()?;
        let (hb, c) = (p.heartbeat_ns.filter(|h| *h > 0)?, p.config?);
        Some((
            Duration::from_nanos(self.now_ns.saturating_sub(hb)),
            Duration::from_nanos(c.stale_after_ns),
            Duration::from_nanos(c.dead_after_ns),
        ))
    }

    /// The daemon's record of its interfaces.
    pub fn interfaces(&self) -> Option<&[Interface]> {
        Some(&self.status.as_ref()?.status.as_ref()?.interfaces)
    }

    /// How `iface` (index `ifindex`) carries the guard.
    pub fn attached(&self, iface: &str, ifindex: Option<u32>) -> Attached {
        if let Some(ifs) = self.interfaces() {
            if let Some(i) = ifs.iter().find(|i| i.name == iface) {
                return Attached::Daemon(i.state, i.detail.clone());
            }
        }
        if let (Some(p), Some(i)) = (&self.pinned, ifindex) {
            if p.links.contains(&i) {
                return Attached::PinnedLink;
            }
        }
        if let Some(c) = self.chains.get(iface) {
            if c.tcx
                .as_ref()
                .is_ok_and(|t| t.iter().any(|n| inspect::is_guard_program(n)))
            {
                return Attached::Kernel("tcx");
            }
            if c.netlink
                .as_ref()
                .is_ok_and(|f| f.iter().any(NetlinkFilter::is_guard))
            {
                return Attached::Kernel("netlink-clsact");
            }
        }
        Attached::No
    }
}

/// An error with its sources, on one line.
pub fn chain_text(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let t = s.to_string();
        if !text.contains(&t) {
            text = format!("{text}: {t}");
        }
        cur = s.source();
    }
    text
}
