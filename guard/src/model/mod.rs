//! The pure part: the facts the sources produce, and the view derived from
//! them (what the BPF maps should hold). Nothing here does I/O, so every
//! rule is tested without a kernel, a file or an API server.

pub mod addrs;
pub mod census;
pub mod clients;
pub mod cluster;
pub mod history;
pub mod kube_events;
pub mod ownership;
pub mod presence;
pub mod probing;
pub mod refresh;
pub mod takeover;
pub mod text;
pub mod uplinks;
pub mod view;

/// A MAC address as every output of arp-guard writes it: `aa:bb:cc:dd:ee:ff`.
pub fn fmt_mac(m: &[u8; 6]) -> String {
    let [a, b, c, d, e, f] = m;
    format!("{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{f:02x}")
}
