//! The kubelet's part in presence, for beds with a fake API: each node has
//! a guard Pod (`arp-guard-<node>`, labelled as the DaemonSet's), and its
//! Ready condition follows the guard's `/readyz` as a readiness probe would
//! (polled every `every`; the Pod's status written only when the result
//! flips, as the kubelet does). A guard that is not running, or not ready,
//! leaves its Pod not Ready.
//!
//! One thread per node, inside the node's namespace for its life; stopped
//! and joined on drop, before the namespaces go.

use std::{
    collections::BTreeMap,
    fs::File,
    io::{Read as _, Write as _},
    net::TcpStream,
    os::fd::AsRawFd,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    thread::JoinHandle,
    time::Duration,
};

use crate::fake_api::{objects, ApiHandle, Resource};

pub struct Kubelet {
    stop: Arc<AtomicBool>,
    every_ms: Arc<AtomicU64>,
    /// Nodes whose Pod a test sets itself (a node the bed runs no guard on,
    /// whose record the test writes).
    pinned: Arc<Mutex<BTreeMap<String, bool>>>,
    api: ApiHandle,
    ns: String,
    threads: Vec<JoinHandle<()>>,
}

impl Kubelet {
    /// Probe the guards of `nodes` ((node name, netns name)) every `every`,
    /// keeping their Pods in namespace `ns` of `api`.
    pub fn start(api: ApiHandle, ns: &str, nodes: &[(String, String)], every: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let every_ms = Arc::new(AtomicU64::new(every.as_millis() as u64));
        let pinned: Arc<Mutex<BTreeMap<String, bool>>> = Arc::default();
        let threads = nodes
            .iter()
            .map(|(node, netns)| {
                let (api, ns, node, netns) =
                    (api.clone(), ns.to_owned(), node.clone(), netns.clone());
                let (stop, every_ms, pinned) = (stop.clone(), every_ms.clone(), pinned.clone());
                std::thread::spawn(move || {
                    let probe = Probe {
                        api: &api,
                        ns: &ns,
                        node: &node,
                        stop: &stop,
                        every_ms: &every_ms,
                        pinned: &pinned,
                    };
                    probe.run(&netns)
                })
            })
            .collect();
        Kubelet {
            stop,
            every_ms,
            pinned,
            api,
            ns: ns.to_owned(),
            threads,
        }
    }

    /// `node`'s guard Pod is Ready (or not) whatever its guard says, from
    /// now on: a node whose record the test writes without a guard.
    pub fn pin(&self, node: &str, ready: bool) {
        let mut pinned = self.pinned.lock().unwrap();
        pinned.insert(node.to_owned(), ready);
        self.api
            .apply(Resource::Pods, objects::guard_pod(&self.ns, node, ready));
    }

    /// Probe this often from now on (the DaemonSet's readinessProbe says 5 s).
    pub fn set_every(&self, every: Duration) {
        (self.every_ms).store(every.as_millis() as u64, Ordering::Relaxed);
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// One node's readiness probe.
struct Probe<'a> {
    api: &'a ApiHandle,
    ns: &'a str,
    node: &'a str,
    stop: &'a AtomicBool,
    every_ms: &'a AtomicU64,
    pinned: &'a Mutex<BTreeMap<String, bool>>,
}

impl Probe<'_> {
    /// Probe until stopped, from inside `netns`.
    fn run(&self, netns: &str) {
        let entered = File::open(format!("/run/netns/{netns}")).is_ok_and(|f| {
            // SAFETY: setns on this thread only; the fd is valid while `f` lives.
            unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) == 0 }
        });
        if !entered {
            return;
        }
        let mut last = None;
        while !self.stop.load(Ordering::SeqCst) {
            let ready = ready();
            // Under the lock: a pin set meanwhile is never overwritten.
            let pinned = self.pinned.lock().unwrap();
            if !pinned.contains_key(self.node) && last != Some(ready) {
                (self.api).apply(
                    Resource::Pods,
                    objects::guard_pod(self.ns, self.node, ready),
                );
                last = Some(ready);
            }
            drop(pinned);
            // Sleep in short steps, so that a drop does not wait a whole period.
            let mut slept = 0;
            while slept < self.every_ms.load(Ordering::Relaxed) && !self.stop.load(Ordering::SeqCst)
            {
                std::thread::sleep(Duration::from_millis(50));
                slept += 50;
            }
        }
    }
}

/// The readiness probe: `GET /readyz` answers 200 within a second.
fn ready() -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(
        &"127.0.0.1:9477".parse().expect("address"),
        Duration::from_secs(1),
    ) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    if s.write_all(b"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut head = [0u8; 12];
    s.read_exact(&mut head).is_ok() && &head[9..12] == b"200"
}
