//! What the server was asked and what it sent, by client, verb and
//! resource: requests, response bytes (status line, headers and body, or a
//! watch's chunks) and watch events (bookmarks apart). The fleet bench reads
//! it to show what each guard costs the API server and how that grows with
//! the number of guards.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use super::FakeApi;

/// One client's requests of one verb on one resource.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub requests: u64,
    /// Response bytes, as written on the connection (before TLS).
    pub bytes: u64,
    /// Watch events sent (ADDED, MODIFIED, DELETED, ERROR).
    pub events: u64,
    /// Watch bookmarks sent.
    pub bookmarks: u64,
    /// Lists and GETs that a real server answers with a quorum read of etcd
    /// (no resourceVersion; a continuation page apart): every periodic read
    /// should come from the watch cache (`resourceVersion=0`) instead.
    pub quorum: u64,
}

impl std::ops::AddAssign for Counts {
    fn add_assign(&mut self, o: Counts) {
        self.requests += o.requests;
        self.bytes += o.bytes;
        self.events += o.events;
        self.bookmarks += o.bookmarks;
        self.quorum += o.quorum;
    }
}

/// (client, verb, resource): `verb` as the API server's audit log names it
/// (get, list, watch, create, update, patch, delete), `resource` its plural
/// (services, leases, pods, nodes, events, ...) with its label selector.
pub type Key = (IpAddr, &'static str, String);

/// (client, verb, resource, namespace) of a request, as RBAC authorizes
/// it: the resource without a selector, the namespace None for a
/// cluster-wide or cluster-scoped request.
pub type Scope = (IpAddr, &'static str, String, Option<String>);

#[derive(Debug, Default)]
pub(super) struct Tally {
    pub(super) by: BTreeMap<Key, Counts>,
    pub(super) scopes: BTreeSet<Scope>,
}

impl Tally {
    pub(super) fn add(&mut self, key: &Key, c: Counts) {
        if let Some(v) = self.by.get_mut(key) {
            *v += c;
        } else {
            self.by.insert(key.clone(), c);
        }
    }
}

/// The verb of a request, as the audit log names it.
pub(super) fn verb(method: &str, named: bool, watch: bool) -> &'static str {
    match (method, named, watch) {
        ("GET", _, true) => "watch",
        ("GET", true, _) => "get",
        ("GET", false, _) => "list",
        ("POST", ..) => "create",
        ("PUT", ..) => "update",
        ("PATCH", ..) => "patch",
        ("DELETE", ..) => "delete",
        _ => "other",
    }
}

/// The resource a path names (its plural, or the path itself) and whether
/// it names one object.
pub(super) fn resource(path: &str) -> (String, bool) {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    // /api/v1/[namespaces/NS/]PLURAL[/NAME], /apis/G/V/[namespaces/NS/]PLURAL[/NAME]
    let rest = match parts.as_slice() {
        ["api", _, rest @ ..] => rest,
        ["apis", _, _, rest @ ..] => rest,
        _ => return (path.to_owned(), false),
    };
    match rest {
        ["namespaces", _, plural, more @ ..] => ((*plural).to_owned(), !more.is_empty()),
        [plural, more @ ..] => ((*plural).to_owned(), !more.is_empty()),
        [] => (path.to_owned(), false),
    }
}

/// The namespace a path is in (None: cluster-wide, or cluster-scoped).
pub(super) fn namespace(path: &str) -> Option<String> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let rest = match parts.as_slice() {
        ["api", _, rest @ ..] | ["apis", _, _, rest @ ..] => rest,
        _ => return None,
    };
    match rest {
        ["namespaces", ns, _, ..] => Some((*ns).to_owned()),
        _ => None,
    }
}

/// The request's scope, for [`FakeApi::scopes`].
pub(super) fn scope(key: &Key, path: &str) -> Scope {
    let res = key.2.split('{').next().unwrap_or_default().to_owned();
    (key.0, key.1, res, namespace(path))
}

/// The key of a request; a label selector is part of the resource's name
/// (`leases{app.kubernetes.io/component=arp-guard-presence}`): two watches
/// of one resource by different selectors are counted apart.
pub(super) fn key(
    peer: IpAddr,
    method: &str,
    path: &str,
    watch: bool,
    labels: Option<&str>,
) -> Key {
    // pods/exec is authorized as its own resource, and counted so.
    if path.ends_with("/exec") {
        return (peer, "create", "pods/exec".to_owned());
    }
    let (res, named) = resource(path);
    let res = match labels.filter(|l| !l.is_empty()) {
        Some(l) => format!("{res}{{{l}}}"),
        None => res,
    };
    (peer, verb(method, named, watch), res)
}

impl FakeApi {
    /// Everything counted so far.
    pub fn tally(&self) -> BTreeMap<Key, Counts> {
        self.inner.tally.lock().unwrap().by.clone()
    }

    /// Every (client, verb, resource, namespace) asked so far: what RBAC
    /// had to grant.
    pub fn scopes(&self) -> BTreeSet<Scope> {
        self.inner.tally.lock().unwrap().scopes.clone()
    }

    /// Forget the counts (the start of a measured window).
    pub fn reset_tally(&self) {
        let mut t = self.inner.tally.lock().unwrap();
        t.by.clear();
        t.scopes.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_their_resource_and_requests_their_verb() {
        assert_eq!(resource("/api/v1/nodes"), ("nodes".into(), false));
        assert_eq!(
            resource("/api/v1/namespaces/arp-guard/pods"),
            ("pods".into(), false)
        );
        assert_eq!(
            resource("/apis/coordination.k8s.io/v1/namespaces/x/leases/arp-guard-a"),
            ("leases".into(), true)
        );
        assert_eq!(
            resource("/apis/events.k8s.io/v1/namespaces/d/events"),
            ("events".into(), false)
        );
        assert_eq!(namespace("/api/v1/nodes"), None);
        assert_eq!(
            namespace("/apis/coordination.k8s.io/v1/namespaces/x/leases/arp-guard-a").as_deref(),
            Some("x")
        );
        assert_eq!(
            namespace("/api/v1/namespaces/x"),
            None,
            "the namespace itself"
        );
        assert_eq!(verb("GET", false, true), "watch");
        assert_eq!(verb("GET", true, false), "get");
        assert_eq!(verb("GET", false, false), "list");
        assert_eq!(verb("PUT", true, false), "update");
    }
}
