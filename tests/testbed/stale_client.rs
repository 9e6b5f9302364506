//! A client that stays stale after a takeover, as many routers and
//! firewalls do: it ignores gratuitous ARP for the LB IP (only a frame
//! addressed to it can change its entry) and keeps sending to the MAC it
//! cached ([`Traffic`]).

use std::{
    net::{Ipv4Addr, SocketAddr, UdpSocket},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use crate::Netns;

/// The client ignores gratuitous ARP for `lb` (any ARP whose target is
/// the LB IP), with an nftables rule in its namespace.
pub fn ignore_gratuitous(client: &Netns, lb: Ipv4Addr) {
    let lb = lb.to_string();
    for cmd in [
        vec!["nft", "add", "table", "arp", "router"],
        vec![
            "nft",
            "add",
            "chain",
            "arp",
            "router",
            "in",
            "{ type filter hook input priority 0; }",
        ],
        vec![
            "nft", "add", "rule", "arp", "router", "in", "arp", "daddr", "ip", &lb, "drop",
        ],
    ] {
        client.exec(&cmd).unwrap();
    }
}

/// The client's own stack sends UDP to the LB IP every 50 ms until dropped.
pub struct Traffic {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Traffic {
    pub fn start(client: &Netns, lb: Ipv4Addr) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let socket = client
            .enter(|| Ok(UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?))
            .unwrap();
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                // A send the stack refuses (no neighbour yet) is retried.
                let _ = socket.send_to(b"stale?", SocketAddr::from((lb, 7777)));
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        Traffic {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Traffic {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
