//! The Go peer (`tests/go/apipeer`): a Kubernetes-API-like server built
//! from Go's standard library, because kube-apiserver is Go's `net/http`
//! and the fake API ([`crate::fake_api`]) is the project's own reading of
//! it. It serves lists, single GETs and watches of an in-memory store, over
//! TLS offering `h2` and `http/1.1` by ALPN, and a test changes the store
//! and its behaviours (a 1xx before every answer, watch lines split into
//! tiny chunks, a connection closed after a watch) through its stdin, one
//! JSON command a line; it exits when its stdin closes.
//!
//! [`binary`] builds it once per test process with Debian's `golang-go`
//! (`go build`, nothing downloaded: `GOPROXY=off`, the cache under
//! `target/go-peer`), or says why the test is skipped where Go is missing;
//! `cargo xtask test` sets `ARP_GUARD_REQUIRE_GO` (its set-up installs
//! golang-go), so that a missing Go fails there instead.

use std::{
    io::{BufRead as _, BufReader, Write as _},
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, Stdio},
    sync::{mpsc, Mutex, OnceLock},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};
use serde_json::{json, Value};

use crate::Netns;

/// Set by `cargo xtask test`: a missing Go toolchain fails the test.
pub const REQUIRE_GO: &str = "ARP_GUARD_REQUIRE_GO";
/// The longest a build of the peer may take (a cold Go cache on 2 cores
/// takes a few seconds: the standard library comes compiled).
const BUILD_DEADLINE: Duration = Duration::from_secs(180);
/// The longest the peer may take to answer a command.
const REPLY: Duration = Duration::from_secs(10);

/// The peer's binary, built once per process; None (after a `SKIPPED`
/// line) where there is no Go toolchain and the run does not require one.
pub fn binary() -> Option<PathBuf> {
    static BUILT: OnceLock<Option<PathBuf>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            if !has_go() {
                if std::env::var_os(REQUIRE_GO).is_some() {
                    panic!(
                        "no Go toolchain (golang-go), and {REQUIRE_GO} says this run needs one: \
                         `cargo xtask setup` installs it"
                    );
                }
                // Straight to stderr: the harness shows what a passing test
                // printed with eprintln! only under --nocapture.
                let _ = writeln!(
                    std::io::stderr(),
                    "SKIPPED: no Go toolchain (golang-go); `cargo xtask setup` installs it"
                );
                return None;
            }
            Some(build().unwrap_or_else(|e| panic!("building the Go peer: {e:#}")))
        })
        .clone()
}

