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

use std::{
    collections::{BTreeMap, BTreeSet},
    io::{BufRead as _, BufReader, Read, Write},
    net::{Shutdown, SocketAddr, TcpListener, TcpStream},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Condvar, Mutex,
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use serde_json::{json, Value};

use crate::Netns;

mod events;
mod exec;
mod tally;
pub mod tls;

pub use exec::{ExecCall, ExecHook};

pub use tally::{Counts, Key as TallyKey};

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
        }
    }
    fn api_version(self) -> &'static str {
        match self {
            Resource::Services => "v1",
            Resource::Leases => "coordination.k8s.io/v1",
            Resource::L2Statuses => "metallb.io/v1beta1",
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
            ["nodes", name] => (None, "nodes", Some(name.to_string())),
            _ => return None,
        };
        let res = match (prefix, plural) {
            ("core", "services") => Resource::Services,
            ("coord", "leases") => Resource::Leases,
            ("metallb", "servicel2statuses") => Resource::L2Statuses,
            ("core", "configmaps") => Resource::ConfigMaps,
            ("core", "nodes") => Resource::Nodes,
            ("core", "pods") => Resource::Pods,
            _ => return None,
        };
        Some((res, ns, name))
    }
}

/// A failure the server shows for one resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Every request (list, watch, GET) answers this HTTP status.
    Status(u16),
    /// Watches send half a chunk and then nothing, holding the connection
    /// open; lists and GETs work (a stuck stream while new connections work).
    StuckWatch,
}

type ObjKey = (Resource, String, String);

struct Event {
    rv: u64,
    res: Resource,
    ns: String,
    kind: &'static str,
    object: Value,
    /// The object as it was before a MODIFIED (a watch with a selector
    /// turns a change across the selector into ADDED or DELETED).
    prev: Option<Value>,
}

#[derive(Default)]
struct State {
    rv: u64,
    objects: BTreeMap<ObjKey, Value>,
    log: Vec<Event>,
    /// Watches from a resourceVersion below this get 410 Gone.
    compacted: u64,
    /// Bumped to cut every open watch.
    generation: u64,
    down: bool,
    /// Connections are accepted and never answered (a silently dead API).
    blackhole: bool,
    requests: u64,
    lists: u64,
    faults: BTreeMap<Resource, Fault>,
    /// Single-object GETs served.
    gets: u64,
    /// Bearer tokens required (None: no authentication).
    auth: Option<Auth>,
    /// Requests per bearer token presented.
    tokens_seen: BTreeMap<String, u64>,
    /// Services may be selected by `spec.type` and `spec.clusterIP`
    /// (Kubernetes 1.31 and later); false: an older server, which answers
    /// such a field selector with 400 Bad Request.
    old_service_fields: bool,
}

/// Which bearer tokens the server knows.
#[derive(Debug, Clone, Default)]
struct Auth {
    /// Authenticated and allowed everything.
    accepted: BTreeSet<String>,
    /// Authenticated, allowed nothing (403).
    forbidden: BTreeSet<String>,
}

