//! A fake Kubernetes API server for the tests: there is no kube-apiserver
//! binary on this machine. It speaks the real list/watch protocol over
//! HTTP/1.1 for the three resources arp-guard reads:
//!
//! - list: `GET <collection>` returns `{kind: XList, metadata: {resourceVersion}, items}`;
//! - watch: `GET <collection>?watch=true&resourceVersion=R` streams
//!   `{"type": ADDED|MODIFIED|DELETED|BOOKMARK|ERROR, "object": ...}` lines with
//!   chunked encoding, from R on, with bookmarks when asked for;
//! - a watch from a compacted resourceVersion gets an ERROR event with a 410
//!   Gone Status, as the real server sends, which forces a relist;
//! - tests can cut every open watch mid-stream, and take the server "down"
//!   (every connection is accepted and closed at once) and up again;
//! - faults per resource: every request answers an HTTP error (500, 401,
//!   403, ...), or watches get stuck half-way through a chunk while lists
//!   and GETs still work;
//! - a single object: `GET <collection>/NAME` (200, or 404 Not Found);
//! - optionally HTTPS ([`FakeApi::start_tls`], certificates from [`tls`]),
//!   whose certificate can be swapped at run time, and bearer-token
//!   authentication ([`FakeApi::set_tokens`]): an unknown or missing token
//!   gets 401, a known one without permissions 403, each with a Kubernetes
//!   `Status` body, as the real server answers.
//!
//! - writes of Leases (presence): create, replace at the current
//!   resourceVersion (409 Conflict otherwise), delete;
//!
//! Collections: `/api/v1[/namespaces/NS]/services`, `/api/v1[/namespaces/NS]/configmaps`,
//! `/api/v1/nodes`,
//! `/apis/coordination.k8s.io/v1[/namespaces/NS]/leases`,
//! `/apis/metallb.io/v1beta1[/namespaces/NS]/servicel2statuses`; Events the
//! guard writes: POST/PATCH `/apis/events.k8s.io/v1/namespaces/NS/events` (events.rs).
//!
//! By subject: server.rs (the accept loop, a connection's requests and
//! where each goes), conn.rs (the wire), auth.rs (bearer tokens), faults.rs
//! (down, black hole, faults per resource), store.rs (the objects and their
//! history), select.rs (selectors, lists), watch.rs, write.rs (Leases),
//! events.rs, exec.rs (pods/exec, RBAC denials), tally.rs, tls.rs, and
//! [`objects`] (builders of the objects tests store).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{Shutdown, SocketAddr, TcpListener, TcpStream},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Condvar, Mutex,
    },
};

use anyhow::Result;
use serde_json::{json, Value};

use crate::Netns;

pub mod admission;
mod auth;
mod conn;
mod events;
mod exec;
mod faults;
pub mod objects;
mod select;
mod server;
mod store;
mod table;
mod tally;
pub mod tls;
mod watch;
mod write;

pub use exec::{ExecCall, ExecHook};
pub use faults::Fault;
pub use store::ApiHandle;
pub use tally::{Counts, Key as TallyKey, Scope};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Resource {
    Services,
    Leases,
    L2Statuses,
    /// Not watched by the guard; `arp-guard doctor` GETs kube-system/kube-proxy.
    ConfigMaps,
    /// Cluster-scoped (stored under the namespace ""): presence lists them for coverage.
    Nodes,
    /// The guard Pods (presence watches their Ready condition).
    Pods,
    /// MetalLB's L2Advertisements (`--interface auto` reads their `interfaces`).
    L2Advertisements,
    /// CiliumL2AnnouncementPolicies, cluster-scoped (the same).
    L2Policies,
    /// ArpGuardNodes, cluster-scoped: each guard's findings.
    GuardNodes,
}

impl Resource {
    fn kind(self) -> &'static str {
        match self {
            Resource::Services => "Service",
            Resource::Leases => "Lease",
            Resource::L2Statuses => "ServiceL2Status",
            Resource::ConfigMaps => "ConfigMap",
            Resource::Nodes => "Node",
            Resource::Pods => "Pod",
            Resource::L2Advertisements => "L2Advertisement",
            Resource::L2Policies => "CiliumL2AnnouncementPolicy",
            Resource::GuardNodes => "ArpGuardNode",
        }
    }
    fn api_version(self) -> &'static str {
        match self {
            Resource::Services => "v1",
            Resource::Leases => "coordination.k8s.io/v1",
            Resource::L2Statuses | Resource::L2Advertisements => "metallb.io/v1beta1",
            Resource::L2Policies => "cilium.io/v2alpha1",
            Resource::GuardNodes => "arp-guard.io/v1alpha1",
            Resource::ConfigMaps | Resource::Nodes | Resource::Pods => "v1",
        }
    }
    /// Its name in a URL and in RBAC.
    fn plural(self) -> &'static str {
        match self {
            Resource::Services => "services",
            Resource::Leases => "leases",
            Resource::L2Statuses => "servicel2statuses",
            Resource::ConfigMaps => "configmaps",
            Resource::Nodes => "nodes",
            Resource::Pods => "pods",
            Resource::L2Advertisements => "l2advertisements",
            Resource::L2Policies => "ciliuml2announcementpolicies",
            Resource::GuardNodes => "arpguardnodes",
        }
    }
    /// (resource, namespace, object name) from a request path.
    fn from_path(path: &str) -> Option<(Resource, Option<String>, Option<String>)> {
        let (prefix, rest) = if let Some(r) = path.strip_prefix("/api/v1/") {
            ("core", r)
        } else if let Some(r) = path.strip_prefix("/apis/coordination.k8s.io/v1/") {
            ("coord", r)
        } else if let Some(r) = path.strip_prefix("/apis/metallb.io/v1beta1/") {
            ("metallb", r)
        } else if let Some(r) = path.strip_prefix("/apis/cilium.io/v2alpha1/") {
            ("cilium", r)
        } else if let Some(r) = path.strip_prefix("/apis/arp-guard.io/v1alpha1/") {
            ("arpguard", r)
        } else {
            return None;
        };
        let parts: Vec<&str> = rest.split('/').collect();
        let (ns, plural, name) = match parts.as_slice() {
            [plural] => (None, *plural, None),
            ["namespaces", ns, plural] => (Some(ns.to_string()), *plural, None),
            ["namespaces", ns, plural, name] => {
                (Some(ns.to_string()), *plural, Some(name.to_string()))
            }
            // A cluster-scoped object: a Node, an ArpGuardNode.
            [plural, name] if *plural != "namespaces" => (None, *plural, Some(name.to_string())),
            _ => return None,
        };
        let res = match (prefix, plural) {
            ("core", "services") => Resource::Services,
            ("coord", "leases") => Resource::Leases,
            ("metallb", "servicel2statuses") => Resource::L2Statuses,
            ("metallb", "l2advertisements") => Resource::L2Advertisements,
            ("cilium", "ciliuml2announcementpolicies") => Resource::L2Policies,
            ("arpguard", "arpguardnodes") => Resource::GuardNodes,
            ("core", "configmaps") => Resource::ConfigMaps,
            ("core", "nodes") => Resource::Nodes,
            ("core", "pods") => Resource::Pods,
            _ => return None,
        };
        Some((res, ns, name))
    }
}

