//! Ownership from the Kubernetes API: which LB IPs exist (Services) and which
//! node owns each (Cilium and kube-vip Leases, MetalLB ServiceL2Status).
//!
//! `cause` classifies failed requests (what to fix), `problems` logs each
//! cause once and keeps the guard's own problem, `wire` makes the requests
//! and `decode` reads their bodies object by object into slim types,
//! `objects` turns those into the `store`'s plain types, `store` holds
//! them (the cluster objects the feed keeps) and the ownership rules over
//! them (pure), `stream` and `driver` run one list+watch,
//! `feed` keeps what the streams delivered and their health (pure in time;
//! `apply` and `undecodable`), and `task` runs them all and publishes a
//! `ClusterView`; `trust` decides which CA roots the client needs.

mod apply;
pub mod cause;
pub mod confirm;
#[cfg(feature = "testing")]
pub mod cost;
pub mod decode;
pub mod dial;
mod driver;
pub mod feed;
#[cfg(test)]
mod fixtures;
mod http1;
mod hub;
pub mod index;
mod keys;
pub mod no_proxy;
pub mod objects;
mod per_stream;
pub mod problems;
pub mod store;
pub mod stream;
pub mod task;
pub mod trust;
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
    /// stream silent for this plus [`stream::IDLE_MARGIN`] is stuck.
    pub watch_timeout: Duration,
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