struct Inner {
    state: Mutex<State>,
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
            state: Mutex::new(State {
                rv: 100,
                ..State::default()
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
        std::thread::spawn(move || accept_loop(listener, server));
        Ok(FakeApi { inner, addr })
    }

    /// A kubeconfig that points at this server (plain HTTP, no auth).
    pub fn kubeconfig(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\ncurrent-context: fake\nusers:\n- name: fake\n  user: {{}}\n",
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

    /// Require a bearer token from now on: `accepted` ones may do
    /// everything, `forbidden` ones are authenticated but may do nothing
    /// (403); any other, or none, is rejected (401). Takes effect at the
    /// next request (open watches go on, as on a real server).
    pub fn set_tokens(&self, accepted: &[&str], forbidden: &[&str]) {
        let set = |v: &[&str]| v.iter().map(|t| t.to_string()).collect();
        self.inner.state.lock().unwrap().auth = Some(Auth {
            accepted: set(accepted),
            forbidden: set(forbidden),
        });
    }

    /// Requests that presented `token` so far.
    pub fn token_uses(&self, token: &str) -> u64 {
        let st = self.inner.state.lock().unwrap();
        st.tokens_seen.get(token).copied().unwrap_or(0)
    }

    /// Create or replace an object (the object's apiVersion/kind are filled in).
    pub fn apply(&self, res: Resource, object: Value) {
        apply(&self.inner, res, object)
    }

    /// A handle that can change objects from another thread (it does not
    /// stop the server when dropped).
    pub fn handle(&self) -> ApiHandle {
        ApiHandle {
            inner: self.inner.clone(),
        }
    }

    pub fn delete(&self, res: Resource, ns: &str, name: &str) {
        delete(&self.inner, res, ns, name)
    }

    /// Create many objects at once, without a watch history for them (a
    /// server whose history was compacted since): for benches that load
    /// tens of thousands of objects before the guard starts.
    pub fn preload(&self, res: Resource, objects: impl IntoIterator<Item = Value>) {
        let mut st = self.inner.state.lock().unwrap();
        for mut object in objects {
            st.rv += 1;
            let rv = st.rv;
            let key = stamp(res, &mut object, rv);
            st.objects.insert(key, object);
        }
        st.compacted = st.rv;
        self.inner.changed.notify_all();
    }

    /// The stored object (namespace "" for a cluster-scoped one), if any.
    pub fn object(&self, res: Resource, ns: &str, name: &str) -> Option<Value> {
        let st = self.inner.state.lock().unwrap();
        st.objects
            .get(&(res, ns.to_owned(), name.to_owned()))
            .cloned()
    }

    /// Serve Services' `spec.type` and `spec.clusterIP` field selectors
    /// (true, the default: Kubernetes 1.31 and later) or answer them with
    /// 400 Bad Request as older servers do (false).
    pub fn set_service_field_selectors(&self, supported: bool) {
        self.inner.state.lock().unwrap().old_service_fields = !supported;
    }

    /// Forget the event history: watches resuming from before the current
    /// resourceVersion get 410 Gone (a watch from the current one is fine,
    /// as on a real server after compaction).
    pub fn compact(&self) {
        let mut st = self.inner.state.lock().unwrap();
        st.compacted = st.rv;
        st.log.clear();
    }

    /// Connections accepted so far (a client that keeps its connection
    /// after a watch the server ended opens none for the next one).
    pub fn connections(&self) -> u64 {
        self.inner.next_conn.load(Ordering::Relaxed)
    }

    /// Cut every open watch connection mid-stream.
    pub fn drop_watches(&self) {
        self.inner.state.lock().unwrap().generation += 1;
        self.inner.changed.notify_all();
    }

    /// Down: every connection is closed at once, open watches are cut.
    pub fn set_down(&self, down: bool) {
        let mut st = self.inner.state.lock().unwrap();
        st.down = down;
        st.generation += 1;
        self.inner.changed.notify_all();
    }

    /// Black hole: new connections are accepted and never answered, open
    /// watches are cut (a network partition that drops packets silently).
    pub fn set_blackhole(&self, on: bool) {
        let mut st = self.inner.state.lock().unwrap();
        st.blackhole = on;
        st.generation += 1;
        self.inner.changed.notify_all();
    }

    /// Make every request for `res` fail, or its watches stick (None: heal).
    /// Open watches of `res` are cut, so that the next ones meet the fault.
    pub fn set_fault(&self, res: Resource, fault: Option<Fault>) {
        let mut st = self.inner.state.lock().unwrap();
        match fault {
            Some(f) => st.faults.insert(res, f),
            None => st.faults.remove(&res),
        };
        st.generation += 1;
        self.inner.changed.notify_all();
    }

    /// The current resourceVersion (a watch from it sees what comes next).
    pub fn resource_version(&self) -> u64 {
        self.inner.state.lock().unwrap().rv
    }

    /// Send bookmarks this often (1 s by default, for tests that want
    /// progress soon; a real server sends one about every minute).
    pub fn set_bookmark_every(&self, every: Duration) {
        (self.inner.bookmark_every_ms).store(every.as_millis() as u64, Ordering::Relaxed);
    }

    /// Single-object GETs served so far.
    pub fn gets(&self) -> u64 {
        self.inner.state.lock().unwrap().gets
    }

    /// Requests served so far.
    pub fn requests(&self) -> u64 {
        self.inner.state.lock().unwrap().requests
    }

    /// List requests (first pages) of `res` served so far: a relist shows here.
    pub fn lists(&self) -> u64 {
        self.inner.state.lock().unwrap().lists
    }
}

/// See [`FakeApi::handle`].
#[derive(Clone)]
pub struct ApiHandle {
    inner: Arc<Inner>,
}

impl ApiHandle {
    pub fn apply(&self, res: Resource, object: Value) {
        apply(&self.inner, res, object)
    }
    pub fn delete(&self, res: Resource, ns: &str, name: &str) {
        delete(&self.inner, res, ns, name)
    }
}

/// Delete an object (see [`FakeApi::delete`]).
fn delete(inner: &Inner, res: Resource, ns: &str, name: &str) {
    let mut st = inner.state.lock().unwrap();
    let Some(mut object) = st.objects.remove(&(res, ns.to_owned(), name.to_owned())) else {
        return;
    };
    st.rv += 1;
    let rv = st.rv;
    object["metadata"]["resourceVersion"] = json!(rv.to_string());
    st.log.push(Event {
        rv,
        res,
        ns: ns.to_owned(),
        kind: "DELETED",
        object,
        prev: None,
    });
    inner.changed.notify_all();
}

/// Create or replace an object (see [`FakeApi::apply`]).
fn apply(inner: &Inner, res: Resource, mut object: Value) {
    let mut st = inner.state.lock().unwrap();
    st.rv += 1;
    let rv = st.rv;
    let key = stamp(res, &mut object, rv);
    let prev = st.objects.insert(key.clone(), object.clone());
    let kind = if prev.is_some() { "MODIFIED" } else { "ADDED" };
    st.log.push(Event {
        rv,
        res,
        ns: key.1,
        kind,
        object,
        prev,
    });
    inner.changed.notify_all();
}

/// Fill in what the server sets (apiVersion, kind, namespace,
/// resourceVersion, uid); the object's key.
fn stamp(res: Resource, object: &mut Value, rv: u64) -> ObjKey {
    let ns = match res {
        Resource::Nodes => String::new(),
        _ => object["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_owned(),
    };
    let name = object["metadata"]["name"]
        .as_str()
        .expect("metadata.name")
        .to_owned();
    object["apiVersion"] = json!(res.api_version());
    object["kind"] = json!(res.kind());
    if res != Resource::Nodes {
        object["metadata"]["namespace"] = json!(ns);
    }
    object["metadata"]["resourceVersion"] = json!(rv.to_string());
    if object["metadata"]["uid"].is_null() {
        object["metadata"]["uid"] = json!(format!("uid-{ns}-{name}-{rv}"));
    }
    (res, ns, name)
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::SeqCst);
        self.inner.changed.notify_all();
    }
}

fn accept_loop(listener: TcpListener, inner: Arc<Inner>) {
    while !inner.stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, _)) => {
                if inner.state.lock().unwrap().down {
                    drop(stream);
                    continue;
                }
                let inner = inner.clone();
                std::thread::spawn(move || {
                    let id = inner.next_conn.fetch_add(1, Ordering::Relaxed);
                    if let Ok(c) = stream.try_clone() {
                        inner.conns.lock().unwrap().insert(id, c);
                    }
                    let _ = serve(stream, &inner);
                    inner.conns.lock().unwrap().remove(&id);
                });
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// One connection: plain, or TLS over it; with the bytes written to it
/// (before TLS), for the tally.
struct Conn {
    io: Io,
    written: u64,
}

enum Io {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ServerConnection, TcpStream>>),
}