struct Inner {
    state: Mutex<store::State>,
    changed: Condvar,
    stop: AtomicBool,
    /// Milliseconds between bookmarks on a watch that asked for them.
    bookmark_every_ms: AtomicU64,
    /// HTTPS with this configuration (None: plain HTTP).
    tls: Mutex<Option<Arc<rustls::ServerConfig>>>,
    /// Open connections, to close them all when the certificate changes.
    conns: Mutex<BTreeMap<u64, TcpStream>>,
    next_conn: AtomicU64,
    /// Events the guard published (events.rs).
    events: Mutex<events::Store>,
    /// What each client asked and was sent (tally.rs).
    tally: Mutex<tally::Tally>,
    /// pods/exec (exec.rs): how a command runs, the ones run, and the
    /// resources every request for which is denied.
    exec: exec::Hook,
    exec_log: exec::Log,
    denied: exec::Denied,
}

/// The server; stops on drop.
pub struct FakeApi {
    inner: Arc<Inner>,
    pub addr: SocketAddr,
}

impl FakeApi {
    /// Listen on `addr` inside `ns` (port 0 picks one), plain HTTP.
    pub fn start(ns: &Netns, addr: SocketAddr) -> Result<Self> {
        Self::start_with(ns, addr, None)
    }

    /// The same over HTTPS, presenting `identity`.
    pub fn start_tls(ns: &Netns, addr: SocketAddr, identity: &tls::ServerIdentity) -> Result<Self> {
        Self::start_with(ns, addr, Some(identity.config()?))
    }

    fn start_with(
        ns: &Netns,
        addr: SocketAddr,
        tls: Option<Arc<rustls::ServerConfig>>,
    ) -> Result<Self> {
        let listener = ns.enter(move || Ok(TcpListener::bind(addr)?))?;
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let inner = Arc::new(Inner {
            state: Mutex::new(store::State {
                rv: 100,
                ..store::State::default()
            }),
            changed: Condvar::new(),
            stop: AtomicBool::new(false),
            bookmark_every_ms: AtomicU64::new(1000),
            tls: Mutex::new(tls),
            conns: Mutex::new(BTreeMap::new()),
            next_conn: AtomicU64::new(0),
            events: Mutex::new(events::Store::default()),
            tally: Mutex::new(tally::Tally::default()),
            exec: Mutex::new(None),
            exec_log: Mutex::new(Vec::new()),
            denied: Mutex::new(BTreeSet::new()),
        });
        let server = inner.clone();
        std::thread::spawn(move || server::accept_loop(listener, server));
        Ok(FakeApi { inner, addr })
    }

    /// A kubeconfig that points at this server (plain HTTP, no auth).
    pub fn kubeconfig(&self) -> String {
        self.kubeconfig_user("{}")
    }

    /// The same presenting bearer `token` (see [`FakeApi::set_user`]).
    pub fn kubeconfig_with_token(&self, token: &str) -> String {
        self.kubeconfig_user(&format!("{{token: {token}}}"))
    }

    fn kubeconfig_user(&self, user: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\ncurrent-context: fake\nusers:\n- name: fake\n  user: {user}\n",
            self.addr
        )
    }

    /// Present `identity` from now on (say, a certificate from a CA the
    /// clients do not trust): every open connection is closed, so that the
    /// next ones meet it.
    pub fn set_identity(&self, identity: &tls::ServerIdentity) -> Result<()> {
        *self.inner.tls.lock().unwrap() = Some(identity.config()?);
        self.inner.state.lock().unwrap().generation += 1;
        self.inner.changed.notify_all();
        for c in self.inner.conns.lock().unwrap().values() {
            let _ = c.shutdown(Shutdown::Both);
        }
        Ok(())
    }
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::SeqCst);
        self.inner.changed.notify_all();
    }
}

/// A Kubernetes `Status` body.
fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code})
}
