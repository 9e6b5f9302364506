//! The server's connections: the accept loop, the requests of one
//! keep-alive connection, and each request routed to what answers it
//! (authentication, RBAC, pods/exec, events, then the watched resources:
//! faults, writes, GET, list, watch).

use std::{
    collections::BTreeMap,
    io::{BufRead as _, BufReader, Read},
    net::{TcpListener, TcpStream},
    sync::{atomic::Ordering, Arc},
    time::Duration,
};

use anyhow::{Context as _, Result};
use serde_json::json;

use super::{
    auth,
    conn::{decode, respond, Conn},
    events, exec, faults,
    select::{self, Filter},
    status, store,
    tally::{self, Counts, Key as TallyKey},
    watch, write, FakeApi, Inner, Resource,
};

impl FakeApi {
    /// Connections accepted so far (a client that keeps its connection
    /// after a watch the server ended opens none for the next one).
    pub fn connections(&self) -> u64 {
        self.inner.next_conn.load(Ordering::Relaxed)
    }

    /// Requests served so far.
    pub fn requests(&self) -> u64 {
        self.inner.state.lock().unwrap().requests
    }
}

pub(super) fn accept_loop(listener: TcpListener, inner: Arc<Inner>) {
    while !inner.stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, peer)) => {
                let mut st = inner.state.lock().unwrap();
                let elsewhere = st.only_from.is_some_and(|ip| ip != peer.ip());
                st.refused += u64::from(elsewhere);
                if st.down || elsewhere {
                    drop(st);
                    drop(stream);
                    continue;
                }
                drop(st);
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

/// One request's line and the headers the server reads.
struct Request {
    method: String,
    target: String,
    /// The request's body (writes).
    body: Vec<u8>,
    /// The bearer token presented, if any.
    token: Option<String>,
    /// The client asked for a server-side Table (`Accept: ...;as=Table`).
    table: bool,
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
    let mut table = false;
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
        } else if name.eq_ignore_ascii_case("accept") {
            table = value.contains("as=Table");
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
        table,
        upgrade,
    }))
}

/// A request's target: its path, and its query with the parameters
/// decoded.
struct Target<'a> {
    path: &'a str,
    query: &'a str,
    params: BTreeMap<&'a str, String>,
}

impl<'a> Target<'a> {
    fn parse(target: &'a str) -> Self {
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        let params = query
            .split('&')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k, decode(v)))
            .collect();
        Target {
            path,
            query,
            params,
        }
    }

    fn param(&self, k: &str) -> Option<&str> {
        self.params.get(k).map(String::as_str)
    }

    fn is_watch(&self) -> bool {
        matches!(self.param("watch"), Some("true") | Some("1"))
    }
}

/// What is left of the connection once a request is answered.
enum After {
    /// The client's, for its next request.
    Kept(BufReader<Conn>),
    /// The client's after a watch the server ended properly (the watch
    /// counted its own bytes).
    Watched(Conn),
    /// Done with: closed, cut, or taken over (pods/exec).
    Closed,
}

/// Serve requests on one keep-alive connection, also after a watch the
/// server ended properly, until the client closes it or a watch is cut.
fn serve(stream: TcpStream, inner: &Inner) -> Result<()> {
    stream.set_nonblocking(false)?;
    // A black hole holds the connection open and says nothing.
    faults::blackhole(inner);
    let tls = inner.tls.lock().unwrap().clone();
    let peer = stream.peer_addr()?.ip();
    let mut reader = BufReader::new(Conn::open(stream, tls)?);
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
        faults::blackhole(inner);
        let t = Target::parse(&req.target);
        let key = tally::key(
            peer,
            &req.method,
            t.path,
            t.is_watch(),
            t.param("labelSelector"),
        );
        let read = matches!(key.1, "get" | "list") && t.param("continue").is_none();
        let quorum = read && t.param("resourceVersion").is_none_or(str::is_empty);
        let one = Counts {
            requests: 1,
            quorum: u64::from(quorum),
            ..Counts::default()
        };
        {
            let mut tally = inner.tally.lock().unwrap();
            tally.add(&key, one);
            tally.scopes.insert(tally::scope(&key, t.path));
        }
        answering = Some((key.clone(), reader.get_ref().written));
        {
            let mut st = inner.state.lock().unwrap();
            st.requests += 1;
            if st.down {
                return Ok(());
            }
        }
        match answer(inner, reader, &req, &t, &key)? {
            After::Kept(r) => reader = r,
            After::Watched(conn) => {
                reader = BufReader::new(conn);
                answering = None;
            }
            After::Closed => return Ok(()),
        }
    }
}