impl Conn {
    fn tcp(&self) -> &TcpStream {
        match &self.io {
            Io::Plain(s) => s,
            Io::Tls(s) => &s.sock,
        }
    }
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match &mut self.io {
            Io::Plain(s) => s.read(buf),
            Io::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = match &mut self.io {
            Io::Plain(s) => s.write(buf),
            Io::Tls(s) => s.write(buf),
        }?;
        self.written += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match &mut self.io {
            Io::Plain(s) => s.flush(),
            Io::Tls(s) => s.flush(),
        }
    }
}

/// One request's line and the headers the server reads.
struct Request {
    method: String,
    target: String,
    /// The request's body (writes).
    body: Vec<u8>,
    /// The bearer token presented, if any.
    token: Option<String>,
    /// A WebSocket handshake's headers (pods/exec).
    upgrade: exec::Upgrade,
}

/// Read one request (None: the client closed the connection).
fn read_request(reader: &mut BufReader<Conn>) -> Result<Option<Request>> {
    let mut request_line = String::new();
    if reader.read_line(&mut request_line)? == 0 {
        return Ok(None);
    }
    let mut content_length = 0usize;
    let mut token = None;
    let mut upgrade = exec::Upgrade::default();
    loop {
        let mut h = String::new();
        reader.read_line(&mut h)?;
        if h == "\r\n" || h.is_empty() {
            break;
        }
        let Some((name, value)) = h.split_once(':') else {
            continue;
        };
        if name.eq_ignore_ascii_case("content-length") {
            content_length = value.trim().parse().unwrap_or(0);
        } else if name.eq_ignore_ascii_case("authorization") {
            token = value.trim().strip_prefix("Bearer ").map(str::to_owned);
        } else {
            upgrade.header(name, value);
        }
    }
    let mut body = vec![0; content_length];
    reader.read_exact(&mut body)?;
    let mut words = request_line.split_whitespace();
    let method = words.next().context("no method")?.to_owned();
    let target = words.next().context("no request target")?.to_owned();
    Ok(Some(Request {
        method,
        target,
        body,
        token,
        upgrade,
    }))
}

/// Authentication and authorization, as the real server does them before
/// anything else: None if the request may go on, else the error to answer.
fn check_token(inner: &Inner, token: Option<&str>, path: &str) -> Option<(u16, Value)> {
    let mut st = inner.state.lock().unwrap();
    if let Some(t) = token {
        *st.tokens_seen.entry(t.to_owned()).or_default() += 1;
    }
    let auth = st.auth.as_ref()?;
    match token {
        Some(t) if auth.accepted.contains(t) => None,
        Some(t) if auth.forbidden.contains(t) => Some((
            403,
            status(
                403,
                "Forbidden",
                &format!(
                    "{path} is forbidden: User \"system:serviceaccount:kube-system:arp-guard\" cannot get this resource"
                ),
            ),
        )),
        _ => Some((401, status(401, "Unauthorized", "Unauthorized"))),
    }
}

/// Wait while the server is a black hole (saying nothing).
fn blackhole(inner: &Inner) {
    loop {
        let st = inner.state.lock().unwrap();
        if !st.blackhole || inner.stop.load(Ordering::SeqCst) {
            return;
        }
        drop(
            inner
                .changed
                .wait_timeout(st, Duration::from_millis(200))
                .unwrap(),
        );
    }
}

