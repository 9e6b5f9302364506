//! Ownership from the Kubernetes API: which LB IPs exist (Services) and which
//! node owns each (Cilium and kube-vip Leases, MetalLB ServiceL2Status).
//!
//! `cause` classifies failed requests (what to fix), `problems` logs each
//! cause once and keeps the guard's own problem, `dial` opens the watches'
//! connections, `wire` makes the requests and `decode` reads their bodies
//! object by object into slim types, `listwatch` is the one list+watch
//! loop (the feed's streams, presence, the uplink hints), `objects` turns
//! objects into the `store`'s plain types, `store` holds them (the cluster
//! objects the feed keeps) and the ownership rules over them (pure),
//! `stream` and `driver` are the feed's streams on the loop, `feed` keeps
//! what the streams delivered and their health (pure in time; `apply` and
//! `undecodable`), and `task` runs them all and publishes a `ClusterView`.

mod apply;
pub mod cause;
mod collection;
pub mod confirm;
#[cfg(feature = "testing")]
pub mod cost;
pub mod decode;
pub mod dial;
mod driver;
pub mod feed;
#[cfg(test)]
mod fixtures;
mod hub;
pub mod index;
mod keys;
pub mod listwatch;
pub mod objects;
mod pace;
mod per_stream;
pub mod problems;
mod shared;
pub mod store;
pub mod stream;
pub mod task;
mod undecodable;
pub mod wire;

use std::time::Duration;

use objects::ServiceFilter;
pub use store::{Announcer, Key};

#[derive(Debug, Clone)]
pub struct FeedConfig {
    pub announcers: Vec<Announcer>,
    pub filter: ServiceFilter,
    /// Label selector for Services (server-side).
    pub selector: Option<String>,
    /// Degrade after this long without a healthy feed; None: the longest
    /// duration of the Leases in use, between 15 s and 60 s.
    pub stale_after: Option<Duration>,
    /// The server ends each watch after this long (`timeoutSeconds`); a
    /// stream silent for this plus [`pace::IDLE_MARGIN`] is stuck.
    pub watch_timeout: Duration,
    /// `--settle-shared-ips` (see [`store::Store::fold`]).
    pub settle_shared: bool,
}

impl FeedConfig {
    /// Cilium's Leases in kube-system for every LoadBalancer Service, the
    /// staleness threshold taken from the Leases: the feed the unit tests
    /// and the cost bench drive.
    #[cfg(any(test, feature = "testing"))]
    pub fn cilium(watch_timeout: Duration) -> Self {
        FeedConfig {
            announcers: vec![Announcer::Cilium {
                namespace: "kube-system".into(),
            }],
            filter: ServiceFilter::default(),
            selector: None,
            stale_after: None,
            watch_timeout,
            settle_shared: false,
        }
    }
}

/// Reading the API: where its configuration comes from, and the feed.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// None: in-cluster service account, then $KUBECONFIG / ~/.kube/config.
    pub kubeconfig: Option<std::path::PathBuf>,
    pub feed: FeedConfig,
}