fn has_go() -> bool {
    Command::new("go")
        .arg("version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `target/`, from the running test binary's place (`target/debug/deps/`).
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let mut dir = exe.parent().expect("exe dir").to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir.pop();
    dir
}

/// `go build` of tests/go/apipeer into target/go-peer, offline, within
/// [`BUILD_DEADLINE`].
fn build() -> Result<PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("go/apipeer");
    let out = target_dir().join("go-peer");
    std::fs::create_dir_all(&out)?;
    let bin = out.join("apipeer");
    let mut child = Command::new("go")
        .args(["build", "-o"])
        .arg(&bin)
        .arg(".")
        .current_dir(&src)
        // Nothing is downloaded: no module proxy, no checksum database, no
        // other toolchain (Go 1.21 and later would fetch one a go.mod asks).
        .env("GOPROXY", "off")
        .env("GOSUMDB", "off")
        .env("GOFLAGS", "-mod=mod")
        .env("GOTOOLCHAIN", "local")
        .env("GO111MODULE", "on")
        .env("GOCACHE", out.join("cache"))
        .env("GOPATH", out.join("gopath"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("spawning go build")?;
    let began = Instant::now();
    while child.try_wait()?.is_none() {
        if began.elapsed() > BUILD_DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            bail!("go build took longer than {BUILD_DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let o = child.wait_with_output()?;
    if !o.status.success() {
        bail!(
            "go build failed ({}):\n{}{}",
            o.status,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    Ok(bin)
}

/// A running peer; its stdin closed (it exits), then killed, on drop.
pub struct GoPeer {
    child: Child,
    stdin: Mutex<Option<ChildStdin>>,
    replies: Mutex<mpsc::Receiver<String>>,
    /// Where it listens.
    pub addr: SocketAddr,
}

/// The certificate and key files a peer serves TLS with.
pub struct Tls<'a> {
    pub cert: &'a Path,
    pub key: &'a Path,
}

impl GoPeer {
    /// Start `binary` in `ns`, listening on `listen`, over TLS when `tls`.
    pub fn start(ns: &Netns, binary: &Path, listen: SocketAddr, tls: Option<Tls>) -> Result<Self> {
        let mut cmd = ns.command(binary);
        cmd.arg("-listen").arg(listen.to_string());
        if let Some(t) = tls {
            cmd.arg("-cert").arg(t.cert).arg("-key").arg(t.key);
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("spawning the Go peer")?;
        let stdin = child.stdin.take().context("stdin")?;
        let stdout = child.stdout.take().context("stdout")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let mut peer = GoPeer {
            child,
            stdin: Mutex::new(Some(stdin)),
            replies: Mutex::new(rx),
            addr: listen,
        };
        let first = (peer.replies.lock().unwrap().recv_timeout(REPLY))
            .context("the Go peer never said where it listens")?;
        peer.addr = first.trim().parse().with_context(|| format!("{first:?}"))?;
        Ok(peer)
    }

    /// Send one command; its answer (an error when it says `ok: false`).
    pub fn call(&self, cmd: Value) -> Result<Value> {
        let replies = self.replies.lock().unwrap();
        {
            let mut stdin = self.stdin.lock().unwrap();
            let stdin = stdin.as_mut().context("the peer's stdin is closed")?;
            writeln!(stdin, "{cmd}")?;
            stdin.flush()?;
        }
        let line = (replies.recv_timeout(REPLY)).with_context(|| format!("no answer to {cmd}"))?;
        let v: Value = serde_json::from_str(&line).with_context(|| format!("{line:?}"))?;
        if v["ok"] != true {
            bail!("the Go peer refused {cmd}: {}", v["error"]);
        }
        Ok(v)
    }

    /// Create or replace `object` in collection `resource` ("leases").
    pub fn apply(&self, resource: &str, object: Value) {
        let cmd = json!({"op": "apply", "resource": resource, "object": object});
        self.call(cmd).expect("apply");
    }

    pub fn delete(&self, resource: &str, namespace: &str, name: &str) {
        let cmd =
            json!({"op": "delete", "resource": resource, "namespace": namespace, "name": name});
        self.call(cmd).expect("delete");
    }

    /// Set the behaviours named in `mode` (main.go's `mode`: informational,
    /// split, splitDelayMs, closeAfterWatch, bookmarkMs); the others stay.
    pub fn set_mode(&self, mode: Value) {
        self.call(json!({"op": "mode", "mode": mode}))
            .expect("mode");
    }

    /// What the peer recorded of every connection and request so far.
    pub fn stats(&self) -> Stats {
        let v = self.call(json!({"op": "stats"})).expect("stats");
        let list = |k: &str| v[k].as_array().cloned().unwrap_or_default();
        Stats {
            connections: list("connections").iter().map(PeerConn::from).collect(),
            requests: list("requests").iter().map(PeerRequest::from).collect(),
        }
    }
}

impl Drop for GoPeer {
    fn drop(&mut self) {
        // EOF on its stdin: it shuts down by itself.
        drop(self.stdin.lock().unwrap().take());
        let began = Instant::now();
        while began.elapsed() < Duration::from_secs(2) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The peer's records.
#[derive(Debug, Clone)]
pub struct Stats {
    pub connections: Vec<PeerConn>,
    pub requests: Vec<PeerRequest>,
}

/// One connection the peer accepted.
#[derive(Debug, Clone)]
pub struct PeerConn {
    pub id: i64,
    /// What TLS negotiated by ALPN ("" when the client offered nothing).
    pub alpn: String,
    /// The HTTP version of its requests ("HTTP/1.1", "HTTP/2.0").
    pub proto: String,
    pub requests: u64,
    pub watches: u64,
    /// Closed by the peer after a watch (`closeAfterWatch`).
    pub closed_by_server: bool,
}

impl From<&Value> for PeerConn {
    fn from(v: &Value) -> Self {
        PeerConn {
            id: v["id"].as_i64().unwrap_or(-1),
            alpn: v["alpn"].as_str().unwrap_or_default().to_owned(),
            proto: v["proto"].as_str().unwrap_or_default().to_owned(),
            requests: v["requests"].as_u64().unwrap_or(0),
            watches: v["watches"].as_u64().unwrap_or(0),
            closed_by_server: v["closedByServer"] == true,
        }
    }
}

/// One request the peer answered (or is answering: a watch).
#[derive(Debug, Clone)]
pub struct PeerRequest {
    pub conn: i64,
    pub method: String,
    pub uri: String,
    pub proto: String,
    /// The collection ("leases"), and the object's name for a GET of one.
    pub resource: String,
    pub name: String,
    pub watch: bool,
    pub status: u64,
    /// How a watch ended: "timeout" (by the server), "client", "gone" (410),
    /// "" while it runs.
    pub end: String,
    pub events: u64,
    pub bookmarks: u64,
    /// Flushes of its body, each a chunk on the wire.
    pub chunks: u64,
}

impl From<&Value> for PeerRequest {
    fn from(v: &Value) -> Self {
        let s = |k: &str| v[k].as_str().unwrap_or_default().to_owned();
        let n = |k: &str| v[k].as_u64().unwrap_or(0);
        PeerRequest {
            conn: v["conn"].as_i64().unwrap_or(-1),
            method: s("method"),
            uri: s("uri"),
            proto: s("proto"),
            resource: s("resource"),
            name: s("name"),
            watch: v["watch"] == true,
            status: n("status"),
            end: s("end"),
            events: n("events"),
            bookmarks: n("bookmarks"),
            chunks: n("chunks"),
        }
    }
}

impl Stats {
    /// The watches of `resource`, in the order they were asked.
    pub fn watches(&self, resource: &str) -> Vec<&PeerRequest> {
        (self.requests.iter())
            .filter(|r| r.watch && r.resource == resource)
            .collect()
    }

    /// The lists (first pages and the rest) of `resource`.
    pub fn lists(&self, resource: &str) -> usize {
        (self.requests.iter())
            .filter(|r| !r.watch && r.name.is_empty() && r.resource == resource)
            .count()
    }

    pub fn connection(&self, id: i64) -> Option<&PeerConn> {
        self.connections.iter().find(|c| c.id == id)
    }
}