/// Serve requests on one keep-alive connection, also after a watch the
/// server ended properly, until the client closes it or a watch is cut.
fn serve(stream: TcpStream, inner: &Inner) -> Result<()> {
    stream.set_nonblocking(false)?;
    // A black hole holds the connection open and says nothing.
    blackhole(inner);
    let tls = inner.tls.lock().unwrap().clone();
    let peer = stream.peer_addr()?.ip();
    let io = match tls {
        Some(cfg) => Io::Tls(Box::new(rustls::StreamOwned::new(
            rustls::ServerConnection::new(cfg)?,
            stream,
        ))),
        None => Io::Plain(stream),
    };
    let conn = Conn { io, written: 0 };
    let mut reader = BufReader::new(conn);
    // The request being answered and the bytes written before it.
    let mut answering: Option<(TallyKey, u64)> = None;
    loop {
        let req = read_request(&mut reader);
        if let Some((key, from)) = answering.take() {
            let bytes = reader.get_ref().written - from;
            inner.tally.lock().unwrap().add(
                &key,
                Counts {
                    bytes,
                    ..Counts::default()
                },
            );
        }
        let Some(req) = req? else {
            return Ok(());
        };
        // A kept connection meets the black hole too: no answer while it
        // lasts.
        blackhole(inner);
        let target = req.target;
        let (path, query) = target.split_once('?').unwrap_or((&target, ""));
        let params: BTreeMap<&str, String> = query
            .split('&')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k, decode(v)))
            .collect();
        let param = |k: &str| params.get(k).map(String::as_str);
        let is_watch = matches!(param("watch"), Some("true") | Some("1"));
        let key = tally::key(peer, &req.method, path, is_watch, param("labelSelector"));
        let read = matches!(key.1, "get" | "list") && param("continue").is_none();
        let quorum = read && param("resourceVersion").is_none_or(str::is_empty);
        let one = Counts {
            requests: 1,
            quorum: u64::from(quorum),
            ..Counts::default()
        };
        inner.tally.lock().unwrap().add(&key, one);
        answering = Some((key.clone(), reader.get_ref().written));
        {
            let mut st = inner.state.lock().unwrap();
            st.requests += 1;
            if st.down {
                return Ok(());
            }
        }
        if let Some((code, body)) = check_token(inner, req.token.as_deref(), path) {
            respond(reader.get_mut(), code, &body)?;
            continue;
        }
        // RBAC: a resource the test denied.
        if let Some(r) = exec::rbac_resource(path) {
            if inner.denied.lock().unwrap().contains(&r) {
                let verb = match (req.method.as_str(), is_watch) {
                    (_, true) => "watch",
                    ("GET", _) if r == "pods/exec" => "create",
                    ("GET", _) => "list",
                    ("POST", _) => "create",
                    _ => "update",
                };
                let (ns, name) =
                    (Resource::from_path(path)).map_or((None, None), |(_, ns, n)| (ns, n));
                let name = name.or_else(|| {
                    path.strip_suffix("/exec")
                        .and_then(|p| p.rsplit('/').next())
                        .map(str::to_owned)
                });
                let (code, body) = exec::forbidden(
                    verb,
                    &r,
                    name.as_deref(),
                    ns.as_deref().or(path.split('/').nth(4)),
                );
                respond(reader.get_mut(), code, &body)?;
                continue;
            }
        }
        // pods/exec: the connection is the exec's from here.
        if path.ends_with("/exec") {
            return exec::handle(inner, reader, path, query, &req.upgrade)
                .unwrap_or_else(|| respond(&mut std::io::sink(), 404, &json!({})));
        }
        let out = reader.get_mut();
        if path == "/apis/events.k8s.io/v1/events" {
            let (code, body) = events::list_all(inner, param("fieldSelector"));
            respond(out, code, &body)?;
            continue;
        }
        if let Some((code, body)) = events::handle(inner, &req.method, path, &req.body) {
            respond(out, code, &body)?;
            continue;
        }
        let Some((res, ns, name)) = Resource::from_path(path) else {
            respond(
                out,
                404,
                &status(404, "NotFound", &format!("no such path {path}")),
            )?;
            continue;
        };
        let fault = inner.state.lock().unwrap().faults.get(&res).copied();
        if let Some(Fault::Status(code)) = fault {
            let reason = match code {
                401 => "Unauthorized",
                403 => "Forbidden",
                _ => "InternalError",
            };
            respond(
                out,
                code,
                &status(code, reason, &format!("fake API: {reason} for {path}")),
            )?;
            continue;
        }
        if req.method != "GET" {
            let (code, body) = write(inner, &req.method, res, ns.as_deref(), name, &req.body);
            respond(out, code, &body)?;
            continue;
        }
        if let Some(name) = name {
            let (code, body) = {
                let mut st = inner.state.lock().unwrap();
                st.gets += 1;
                let key = (res, ns.clone().unwrap_or_default(), name.clone());
                match st.objects.get(&key) {
                    Some(o) => (200, o.clone()),
                    None => (
                        404,
                        status(404, "NotFound", &format!("{} {name} not found", res.kind())),
                    ),
                }
            };
            respond(out, code, &body)?;
            continue;
        }
        let old_fields = inner.state.lock().unwrap().old_service_fields;
        let fields = match field_selector(res, param("fieldSelector"), old_fields) {
            Ok(f) => f,
            Err(msg) => {
                respond(out, 400, &status(400, "BadRequest", &msg))?;
                continue;
            }
        };
        let filter = Filter {
            res,
            ns: ns.as_deref(),
            selector: param("labelSelector"),
            fields,
        };
        if !is_watch {
            let limit = param("limit").and_then(|v| v.parse().ok());
            let cont = param("continue");
            respond(out, 200, &list(inner, &filter, limit, cont))?;
            continue;
        }
        let from: u64 = param("resourceVersion")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let timeout = param("timeoutSeconds")
            .and_then(|v| v.parse().ok())
            .map_or(Duration::from_secs(300), Duration::from_secs);
        let bookmarks = param("allowWatchBookmarks") == Some("true");
        let watched = (reader.into_inner(), (inner, &key));
        match watch_stream(watched, &filter, from, timeout, bookmarks)? {
            // Ended by the server, properly: the connection is the
            // client's for its next request, as on a real server. The
            // watch counted its own bytes.
            Some(conn) => {
                reader = BufReader::new(conn);
                answering = None;
            }
            None => return Ok(()),
        }
    }
}

