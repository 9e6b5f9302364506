//! What a stream follows: a collection of the API, its selectors and how
//! it is listed.

use std::sync::{atomic::AtomicBool, Arc};

/// Services are listed and watched with this field selector where the
/// server supports it (Kubernetes 1.31+): the others never reach the guard.
pub const LB_SERVICES: &str = "spec.type=LoadBalancer";

/// Which collection, read how.
#[derive(Clone, Default)]
pub struct Collection {
    /// The collection's URL path.
    pub path: String,
    pub labels: Option<String>,
    pub fields: Option<String>,
    /// The first page of a list from the API server's watch cache
    /// (`resourceVersion=0`), never a quorum read of etcd: for what may be
    /// a little behind (presence), not for the ownership feed, whose relist
    /// after a 410 must not go back in time.
    pub cached: bool,
    /// Objects per list page.
    pub page: u32,
    /// Services: the server filters them by `spec.type` while this holds
    /// (cleared, for every later stream too, when it answers that it cannot).
    pub lb_filter: Option<Arc<AtomicBool>>,
}

/// A list request: `labels` and `fields` selectors, a page size; the
/// first page from the watch cache if the collection says so (built here
/// because kube's `ListParams` drops `resourceVersion=0` when a limit is
/// set); a continuation carries no version (it reads the snapshot its
/// first page started).
pub fn list_request(
    c: &Collection,
    fields: Option<&str>,
    cont: Option<&str>,
) -> http::Request<Vec<u8>> {
    let mut q = form_urlencoded::Serializer::new(format!("{}?", c.path));
    if let Some(l) = c.labels.as_deref().filter(|l| !l.is_empty()) {
        q.append_pair("labelSelector", l);
    }
    if let Some(f) = fields.filter(|f| !f.is_empty()) {
        q.append_pair("fieldSelector", f);
    }
    q.append_pair("limit", &c.page.max(1).to_string());
    match cont {
        Some(token) => {
            q.append_pair("continue", token);
        }
        None if c.cached => {
            q.append_pair("resourceVersion", "0");
            q.append_pair("resourceVersionMatch", "NotOlderThan");
        }
        None => {}
    }
    let mut req = http::Request::new(Vec::new());
    // A URL built from a path and an encoded query always parses.
    *req.uri_mut() = q.finish().parse().unwrap_or_default();
    req
}
