//! Types and logic shared by arp-guard's eBPF program and its userspace.
//!
//! Everything that decides what happens to a frame lives here, once:
//! [`parse::parse`] reads an outgoing Ethernet frame (and [`build::write_arp`]
//! writes one, for `arp-guard probe` and the tests), [`verdict::classify`]
//! names the kind of ARP announcement it is, and [`verdict::decide`] turns the
//! facts about it into a verdict. The BPF program calls these functions on the
//! real skb; the host-side unit tests and the differential tests call the very
//! same functions on byte slices.
#![no_std]

pub mod build;
pub mod census;
pub mod clients;
pub mod frame;
pub mod maps;
pub mod ndp;
pub mod ndp_build;
pub mod parse;
pub mod verdict;

pub use census::{
    CensusStat, ResponderKey, ResponderValue, MAP_CENSUS_STATS, MAP_RESPONDERS, MAX_RESPONDERS,
};
pub use clients::{
    ClientKey, ClientStat, ClientValue, MAP_CLIENTS, MAP_CLIENT_STATS, MAP_FOREIGN_FILTER,
    MAX_CLIENTS,
};
pub use frame::{ArpFrame, FrameReader, NdFrame, Parsed};
pub use maps::*;
pub use parse::parse;
pub use verdict::{
    classify, classify_nd, decide, effective_state, judge, liveness, Facts, Judgement, Kind,
    LeakAction, Liveness, Mode, NdClass, Origin, Ownership, Surroundings, Verdict, GUARD_MARK,
};