/// A write, as the real server checks it: POST creates (409 if the name is
/// taken), PUT replaces only at the current resourceVersion (409 Conflict
/// otherwise; 404 if gone), DELETE removes (404 if gone). Leases only.
fn write(
    inner: &Inner,
    method: &str,
    res: Resource,
    ns: Option<&str>,
    name: Option<String>,
    body: &[u8],
) -> (u16, Value) {
    let Some(ns) = ns.filter(|_| res == Resource::Leases) else {
        return (
            405,
            status(
                405,
                "MethodNotAllowed",
                "fake API: writes are for namespaced Leases only",
            ),
        );
    };
    let current = |name: &str| {
        let st = inner.state.lock().unwrap();
        st.objects
            .get(&(res, ns.to_owned(), name.to_owned()))
            .cloned()
    };
    let object = || -> Result<Value, (u16, Value)> {
        let mut o: Value = serde_json::from_slice(body)
            .map_err(|e| (400, status(400, "BadRequest", &format!("body: {e}"))))?;
        o["metadata"]["namespace"] = json!(ns);
        Ok(o)
    };
    let stored = |name: &str| current(name).unwrap_or(Value::Null);
    match (method, name) {
        ("POST", None) => {
            let o = match object() {
                Ok(o) => o,
                Err(e) => return e,
            };
            let name = o["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            if current(&name).is_some() {
                return (
                    409,
                    status(
                        409,
                        "AlreadyExists",
                        &format!("leases \"{name}\" already exists"),
                    ),
                );
            }
            apply(inner, res, o);
            (201, stored(&name))
        }
        ("PUT", Some(name)) => {
            let o = match object() {
                Ok(o) => o,
                Err(e) => return e,
            };
            let Some(cur) = current(&name) else {
                return (
                    404,
                    status(404, "NotFound", &format!("leases \"{name}\" not found")),
                );
            };
            if o["metadata"]["resourceVersion"] != cur["metadata"]["resourceVersion"] {
                return (409, status(409, "Conflict", &format!("Operation cannot be fulfilled on leases \"{name}\": the object has been modified")));
            }
            apply(inner, res, o);
            (200, stored(&name))
        }
        ("DELETE", Some(name)) => {
            let Some(gone) = current(&name) else {
                return (
                    404,
                    status(404, "NotFound", &format!("leases \"{name}\" not found")),
                );
            };
            delete(inner, res, ns, &name);
            (200, gone)
        }
        _ => (
            405,
            status(
                405,
                "MethodNotAllowed",
                &format!("fake API: {method} not served here"),
            ),
        ),
    }
}

/// True while `res` has a stuck-watch fault.
fn stuck(inner: &Inner, res: Resource) -> bool {
    inner.state.lock().unwrap().faults.get(&res) == Some(&Fault::StuckWatch)
}

/// Half a chunk, then silence until the client goes away or the test ends.
fn hang(mut out: Conn, inner: &Inner) -> Result<()> {
    out.write_all(b"40\r\n{\"type\":\"MODIFIED\",\"obj")?;
    out.flush()?;
    out.tcp()
        .set_read_timeout(Some(Duration::from_millis(200)))?;
    let mut b = [0u8; 64];
    while !inner.stop.load(Ordering::SeqCst) {
        match out.read(&mut b) {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return Ok(()),
        }
    }
    Ok(())
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code})
}

fn respond(out: &mut impl Write, code: u16, body: &Value) -> Result<()> {
    let body = body.to_string();
    out.write_all(
        format!(
            "HTTP/1.1 {code} OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )?;
    out.flush()?;
    Ok(())
}

/// Percent-decoding of a query value (selectors arrive encoded).
fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 3 <= b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Which objects a list or watch covers.
struct Filter<'a> {
    res: Resource,
    ns: Option<&'a str>,
    selector: Option<&'a str>,
    fields: Vec<FieldTerm>,
}

impl Filter<'_> {
    fn covers(&self, res: Resource, ns: &str, obj: &Value) -> bool {
        res == self.res
            && self.ns.is_none_or(|n| n == ns)
            && matches_selector(obj, self.selector)
            && self.fields.iter().all(|t| t.matches(obj))
    }

    /// An event as a watch with this filter shows it, as the real server's
    /// watch cache does: a change that makes an object match is ADDED, one
    /// that makes it stop matching is DELETED (with its previous content).
    fn seen<'e>(&self, e: &'e Event) -> Option<(&'static str, &'e Value)> {
        let now = self.covers(e.res, &e.ns, &e.object);
        let before = e.prev.as_ref().map(|p| self.covers(e.res, &e.ns, p));
        match (e.kind, before) {
            ("MODIFIED", Some(true)) if now => Some(("MODIFIED", &e.object)),
            ("MODIFIED", Some(true)) => e.prev.as_ref().map(|p| ("DELETED", p)),
            ("MODIFIED", _) if now => Some(("ADDED", &e.object)),
            ("MODIFIED", _) => None,
            (kind, _) => now.then_some((kind, &e.object)),
        }
    }
}

