//! pods/exec as the real API server serves it to a WebSocket client
//! (`kubectl exec` since 1.30, kube-rs): `GET .../pods/NAME/exec?command=..
//! &container=..&stdout=true&stderr=true` upgraded to a WebSocket with the
//! subprotocol `v5.channel.k8s.io` (when offered) or `v4.channel.k8s.io`;
//! every binary message starts with its channel (1 stdout, 2 stderr, 3 the
//! exit status as a `metav1.Status`); then a Close frame. The command runs
//! where the test says (its node's namespace: [`FakeApi::set_exec`]); a
//! request for a resource the test denied gets the real 403.

use std::{
    io::{BufReader, Read, Write},
    process::{Command, Stdio},
    sync::mpsc,
};

use base64::Engine as _;
use serde_json::{json, Value};

use super::{
    conn::{decode, respond, Conn},
    status, FakeApi, Inner, Resource,
};

/// The WebSocket handshake's constant (RFC 6455).
const GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// One exec the server runs: the Pod, its node, and the command line.
#[derive(Debug, Clone)]
pub struct ExecCall {
    pub namespace: String,
    pub pod: String,
    pub node: String,
    pub container: String,
    pub command: Vec<String>,
}

/// Turns an exec into the process that runs it.
pub type ExecHook = Box<dyn Fn(&ExecCall) -> Command + Send + Sync>;

impl FakeApi {
    /// Run each exec as `hook` says (without a hook, execs answer 500).
    pub fn set_exec(&self, hook: ExecHook) {
        *self.inner.exec.lock().unwrap() = Some(hook);
    }

    /// Answer every request for `resource` (e.g. `pods/exec`, `services`)
    /// with the real server's 403, as RBAC would for a user without it.
    pub fn deny(&self, resource: &str) {
        self.inner
            .denied
            .lock()
            .unwrap()
            .insert(resource.to_owned());
    }

    /// Execs run so far: the command lines.
    pub fn execs(&self) -> Vec<ExecCall> {
        self.inner.exec_log.lock().unwrap().clone()
    }
}

/// The handshake headers of a request.
#[derive(Debug, Default, Clone)]
pub(super) struct Upgrade {
    pub key: Option<String>,
    pub protocols: Vec<String>,
}

impl Upgrade {
    /// Read a header line into the handshake, if it belongs there.
    pub(super) fn header(&mut self, name: &str, value: &str) {
        if name.eq_ignore_ascii_case("sec-websocket-key") {
            self.key = Some(value.trim().to_owned());
        } else if name.eq_ignore_ascii_case("sec-websocket-protocol") {
            (self.protocols).extend(value.split(',').map(|p| p.trim().to_owned()));
        }
    }
}

/// A 403 for `verb` on `resource` as the real server words it.
fn forbidden(verb: &str, resource: &str, name: Option<&str>, ns: Option<&str>) -> (u16, Value) {
    let (plural, sub) = resource.split_once('/').unwrap_or((resource, ""));
    let group = match plural {
        "leases" => "coordination.k8s.io",
        "events" => "events.k8s.io",
        _ => "",
    };
    let subject = match name {
        Some(n) => format!("{plural} \"{n}\""),
        None => plural.to_owned(),
    };
    let scope = match ns {
        Some(ns) => format!("in the namespace \"{ns}\""),
        None => "at the cluster scope".into(),
    };
    let full = if sub.is_empty() {
        plural.to_owned()
    } else {
        format!("{plural}/{sub}")
    };
    let message = format!(
        "{subject} is forbidden: User \"alice\" cannot {verb} resource \"{full}\" in API group \"{group}\" {scope}"
    );
    (403, status(403, "Forbidden", &message))
}

/// The 403 for a request for a resource the test denied (None: allowed).
pub(super) fn denied(
    inner: &Inner,
    method: &str,
    path: &str,
    is_watch: bool,
) -> Option<(u16, Value)> {
    let r = rbac_resource(path)?;
    if !inner.denied.lock().unwrap().contains(&r) {
        return None;
    }
    let verb = match (method, is_watch) {
        (_, true) => "watch",
        ("GET", _) if r == "pods/exec" => "create",
        ("GET", _) => "list",
        ("POST", _) => "create",
        _ => "update",
    };
    let (ns, name) = (Resource::from_path(path)).map_or((None, None), |(_, ns, n)| (ns, n));
    let name = name.or_else(|| {
        path.strip_suffix("/exec")
            .and_then(|p| p.rsplit('/').next())
            .map(str::to_owned)
    });
    Some(forbidden(
        verb,
        &r,
        name.as_deref(),
        ns.as_deref().or(path.split('/').nth(4)),
    ))
}

/// The resource a request path names, as RBAC sees it (`pods/exec`).
fn rbac_resource(path: &str) -> Option<String> {
    if path.ends_with("/exec") {
        return Some("pods/exec".into());
    }
    if path.starts_with("/apis/events.k8s.io/") {
        return Some("events".into());
    }
    let (res, _, _) = Resource::from_path(path)?;
    Some(res.plural().to_owned())
}

