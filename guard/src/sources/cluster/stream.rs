//! The streams the feed reads (one list+watch per resource), what they
//! report. The list+watch itself is `listwatch`'s, which `driver` starts
//! for each.

use std::{collections::BTreeSet, time::Duration};

use k8s_openapi::api::coordination::v1::Lease;
use kube::{
    api::{ApiResource, GroupVersionKind},
    Resource as _,
};

use super::{cause::Failure, decode, store::Announcer};

/// Node heartbeats: thousands of renewals a minute on a big cluster, never an announcer's.
const NODE_LEASES_NS: &str = "kube-node-lease";
pub use super::listwatch::Event;

/// An event of one of the kinds the feed reads.
pub enum Update {
    Svc(Box<Event<decode::Service>>),
    Lease(Box<Event<decode::Lease>>),
    L2(Box<Event<decode::ServiceL2Status>>),
}

impl Update {
    /// A listed object (buffered in its relist until the relist's end).
    pub(super) fn is_listed(&self) -> bool {
        match self {
            Update::Svc(e) => matches!(**e, Event::Listed(_)),
            Update::Lease(e) => matches!(**e, Event::Listed(_)),
            Update::L2(e) => matches!(**e, Event::Listed(_)),
        }
    }
}

/// What a stream task reports.
pub enum Msg {
    Update(Update),
    /// The server showed it is alive for this stream: a bookmark, or its
    /// clean end of a watch.
    Progress,
    /// A list or watch failed (it is retried with back-off).
    Failed(Failure),
    /// The watch's connection went silent and the kernel's keepalive gave
    /// up on it: blind for this long already (retried with back-off).
    Silent(Failure, Duration),
    /// Nothing at all within the idle deadline: the stream is relisted.
    Idle(Duration),
}

/// What one stream watches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stream {
    Services,
    Leases,
    L2 { namespace: String },
}

impl Stream {
    /// For logs, metrics and the status.
    pub fn name(&self) -> String {
        match self {
            Stream::Services => "services".into(),
            Stream::Leases => "leases".into(),
            Stream::L2 { namespace } => format!("servicel2statuses in {namespace}"),
        }
    }

    /// The streams the announcers need.
    pub fn all_for(announcers: &[Announcer]) -> Vec<Stream> {
        let mut out = vec![Stream::Services];
        if announcers
            .iter()
            .any(|a| !matches!(a, Announcer::MetalLb { .. }))
        {
            out.push(Stream::Leases);
        }
        out.extend(announcers.iter().filter_map(|a| match a {
            Announcer::MetalLb { namespace } => Some(Stream::L2 {
                namespace: namespace.clone(),
            }),
            _ => None,
        }));
        out
    }
}

/// MetalLB's ServiceL2Status, read as a dynamic object (no CRD types compiled in).
pub fn l2status_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("metallb.io", "v1beta1", "ServiceL2Status"),
        "servicel2statuses",
    )
}

/// Where Leases are watched: one namespace when every Lease-based announcer
/// points into the same one, else cluster-wide (kube-vip's per-service Leases
/// live in each Service's namespace) without the node heartbeats. The
/// collection's path and the field selector.
pub fn lease_scope(announcers: &[Announcer]) -> (String, Option<String>) {
    let namespaces: BTreeSet<Option<&str>> = announcers
        .iter()
        .filter_map(|a| match a {
            Announcer::Cilium { namespace } => Some(Some(namespace.as_str())),
            Announcer::KubeVipGlobal { lease } => Some(Some(&*lease.ns)),
            Announcer::KubeVipPerService => Some(None),
            Announcer::MetalLb { .. } => None,
        })
        .collect();
    match namespaces.iter().collect::<Vec<_>>().as_slice() {
        [Some(ns)] => (Lease::url_path(&(), Some(ns)), None),
        _ => (
            Lease::url_path(&(), None),
            Some(format!("metadata.namespace!={NODE_LEASES_NS}")),
        ),
    }
}