/// One term of a field selector: `path=value` or `path!=value`.
struct FieldTerm {
    path: String,
    value: String,
    equal: bool,
}

impl FieldTerm {
    fn matches(&self, obj: &Value) -> bool {
        let mut v = obj;
        for part in self.path.split('.') {
            v = &v[part];
        }
        // An unset field reads as "" (spec.type of a Service created
        // without one is defaulted to ClusterIP by a real server).
        let got = v.as_str().unwrap_or(match self.path.as_str() {
            "spec.type" => "ClusterIP",
            _ => "",
        });
        (got == self.value) == self.equal
    }
}

/// A field selector as the real server parses it: only the fields each
/// resource registers are accepted, anything else is 400 Bad Request with
/// the server's message (`field label not supported: ...`).
fn field_selector(res: Resource, sel: Option<&str>, old: bool) -> Result<Vec<FieldTerm>, String> {
    let Some(sel) = sel.filter(|s| !s.is_empty()) else {
        return Ok(Vec::new());
    };
    sel.split(',')
        .map(|term| {
            let (path, value, equal) = if let Some((k, v)) = term.split_once("!=") {
                (k, v, false)
            } else if let Some((k, v)) = term.split_once("==") {
                (k, v, true)
            } else if let Some((k, v)) = term.split_once('=') {
                (k, v, true)
            } else {
                return Err(format!(
                    "invalid selector: '{term}'; can't understand '{term}'"
                ));
            };
            let path = path.trim();
            let known = matches!(path, "metadata.name" | "metadata.namespace")
                || (res == Resource::Services
                    && !old
                    && matches!(path, "spec.type" | "spec.clusterIP"));
            if !known {
                return Err(format!("field label not supported: {path}"));
            }
            Ok(FieldTerm {
                path: path.to_owned(),
                value: value.trim().to_owned(),
                equal,
            })
        })
        .collect()
}

/// Equality-based label selectors (`k=v`, `k==v`, `k!=v`, `k`, `!k`); any
/// other form fails the test loudly rather than matching everything.
fn matches_selector(obj: &Value, selector: Option<&str>) -> bool {
    let Some(sel) = selector.filter(|s| !s.is_empty()) else {
        return true;
    };
    let labels = &obj["metadata"]["labels"];
    sel.split(',').all(|term| {
        let term = term.trim();
        if let Some((k, v)) = term.split_once("!=") {
            labels[k.trim()].as_str() != Some(v.trim())
        } else if let Some((k, v)) = term.split_once('=') {
            labels[k.trim()].as_str() == Some(v.trim_start_matches('=').trim())
        } else if let Some(k) = term.strip_prefix('!') {
            labels[k.trim()].is_null()
        } else {
            assert!(
                !term.contains(' ') && !term.contains('('),
                "fake API: unsupported selector {term:?}"
            );
            !labels[term].is_null()
        }
    })
}

/// One page of a list; `cont` is the offset the previous page handed out.
/// One page of a list; `cont` is the token the previous page handed out
/// (the key of its last object: a page costs its own size, not the
/// collection's, as on a real server).
fn list(inner: &Inner, f: &Filter<'_>, limit: Option<usize>, cont: Option<&str>) -> Value {
    let mut st = inner.state.lock().unwrap();
    if cont.is_none() {
        st.lists += 1;
    }
    let start = match cont.and_then(|c| c.split_once('/')) {
        Some((ns, name)) => std::ops::Bound::Excluded((f.res, ns.to_owned(), name.to_owned())),
        None => std::ops::Bound::Included((f.res, String::new(), String::new())),
    };
    let mut matching = st
        .objects
        .range((start, std::ops::Bound::Unbounded))
        .take_while(|((r, _, _), _)| *r == f.res)
        .filter(|((r, n, _), o)| f.covers(*r, n, o));
    let limit = limit.unwrap_or(usize::MAX);
    let mut items = Vec::new();
    let mut last = None;
    for ((_, ns, name), o) in matching.by_ref() {
        items.push(o);
        last = Some(format!("{ns}/{name}"));
        if items.len() == limit {
            break;
        }
    }
    let mut metadata = json!({"resourceVersion": st.rv.to_string()});
    if items.len() == limit && matching.next().is_some() {
        metadata["continue"] = json!(last);
    }
    let res = f.res;
    json!({"apiVersion": res.api_version(), "kind": format!("{}List", res.kind()), "metadata": metadata, "items": items})
}

/// One chunk of a watch, written at once: one TCP segment per event, as a
/// real server's buffered writer sends it (not one for the size line and
/// another for the data).
fn chunk(out: &mut impl Write, line: &Value) -> std::io::Result<()> {
    let data = format!("{line}\n");
    out.write_all(format!("{:x}\r\n{data}\r\n", data.len()).as_bytes())?;
    out.flush()
}