/// Serve an exec request on `reader`'s connection: None if `path` is not
/// one, else the connection is done with (answered, upgraded or refused).
pub(super) fn handle(
    inner: &Inner,
    reader: BufReader<Conn>,
    path: &str,
    query: &str,
    up: &Upgrade,
) -> Option<anyhow::Result<()>> {
    let rest = path.strip_prefix("/api/v1/namespaces/")?;
    let [ns, "pods", pod, "exec"] = rest.split('/').collect::<Vec<_>>()[..] else {
        return None;
    };
    let mut out = reader.into_inner();
    Some(serve(inner, &mut out, (ns, pod), query, up))
}

fn serve(
    inner: &Inner,
    out: &mut Conn,
    (ns, pod): (&str, &str),
    query: &str,
    up: &Upgrade,
) -> anyhow::Result<()> {
    let mut command = Vec::new();
    let mut container = String::new();
    for (k, v) in query.split('&').filter_map(|kv| kv.split_once('=')) {
        match k {
            "command" => command.push(decode(v)),
            "container" => container = decode(v),
            _ => {}
        }
    }
    let stored = {
        let st = inner.state.lock().unwrap();
        st.objects
            .get(&(Resource::Pods, ns.to_owned(), pod.to_owned()))
            .cloned()
    };
    let Some(p) = stored else {
        let body = status(404, "NotFound", &format!("pods \"{pod}\" not found"));
        return respond(out, 404, &body);
    };
    let node = p["spec"]["nodeName"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let proto = ["v5.channel.k8s.io", "v4.channel.k8s.io"]
        .into_iter()
        .find(|p| up.protocols.iter().any(|o| o == p));
    let (Some(key), Some(proto)) = (&up.key, proto) else {
        let body = status(
            400,
            "BadRequest",
            "exec needs a WebSocket upgrade with v5 or v4.channel.k8s.io",
        );
        return respond(out, 400, &body);
    };
    let call = ExecCall {
        namespace: ns.to_owned(),
        pod: pod.to_owned(),
        node,
        container,
        command,
    };
    inner.exec_log.lock().unwrap().push(call.clone());
    let cmd = inner.exec.lock().unwrap().as_ref().map(|hook| hook(&call));
    let Some(mut cmd) = cmd else {
        let body = status(500, "InternalError", "fake API: no exec hook");
        return respond(out, 500, &body);
    };
    let digest = ring::digest::digest(
        &ring::digest::SHA1_FOR_LEGACY_USE_ONLY,
        format!("{key}{GUID}").as_bytes(),
    );
    let accept = base64::engine::general_purpose::STANDARD.encode(digest.as_ref());
    write!(
        out,
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Accept: {accept}\r\nSec-WebSocket-Protocol: {proto}\r\n\r\n"
    )?;
    // The first message opens the stream (the real server sends an empty
    // one on the lowest channel asked for).
    frame(out, &[1])?;
    let code = run(&mut cmd, out)?;
    frame(
        out,
        &[&[3u8][..], exit_status(code).to_string().as_bytes()].concat(),
    )?;
    // Close (1000, normal).
    out.write_all(&[0x88, 0x02, 0x03, 0xe8])?;
    out.flush()?;
    Ok(())
}

/// Run the command, streaming its output as it comes; its exit code.
fn run(cmd: &mut Command, out: &mut Conn) -> std::io::Result<i32> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let (tx, rx) = mpsc::channel::<(u8, Vec<u8>)>();
    let pipes: Vec<(u8, Box<dyn Read + Send>)> = vec![
        (1, Box::new(child.stdout.take().expect("piped"))),
        (2, Box::new(child.stderr.take().expect("piped"))),
    ];
    for (channel, mut pipe) in pipes {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 16 << 10];
            while let Ok(n) = pipe.read(&mut buf) {
                if n == 0 || tx.send((channel, buf[..n].to_vec())).is_err() {
                    break;
                }
            }
        });
    }
    drop(tx);
    let mut gone = false;
    for (channel, data) in rx {
        // A client that went away (a plugin's deadline): the command still
        // runs to its end, its output is dropped.
        if !gone && frame(out, &[&[channel][..], &data].concat()).is_err() {
            gone = true;
        }
    }
    let status = child.wait()?;
    Ok(status.code().unwrap_or(-1))
}

/// The error channel's Status for an exit code.
fn exit_status(code: i32) -> Value {
    if code == 0 {
        return json!({"metadata": {}, "status": "Success"});
    }
    json!({
        "metadata": {}, "status": "Failure", "reason": "NonZeroExitCode",
        "message": format!("command terminated with non-zero exit code: error executing command, exit status {code}"),
        "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]}
    })
}

/// One binary message, unmasked (a server's).
fn frame(out: &mut Conn, payload: &[u8]) -> std::io::Result<()> {
    let mut head = vec![0x82u8];
    match payload.len() {
        n if n < 126 => head.push(n as u8),
        n if n <= u16::MAX as usize => {
            head.push(126);
            head.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            head.push(127);
            head.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    out.write_all(&head)?;
    out.write_all(payload)?;
    out.flush()
}

/// Denied resources, for [`Inner`].
pub(super) type Denied = std::sync::Mutex<std::collections::BTreeSet<String>>;
/// Recorded execs, for [`Inner`].
pub(super) type Log = std::sync::Mutex<Vec<ExecCall>>;
/// The hook, for [`Inner`].
pub(super) type Hook = std::sync::Mutex<Option<ExecHook>>;
