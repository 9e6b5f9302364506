//! arp-guard: keeps bare-metal nodes from answering ARP for LoadBalancer IPs
//! they do not own. The `arp-guard` binary is a thin shell over these modules.

pub mod addrs;
pub mod cli;
pub mod cluster;
pub mod counters;
pub mod datapath;
pub mod file_source;
pub mod interfaces;
pub mod ownership_file;
pub mod pins;
pub mod preflight;
pub mod run;
pub mod status;
pub mod view;