/// A watch, to its end: the connection back when the server ended the
/// stream properly (its timeout, a 410), None when it was cut or hung.
fn watch_stream(
    (mut out, (inner, key)): (Conn, (&Inner, &TallyKey)),
    f: &Filter<'_>,
    from: u64,
    timeout: Duration,
    bookmarks: bool,
) -> Result<Option<Conn>> {
    let mut mark = out.written;
    let mut count = |out: &Conn, events: u64, bookmarks: u64| {
        let bytes = out.written - mark;
        mark = out.written;
        let c = Counts {
            bytes,
            events,
            bookmarks,
            ..Counts::default()
        };
        inner.tally.lock().unwrap().add(key, c);
    };
    write!(
        out,
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )?;
    count(&out, 0, 0);
    if stuck(inner, f.res) {
        return hang(out, inner).map(|()| None);
    }
    let deadline = Instant::now() + timeout;
    let mut sent_up_to = from;
    let mut last_bookmark = Instant::now();
    let mut st = inner.state.lock().unwrap();
    let generation = st.generation;
    if from < st.compacted {
        let gone = status(
            410,
            "Expired",
            &format!("too old resource version: {from} ({})", st.compacted),
        );
        drop(st);
        chunk(&mut out, &json!({"type": "ERROR", "object": gone}))?;
        write!(out, "0\r\n\r\n")?;
        out.flush()?;
        count(&out, 1, 0);
        return Ok(Some(out));
    }
    loop {
        if inner.stop.load(Ordering::SeqCst) || st.generation != generation || st.down {
            // A cut connection: no terminating chunk, just close.
            return Ok(None);
        }
        if st.faults.get(&f.res) == Some(&Fault::StuckWatch) {
            drop(st);
            return hang(out, inner).map(|()| None);
        }
        if Instant::now() >= deadline {
            // timeoutSeconds reached: the server ends the stream properly.
            drop(st);
            write!(out, "0\r\n\r\n")?;
            out.flush()?;
            count(&out, 0, 0);
            return Ok(Some(out));
        }
        let first = st.log.partition_point(|e| e.rv <= sent_up_to);
        let lines: Vec<Value> = st.log[first..]
            .iter()
            .filter_map(|e| Some((e.rv, f.seen(e)?)))
            .map(|(rv, (kind, object))| {
                // A DELETED made of the previous content carries the
                // event's resourceVersion, as on a real server.
                let mut object = object.clone();
                object["metadata"]["resourceVersion"] = json!(rv.to_string());
                json!({"type": kind, "object": object})
            })
            .collect();
        sent_up_to = st.rv;
        let res = f.res;
        let every = Duration::from_millis(inner.bookmark_every_ms.load(Ordering::Relaxed));
        let bookmark = (bookmarks && last_bookmark.elapsed() >= every).then(|| {
            json!({"type": "BOOKMARK", "object": {"kind": res.kind(), "apiVersion": res.api_version(), "metadata": {"resourceVersion": st.rv.to_string()}}})
        });
        drop(st);
        for l in &lines {
            chunk(&mut out, l)?;
        }
        let marked = bookmark.is_some();
        if let Some(b) = bookmark {
            chunk(&mut out, &b)?;
            last_bookmark = Instant::now();
        }
        if marked || !lines.is_empty() {
            count(&out, lines.len() as u64, u64::from(marked));
        }
        st = inner.state.lock().unwrap();
        if st.rv == sent_up_to {
            st = inner
                .changed
                .wait_timeout(st, Duration::from_millis(200))
                .unwrap()
                .0;
        }
    }
}

/// Object builders with the fields the real objects have.
pub mod objects {
    use serde_json::{json, Value};

    pub fn service(ns: &str, name: &str, ips: &[&str]) -> Value {
        let ingress: Vec<Value> = ips
            .iter()
            .map(|ip| json!({"ip": ip, "ipMode": "VIP"}))
            .collect();
        json!({
            "metadata": {"name": name, "namespace": ns},
            "spec": {"type": "LoadBalancer", "ports": [{"port": 443, "protocol": "TCP"}], "externalTrafficPolicy": "Local"},
            "status": {"loadBalancer": {"ingress": ingress}}
        })
    }

    /// A ClusterIP Service as a Helm chart leaves it on a real server:
    /// labels, a selector, two ports, the Helm annotations and the
    /// managed fields the server adds (about 2.5 kB of JSON). `i` makes its
    /// cluster IP.
    pub fn cluster_ip_service(ns: &str, name: &str, i: usize) -> Value {
        let ip = format!("10.96.{}.{}", (i / 256) % 256, i % 256);
        let labels = json!({
            "app.kubernetes.io/name": name, "app.kubernetes.io/instance": name,
            "app.kubernetes.io/managed-by": "Helm", "app.kubernetes.io/component": "server",
            "helm.sh/chart": format!("{name}-1.4.2")
        });
        json!({
            "metadata": {
                "name": name, "namespace": ns, "labels": labels,
                "annotations": {"meta.helm.sh/release-name": name, "meta.helm.sh/release-namespace": ns},
                "creationTimestamp": "2026-11-30T10:00:00Z",
                "managedFields": [managed_field("helm", "Update", json!({
                    "f:metadata": {"f:annotations": {".": {}, "f:meta.helm.sh/release-name": {}, "f:meta.helm.sh/release-namespace": {}},
                        "f:labels": {".": {}, "f:app.kubernetes.io/component": {}, "f:app.kubernetes.io/instance": {},
                            "f:app.kubernetes.io/managed-by": {}, "f:app.kubernetes.io/name": {}, "f:helm.sh/chart": {}}},
                    "f:spec": {"f:internalTrafficPolicy": {}, "f:ports": {".": {},
                        "k:{\"port\":80,\"protocol\":\"TCP\"}": {".": {}, "f:name": {}, "f:port": {}, "f:protocol": {}, "f:targetPort": {}},
                        "k:{\"port\":9090,\"protocol\":\"TCP\"}": {".": {}, "f:name": {}, "f:port": {}, "f:protocol": {}, "f:targetPort": {}}},
                        "f:selector": {}, "f:sessionAffinity": {}, "f:type": {}}
                }))]
            },
            "spec": {
                "type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip],
                "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack",
                "internalTrafficPolicy": "Cluster", "sessionAffinity": "None",
                "selector": {"app.kubernetes.io/name": name, "app.kubernetes.io/instance": name},
                "ports": [
                    {"name": "http", "port": 80, "protocol": "TCP", "targetPort": "http"},
                    {"name": "metrics", "port": 9090, "protocol": "TCP", "targetPort": 9090}
                ]
            },
            "status": {"loadBalancer": {}}
        })
    }

