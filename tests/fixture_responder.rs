//! The fixtures' Cilium-like ARP responder (TC ingress: turns a request for
//! one of its IPs into the reply and redirects it out), attached in a test
//! namespace. Shared by the tests that need a datapath responder.

use std::net::Ipv4Addr;

use aya::{
    maps::{Array, HashMap},
    programs::{SchedClassifier, TcAttachType},
};
use testbed::{
    tc::{attach_fixture, Position},
    Netns,
};

/// Attach the responder to `iface`'s ingress in `ns`, answering for `ips`
/// with `mac`, first or last among its programs. Detached when the returned
/// object drops.
pub fn attach(
    ns: &Netns,
    iface: &'static str,
    ips: Vec<Ipv4Addr>,
    mac: [u8; 6],
    first: bool,
) -> aya::Ebpf {
    ns.enter(move || {
        let mut ebpf = aya::Ebpf::load(guard::testing::FIXTURES)?;
        let mut respond: HashMap<_, u32, u8> =
            HashMap::try_from(ebpf.map_mut("FIXTURE_RESPOND").unwrap())?;
        for ip in ips {
            respond.insert(u32::from(ip), 1, 0)?;
        }
        let mut m = [0u8; 8];
        m[..6].copy_from_slice(&mac);
        let mut mac_map: Array<_, [u8; 8]> = Array::try_from(ebpf.map_mut("FIXTURE_MAC").unwrap())?;
        mac_map.set(0, m, 0)?;
        let prog: &mut SchedClassifier = ebpf
            .program_mut("fixture_arp_responder")
            .unwrap()
            .try_into()?;
        prog.load()?;
        let pos = if first {
            Position::First
        } else {
            Position::Last
        };
        attach_fixture(prog, iface, TcAttachType::Ingress, pos)?;
        Ok(ebpf)
    })
    .unwrap()
}
