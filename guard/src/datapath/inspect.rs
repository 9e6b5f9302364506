//! What a guard left in the kernel, read without loading anything: its
//! pinned maps and links (file permission on the pins is enough), and the
//! programs on an interface's TC egress (listing TCX programs by name needs
//! CAP_NET_ADMIN and CAP_SYS_ADMIN; netlink filters need nothing). For
//! `arp-guard doctor`.

use std::{
    collections::BTreeMap,
    net::{Ipv4Addr, Ipv6Addr},
    path::Path,
};

use aya::{
    maps::{Array, HashMap, Map, MapData},
    programs::{SchedClassifier, TcAttachType},
};
use futures::TryStreamExt as _;
use guard_common::{
    Config, IpKey, LbEntry, Ownership, MAP_CONFIG, MAP_HEARTBEAT, MAP_LB_IPS, MAP_LB_IPS6,
};
use netlink_packet_route::tc::{TcAttribute, TcFilterBpfOption, TcOption};

use super::{
    attach::{NETLINK_HANDLE, NETLINK_PRIORITY},
    error::{Blame as _, BoxError, DatapathError, Result},
    pins::map_path,
    PROGRAM,
};

/// LB IPs read from a pinned map at most (the map's largest capacity).
const MAX_LB_READ: usize = 1_048_576;

/// What the pins under a `--pin-dir` hold.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Pinned {
    pub config: Option<Config>,
    /// The daemon's last heartbeat (CLOCK_MONOTONIC ns), 0 if none yet.
    pub heartbeat_ns: Option<u64>,
    /// The LB IP map: each IP with its state.
    pub lb: Option<BTreeMap<Ipv4Addr, Ownership>>,
    /// The IPv6 LB IP map, likewise (None: not pinned, as by a guard that
    /// never guarded an IPv6 LB IP, or unreadable).
    pub lb6: Option<BTreeMap<Ipv6Addr, Ownership>>,
    /// Interfaces (by index) with a pinned TCX link.
    pub links: Vec<u32>,
    /// What could not be read, one sentence each.
    pub problems: Vec<String>,
}

/// Read the pins under `dir`. Err only if the directory cannot be listed;
/// a map that cannot be opened is a problem noted in the result.
pub fn read_pinned(dir: &Path) -> Result<Pinned> {
    let entries = std::fs::read_dir(dir).at_path("reading", dir)?;
    let mut out = Pinned::default();
    for e in entries.flatten().take(4096) {
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(index) = name.strip_prefix("link_").and_then(|i| i.parse().ok()) {
            out.links.push(index);
        }
    }
    out.links.sort_unstable();
    let open = |name: &str| -> Result<MapData> {
        let path = map_path(dir, name);
        MapData::from_pin(&path).at_path("opening", &path)
    };
    let mut note = |r: Result<()>| {
        if let Err(e) = r {
            out_problem(&mut out.problems, e);
        }
    };
    let mut config = None;
    note((|| {
        let a: Array<MapData, Config> = Array::try_from(Map::Array(open(MAP_CONFIG)?))?;
        config = Some(a.get(&0, 0)?);
        Ok(())
    })());
    let mut heartbeat = None;
    note((|| {
        let a: Array<MapData, u64> = Array::try_from(Map::Array(open(MAP_HEARTBEAT)?))?;
        heartbeat = Some(a.get(&0, 0)?);
        Ok(())
    })());
    let mut lb = None;
    note((|| {
        let m: HashMap<MapData, u32, LbEntry> = HashMap::try_from(Map::HashMap(open(MAP_LB_IPS)?))?;
        let mut ips = BTreeMap::new();
        for item in m.iter().take(MAX_LB_READ) {
            let (ip, entry) = item?;
            let state = Ownership::from_u8(entry.state).unwrap_or(Ownership::Unknown);
            ips.insert(Ipv4Addr::from(ip), state);
        }
        lb = Some(ips);
        Ok(())
    })());
    let mut lb6 = None;
    if map_path(dir, MAP_LB_IPS6).exists() {
        note((|| {
            let m: HashMap<MapData, IpKey, LbEntry> =
                HashMap::try_from(Map::HashMap(open(MAP_LB_IPS6)?))?;
            let mut ips = BTreeMap::new();
            for item in m.iter().take(MAX_LB_READ) {
                let (ip, entry) = item?;
                let state = Ownership::from_u8(entry.state).unwrap_or(Ownership::Unknown);
                ips.insert(Ipv6Addr::from(ip), state);
            }
            lb6 = Some(ips);
            Ok(())
        })());
    }
    out.config = config;
    out.heartbeat_ns = heartbeat;
    out.lb = lb;
    out.lb6 = lb6;
    Ok(out)
}