/// Answer one request: authentication and RBAC first, then pods/exec,
/// events, and the watched resources.
fn answer(
    inner: &Inner,
    mut reader: BufReader<Conn>,
    req: &Request,
    t: &Target<'_>,
    key: &TallyKey,
) -> Result<After> {
    let path = t.path;
    let refused = auth::check_token(inner, req.token.as_deref(), path)
        // RBAC: a resource the test denied.
        .or_else(|| exec::denied(inner, &req.method, path, t.is_watch()));
    if let Some((code, body)) = refused {
        respond(reader.get_mut(), code, &body)?;
        return Ok(After::Kept(reader));
    }
    // pods/exec: the connection is the exec's from here.
    if path.ends_with("/exec") {
        exec::handle(inner, reader, path, t.query, &req.upgrade)
            .unwrap_or_else(|| respond(&mut std::io::sink(), 404, &json!({})))?;
        return Ok(After::Closed);
    }
    let out = reader.get_mut();
    let event = if path == "/apis/events.k8s.io/v1/events" {
        let page = (
            t.param("limit").and_then(|l| l.parse().ok()),
            t.param("continue"),
        );
        Some(events::list_all(inner, t.param("fieldSelector"), page))
    } else {
        events::handle(inner, &req.method, path, &req.body)
    };
    if let Some((code, body)) = event {
        respond(out, code, &body)?;
        return Ok(After::Kept(reader));
    }
    let Some(at) = Resource::from_path(path) else {
        respond(
            out,
            404,
            &status(404, "NotFound", &format!("no such path {path}")),
        )?;
        return Ok(After::Kept(reader));
    };
    resource(inner, reader, (req, t, key), at)
}

/// Answer a request for a watched resource: its fault, a write, a GET, a
/// list or a watch.
fn resource(
    inner: &Inner,
    mut reader: BufReader<Conn>,
    (req, t, key): (&Request, &Target<'_>, &TallyKey),
    (res, ns, name): (Resource, Option<String>, Option<String>),
) -> Result<After> {
    if req.method == "GET" && name.is_some() && faults::hold_get(inner, res) {
        return Ok(After::Closed);
    }
    let out = reader.get_mut();
    let answered = if let Some(fault) = faults::answer(inner, res, t.path) {
        Some(fault)
    } else if req.method != "GET" {
        Some(write::write(
            inner,
            &req.method,
            res,
            (ns.as_deref(), name),
            &req.body,
            req.token.as_deref(),
        ))
    } else {
        name.map(|name| store::get(inner, res, ns.as_deref(), &name))
    };
    if let Some((code, body)) = answered {
        respond(out, code, &body)?;
        return Ok(After::Kept(reader));
    }
    let old_fields = inner.state.lock().unwrap().old_service_fields;
    let fields = match select::field_selector(res, t.param("fieldSelector"), old_fields) {
        Ok(f) => f,
        Err(msg) => {
            respond(out, 400, &status(400, "BadRequest", &msg))?;
            return Ok(After::Kept(reader));
        }
    };
    let filter = Filter {
        res,
        ns: ns.as_deref(),
        selector: t.param("labelSelector"),
        fields,
    };
    if !t.is_watch() {
        let limit = t.param("limit").and_then(|v| v.parse().ok());
        let cont = t.param("continue");
        let list = select::list(inner, &filter, limit, cont);
        let list = if req.table {
            super::table::of(res, &list)
        } else {
            list
        };
        respond(out, 200, &list)?;
        return Ok(After::Kept(reader));
    }
    let from: u64 = t
        .param("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let timeout = t
        .param("timeoutSeconds")
        .and_then(|v| v.parse().ok())
        .map_or(Duration::from_secs(300), Duration::from_secs);
    let bookmarks = t.param("allowWatchBookmarks") == Some("true");
    let watched = (reader.into_inner(), (inner, key));
    // Ended by the server, properly: the connection is the client's for
    // its next request, as on a real server.
    Ok(
        match watch::watch_stream(watched, &filter, from, timeout, bookmarks)? {
            Some(conn) => After::Watched(conn),
            None => After::Closed,
        },
    )
}
