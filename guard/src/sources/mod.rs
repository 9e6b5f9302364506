//! Where ownership facts come from: the operator's file, the addresses on
//! interfaces (kube-ipvs0), and the Kubernetes API. Each source keeps a
//! typed fact (see `model`) current on a watch channel.

pub mod addrs;
pub mod cluster;
pub mod file;
pub mod file_watch;
pub mod own_node;
pub mod presence;
pub mod report;
pub mod uplink_hints;