    /// One `metadata.managedFields` entry.
    pub fn managed_field(manager: &str, operation: &str, fields: Value) -> Value {
        json!({"apiVersion": "v1", "fieldsType": "FieldsV1", "fieldsV1": fields,
            "manager": manager, "operation": operation, "time": "2026-11-30T10:00:00Z"})
    }

    /// A Node (only what a metadata list reads).
    pub fn node(name: &str) -> Value {
        json!({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}})
    }

    /// The guard's Pod on `node`, as the DaemonSet's controller and the
    /// kubelet leave it (labels, owner, a container, its status and Ready
    /// condition; about 2 kB of JSON, a real one with its managed fields
    /// is 5-8 kB).
    pub fn guard_pod(ns: &str, node: &str, ready: bool) -> Value {
        let r = if ready { "True" } else { "False" };
        json!({
            "metadata": {"name": format!("arp-guard-{node}"), "namespace": ns,
                "labels": {"app.kubernetes.io/name": "arp-guard", "controller-revision-hash": "6d9f8b7c5d", "pod-template-generation": "1"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "arp-guard", "uid": "ds-uid", "controller": true, "blockOwnerDeletion": true}]},
            "spec": {"nodeName": node, "serviceAccountName": "arp-guard", "hostNetwork": true,
                "containers": [{"name": "arp-guard", "image": "arp-guard:0.1.0", "args": ["run", "--announcer", "cilium"],
                    "readinessProbe": {"httpGet": {"host": "127.0.0.1", "port": 9477, "path": "/readyz"}, "periodSeconds": 5}}]},
            "status": {"phase": "Running", "hostIP": "203.0.113.11", "podIP": "203.0.113.11",
                "conditions": [
                    {"type": "Initialized", "status": "True", "lastTransitionTime": "2026-11-30T10:00:00Z"},
                    {"type": "Ready", "status": r, "lastTransitionTime": "2026-11-30T10:00:05Z"},
                    {"type": "ContainersReady", "status": r, "lastTransitionTime": "2026-11-30T10:00:05Z"},
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-11-30T10:00:00Z"}],
                "containerStatuses": [{"name": "arp-guard", "ready": ready, "restartCount": 0, "image": "arp-guard:0.1.0",
                    "state": {"running": {"startedAt": "2026-11-30T10:00:01Z"}}}]}
        })
    }

    /// `renewTime` now, as client-go writes it.
    pub fn renew_now() -> String {
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        let (secs, days) = (d.as_secs() % 86_400, (d.as_secs() / 86_400) as i64);
        // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z - era * 146_097;
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = doy - (153 * mp + 2) / 5 + 1;
        let month = if mp < 10 { mp + 3 } else { mp - 9 };
        let year = yoe + era * 400 + i64::from(month <= 2);
        format!(
            "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
            secs / 3600,
            secs / 60 % 60,
            secs % 60,
            d.subsec_micros()
        )
    }

    /// A Lease as client-go's leader election writes it.
    pub fn lease(ns: &str, name: &str, holder: &str, duration_s: i32, renew: &str) -> Value {
        json!({
            "metadata": {"name": name, "namespace": ns},
            "spec": {
                "holderIdentity": holder,
                "leaseDurationSeconds": duration_s,
                "acquireTime": "2026-11-30T10:00:00.000000Z",
                "renewTime": renew,
                "leaseTransitions": 0
            }
        })
    }

    /// The Lease by which Cilium's L2 announcer holds Service
    /// `default/<service>`: `cilium-l2announce-default-<service>` in
    /// kube-system.
    pub fn cilium_lease(service: &str, holder: &str, duration_s: i32, renew: &str) -> Value {
        lease(
            "kube-system",
            &format!("cilium-l2announce-default-{service}"),
            holder,
            duration_s,
            renew,
        )
    }

    /// MetalLB's ServiceL2Status (generateName l2-).
    pub fn l2status(ns: &str, name: &str, node: &str, svc_ns: &str, svc_name: &str) -> Value {
        json!({
            "metadata": {
                "name": name,
                "namespace": ns,
                "labels": {"metallb.io/node": node, "metallb.io/service-name": svc_name, "metallb.io/service-namespace": svc_ns}
            },
            "status": {"node": node, "serviceName": svc_name, "serviceNamespace": svc_ns, "interfaces": [{"name": "eth0"}]}
        })
    }
}