fn out_problem(problems: &mut Vec<String>, e: DatapathError) {
    let mut text = e.to_string();
    let mut cur = std::error::Error::source(&e);
    while let Some(s) = cur {
        text = format!("{text}: {s}");
        cur = s.source();
    }
    problems.push(text);
}

/// The programs on `iface`'s TCX egress, in the order they run (their
/// names as the kernel keeps them: 15 characters).
pub fn tcx_egress(iface: &str) -> Result<Vec<String>> {
    let (_, progs) = match SchedClassifier::query_tcx(iface, TcAttachType::Egress) {
        Ok(p) => p,
        // A kernel before 6.6 does not know the TCX attach type: no TCX
        // program can run there (the VM lane's 5.10 and 6.1 answer so).
        Err(e) if super::error::errno(&e) == Some(libc::EINVAL) => return Ok(Vec::new()),
        Err(e) => return Err(e).on_iface("listing the TCX egress programs of", iface),
    };
    Ok(progs
        .iter()
        .map(|p| p.name_as_str().unwrap_or("?").to_owned())
        .collect())
}

/// Whether a (kernel-truncated) program name is arp-guard's.
pub fn is_guard_program(name: &str) -> bool {
    name.len() >= 8 && PROGRAM.starts_with(name)
}

/// A BPF filter on a clsact egress hook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetlinkFilter {
    pub priority: u16,
    pub handle: u32,
    pub program: String,
    /// The program's id, when the kernel reports it.
    pub id: Option<u32>,
}

impl NetlinkFilter {
    /// In arp-guard's fixed slot, running arp-guard's program.
    pub fn is_guard(&self) -> bool {
        self.priority == NETLINK_PRIORITY
            && self.handle == u32::from(NETLINK_HANDLE)
            && is_guard_program(&self.program)
    }
}

/// The BPF filters on the clsact egress of interface `ifindex`, in the
/// order the kernel lists them (by priority). No clsact qdisc: none.
pub async fn netlink_egress(ifindex: u32) -> Result<Vec<NetlinkFilter>> {
    let dump_error = |e: BoxError| DatapathError::FilterDump { ifindex, source: e };
    let (conn, handle, _) = rtnetlink::new_connection().map_err(|e| dump_error(e.into()))?;
    let task = tokio::spawn(conn);
    let index = i32::try_from(ifindex)
        .map_err(|_| DatapathError::NoInterface(format!("ifindex:{ifindex}")))?;
    let mut dump = handle.traffic_filter(index).get().egress().execute();
    let mut out = Vec::new();
    let result = loop {
        match dump.try_next().await {
            Ok(Some(msg)) => {
                let (mut program, mut id) = (None, None);
                for a in &msg.attributes {
                    if let TcAttribute::Options(opts) = a {
                        for o in opts {
                            match o {
                                TcOption::Bpf(TcFilterBpfOption::ProgName(n)) => {
                                    program = Some(n.clone())
                                }
                                TcOption::Bpf(TcFilterBpfOption::ProgId(i)) => id = Some(*i),
                                _ => {}
                            }
                        }
                    }
                }
                if let Some(program) = program {
                    out.push(NetlinkFilter {
                        priority: (msg.header.info >> 16) as u16,
                        handle: u32::from(msg.header.handle.major) << 16
                            | u32::from(msg.header.handle.minor),
                        program,
                        id,
                    });
                }
            }
            Ok(None) => break Ok(out),
            // No clsact qdisc on the device: the kernel answers EINVAL.
            Err(rtnetlink::Error::NetlinkError(e))
                if e.raw_code().abs() == libc::EINVAL || e.raw_code().abs() == libc::ENOENT =>
            {
                break Ok(Vec::new())
            }
            Err(e) => break Err(dump_error(e.into())),
        }
    };
    task.abort();
    result
}
