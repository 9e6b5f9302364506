//! Ownership from the Kubernetes API: which LB IPs exist (Services) and which
//! node owns each (Cilium and kube-vip Leases, MetalLB ServiceL2Status).

pub mod feed;
pub mod model;
pub mod objects;

pub use feed::{ClusterView, FeedConfig};
pub use model::{Announcer, Claim, Key};
