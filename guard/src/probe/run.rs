//! The probe's loop. Each round: a request per IP (ARP or NDP), then frames
//! until the round's end; with `--connect`, one TCP connect per IP (with
//! `--neigh pin` after a short settle delay, so that this round's answers are
//! in to be pinned), and one read of the neighbour table to learn which MAC
//! each connect went to. A round ends
//! when its interval is over and its connects are done. `stop` (Ctrl-C) ends
//! the loop at once; whatever happens, entries the probe deleted or pinned are
//! put back before it returns.

use std::{
    collections::{HashMap, HashSet},
    future::Future,
    io,
    net::IpAddr,
    pin::pin,
    time::Duration,
};

use anyhow::{Context as _, Result};
use futures::{future::Fuse, FutureExt as _, StreamExt as _, TryStreamExt as _};
use tokio::time::{sleep_until, Instant};

use super::{
    prober::{ConnectError, Prober},
    ConnectPlan, Event, Host, NeighMode, Neighbour, PacketIo, Plan,
};

/// Connects in flight at once.
const CONNECTS_AT_ONCE: usize = 64;
/// Receive errors tolerated (an interface going down reports one) before
/// the probe gives up.
const MAX_RECV_ERRORS: u64 = 100;
/// Bytes of each frame looked at: an ARP frame with tags, an NDP message
/// with tags, extension headers and options.
const SNAP: usize = 256;

/// What a finished (or interrupted) probe knows.
#[derive(Debug)]
pub struct Outcome {
    pub prober: Prober,
    pub elapsed: Duration,
    pub interrupted: bool,
    /// Send and receive errors, and the last one's text.
    pub io_errors: u64,
    pub last_io_error: Option<String>,
}

/// Which entries the probe changed, and what was there before.
#[derive(Debug, Default)]
struct Touched {
    /// Permanent entries found at the start (an operator's pins).
    saved: HashMap<IpAddr, Neighbour>,
    changed: HashSet<IpAddr>,
}

struct Job {
    target: usize,
    ip: IpAddr,
    port: u16,
    pin: Option<[u8; 6]>,
}

struct Done {
    target: usize,
    mac: Option<[u8; 6]>,
    result: Result<(), ConnectError>,
}

/// Run `plan` until its rounds are done, its duration is over, or `stop`
/// completes. Events go to `on_event` as they happen.
pub async fn run<P: PacketIo, H: Host>(
    io: &mut P,
    host: &H,
    plan: &Plan,
    stop: impl Future<Output = ()>,
    on_event: impl FnMut(Event),
) -> Result<Outcome> {
    let prober = Prober::new(&plan.ips, io.mac(), plan.source, plan.source6)
        .with_context(|| format!("at most {} IPs per probe", super::MAX_IPS))?;
    let mut touched = Touched::default();
    if plan
        .connect
        .as_ref()
        .is_some_and(|c| c.neigh != NeighMode::Keep)
    {
        let wanted: HashSet<IpAddr> = plan.ips.iter().copied().collect();
        touched.saved = host.neighbours(&wanted).await?;
        touched.saved.retain(|_, n| n.permanent);
    }
    let mut state = Outcome {
        prober,
        elapsed: Duration::ZERO,
        interrupted: false,
        io_errors: 0,
        last_io_error: None,
    };
    let start = Instant::now();
    let mut session = Session {
        io,
        host,
        plan,
        out: &mut state,
        touched: &mut touched,
    };
    let looped = session.rounds(stop, on_event).await;
    let restored = restore(host, &touched).await;
    state.elapsed = start.elapsed();
    looped?;
    restored.context("putting the neighbour table back")?;
    Ok(state)
}

/// One probe run's borrowed parts: the frame I/O, the host (neighbours, TCP),
/// the plan, the outcome being filled and the entries changed (to put back).
struct Session<'a, P, H> {
    io: &'a mut P,
    host: &'a H,
    plan: &'a Plan,
    out: &'a mut Outcome,
    touched: &'a mut Touched,
}

impl<P: PacketIo, H: Host> Session<'_, P, H> {
    /// The rounds; on `stop`, marks the outcome interrupted and returns.
    async fn rounds(
        &mut self,
        stop: impl Future<Output = ()>,
        mut on_event: impl FnMut(Event),
    ) -> Result<()> {
        let (io, host, plan) = (&mut *self.io, self.host, self.plan);
        let (out, touched) = (&mut *self.out, &mut *self.touched);
        let mut stop = pin!(stop);
        let start = Instant::now();
        let mut begin = start;
        let mut buf = [0u8; SNAP];
        let mut recv_errors = 0u64;
        // Pins need this round's answers; the kernel resolves for itself.
        let settle_after = match &plan.connect {
            Some(c) if c.neigh == NeighMode::Pin => {
                (plan.interval / 4).min(Duration::from_millis(250))
            }
            _ => Duration::ZERO,
        };
        for _ in 0..plan.rounds {
            if plan
                .duration
                .is_some_and(|d| begin.duration_since(start) >= d)
            {
                break;
            }
            out.prober.next_round();
            for i in 0..out.prober.targets().len() {
                let (frame, n) = out.prober.request(i);
                let sent = io.send(frame.get(..n).unwrap_or_default()).await;
                out.prober.sent(i, sent.is_ok());
                if let Err(e) = sent {
                    out.note_error(&e, "sending");
                }
            }
            let mut end = pin!(sleep_until(begin + plan.interval));
            let mut settle = pin!(sleep_until(begin + settle_after));
            let mut connects = pin!(Fuse::terminated());
            let (mut ended, mut settled) = (false, plan.connect.is_none());
            let mut connected = settled;
            while !(ended && connected) {
                tokio::select! {
                    _ = &mut stop => {
                        out.interrupted = true;
                        return Ok(());
                    }
                    _ = &mut end, if !ended => ended = true,
                    _ = &mut settle, if !settled => {
                        settled = true;
                        let Some(c) = &plan.connect else { continue };
                        let jobs = jobs(&mut out.prober, c, touched);
                        connected = jobs.is_empty();
                        connects.set(connect_all(host, jobs, c).fuse());
                    }
                    done = &mut connects, if settled && !connected => {
                        connected = true;
                        for d in done? {
                            out.prober.on_connect(d.target, d.mac, d.result);
                        }
                    }
                    got = io.recv(&mut buf) => match got {
                        Ok(n) => {
                            let frame = buf.get(..n).unwrap_or(&buf);
                            if let Some(new) = out.prober.on_frame(start.elapsed(), frame) {
                                on_event(Event::NewResponder(new));
                            }
                        }
                        Err(e) => {
                            out.note_error(&e, "receiving");
                            recv_errors += 1;
                            anyhow::ensure!(recv_errors <= MAX_RECV_ERRORS, "receiving: {e}");
                        }
                    },
                }
            }
            // A round that overran (slow connects) is followed at once.
            begin = (begin + plan.interval).max(Instant::now());
        }
        Ok(())
    }
}

impl Outcome {
    fn note_error(&mut self, e: &io::Error, what: &str) {
        self.io_errors += 1;
        self.last_io_error = Some(format!("{what}: {e}"));
    }
}

/// This round's connects, marking the entries they will change.
fn jobs(prober: &mut Prober, c: &ConnectPlan, touched: &mut Touched) -> Vec<Job> {
    let mut jobs = Vec::new();
    for (target, port) in c.ports.iter().enumerate() {
        let (Some(port), Some(t)) = (*port, prober.targets().get(target)) else {
            continue;
        };
        let ip = t.ip;
        let pin = match c.neigh {
            // Nothing to pin before anyone answered.
            NeighMode::Pin => match prober.pin_candidate(target) {
                Some(mac) => Some(mac),
                None => continue,
            },
            _ => None,
        };
        // Pins are removed at the end; a flush only takes away an
        // operator's permanent entry, which is put back.
        if c.neigh == NeighMode::Pin || touched.saved.contains_key(&ip) {
            touched.changed.insert(ip);
        }
        jobs.push(Job {
            target,
            ip,
            port,
            pin,
        });
    }
    jobs
}

/// Flush or pin, connect; then one read of the neighbour table.
async fn connect_all<H: Host>(host: &H, jobs: Vec<Job>, c: &ConnectPlan) -> io::Result<Vec<Done>> {
    let results: Vec<(Job, Result<(), ConnectError>)> = futures::stream::iter(jobs)
        .map(|job| async move {
            match (c.neigh, job.pin) {
                (NeighMode::Flush, _) => host.flush(job.ip).await?,
                (NeighMode::Pin, Some(mac)) => host.pin(job.ip, mac).await?,
                _ => {}
            }
            let r = host.connect(job.ip, job.port, c.timeout).await;
            Ok::<_, io::Error>((job, r))
        })
        .buffer_unordered(CONNECTS_AT_ONCE)
        .try_collect()
        .await?;
    let wanted: HashSet<IpAddr> = results.iter().map(|(j, _)| j.ip).collect();
    let table = host.neighbours(&wanted).await?;
    Ok(results
        .into_iter()
        .map(|(job, result)| Done {
            target: job.target,
            mac: job.pin.or_else(|| table.get(&job.ip).map(|n| n.mac)),
            result,
        })
        .collect())
}

/// Put back what the probe changed: an operator's permanent entry as it
/// was; a pin of the probe's is deleted (the kernel resolves afresh on next
/// use).
async fn restore<H: Host>(host: &H, touched: &Touched) -> io::Result<()> {
    let mut first_error = None;
    for ip in &touched.changed {
        let r = match touched.saved.get(ip) {
            Some(n) => host.pin(*ip, n.mac).await,
            None => host.flush(*ip).await,
        };
        if let Err(e) = r {
            first_error.get_or_insert(io::Error::new(e.kind(), format!("{ip}: {e}")));
        }
    }
    first_error.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    //! The loop against a fake segment and a fake host on a paused clock:
    //! deterministic, instant, no root.
    use std::{
        cell::RefCell,
        collections::{HashMap, HashSet},
        net::{Ipv4Addr, Ipv6Addr},
    };

    use guard_common::{
        build::{write_arp, ArpPacket, Ethernet, FRAME_BUF},
        frame::Parsed,
        ndp::{NA_FLAG_OVERRIDE, NA_FLAG_SOLICITED},
        ndp_build::{write_nd, NdSpec, ND_FRAME_BUF},
        parse::parse,
    };

    use super::*;
    use crate::probe::{prober::ProbeVerdict, report::Summary};

    const ME: [u8; 6] = [2, 0, 0, 0, 0, 1];
    const SRC: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);
    const SRC6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);
    const LB: IpAddr = IpAddr::V4(Ipv4Addr::new(198, 51, 100, 100));
    const LB2: IpAddr = IpAddr::V4(Ipv4Addr::new(198, 51, 100, 101));
    const LB6: IpAddr = IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 0x100));
    const A: [u8; 6] = [2, 0, 0, 0, 0, 0xa];
    const B: [u8; 6] = [2, 0, 0, 0, 0, 0xb];
    const MS: Duration = Duration::from_millis(1);

    /// A node answering for `ip` with `delay`, between `from` and `until`
    /// (since the start).
    #[derive(Clone, Copy)]
    struct Responder {
        mac: [u8; 6],
        ip: IpAddr,
        delay: Duration,
        from: Duration,
        until: Duration,
    }

    fn answers(mac: [u8; 6], ip: IpAddr) -> Responder {
        Responder {
            mac,
            ip,
            delay: 2 * MS,
            from: Duration::ZERO,
            until: Duration::MAX,
        }
    }

    fn frame(src: [u8; 6], arp: ArpPacket) -> Vec<u8> {
        let mut buf = [0; FRAME_BUF];
        let eth = Ethernet {
            dst: ME,
            src,
            tags: &[],
        };
        let n = write_arp(&mut buf, &eth, &arp).unwrap();
        buf[..n].to_vec()
    }

    /// `mac`'s answer to our request for `ip`: an ARP reply, or a solicited
    /// NA to our link-local.
    fn answer(mac: [u8; 6], ip: IpAddr) -> Vec<u8> {
        match ip {
            IpAddr::V4(v4) => frame(mac, ArpPacket::reply(mac, v4.into(), ME, SRC.into())),
            IpAddr::V6(v6) => {
                let flags = NA_FLAG_SOLICITED | NA_FLAG_OVERRIDE;
                let spec = NdSpec::advert(mac, v6.octets(), ME, SRC6.octets(), flags);
                let mut buf = [0; ND_FRAME_BUF];
                let n = write_nd(&mut buf, &spec);
                buf[..n].to_vec()
            }
        }
    }

    /// The segment: answers requests as its responders would.
    struct Segment {
        start: Instant,
        responders: Vec<Responder>,
        queue: std::collections::VecDeque<(Instant, Vec<u8>)>,
        sent: u64,
        /// The link is down: every send fails.
        down: bool,
    }

    impl Segment {
        fn new(responders: &[Responder]) -> Self {
            Segment {
                start: Instant::now(),
                responders: responders.to_vec(),
                queue: Default::default(),
                sent: 0,
                down: false,
            }
        }

        fn inject(&mut self, at: Duration, frame: Vec<u8>) {
            let at = self.start + at;
            let i = self.queue.partition_point(|(t, _)| *t <= at);
            self.queue.insert(i, (at, frame));
        }
    }

    impl PacketIo for Segment {
        fn mac(&self) -> [u8; 6] {
            ME
        }

        async fn send(&mut self, f: &[u8]) -> io::Result<()> {
            if self.down {
                return Err(io::Error::from_raw_os_error(libc::ENETDOWN));
            }
            self.sent += 1;
            let asked = match parse(f, u16::from_be_bytes([f[12], f[13]])) {
                Parsed::Arp(req) => {
                    assert_eq!((req.op, req.sha, req.spa), (1, ME, u32::from(SRC)));
                    IpAddr::from(Ipv4Addr::from(req.tpa))
                }
                Parsed::Nd(ns) => {
                    assert!(!ns.is_advert());
                    assert_eq!((ns.eth_src, ns.src), (ME, SRC6.octets()));
                    IpAddr::from(Ipv6Addr::from(ns.target))
                }
                other => panic!("sent a frame that is neither ARP nor NDP: {other:?}"),
            };
            let now = Instant::now().duration_since(self.start);
            for r in self.responders.clone() {
                if r.ip == asked && (r.from..r.until).contains(&now) {
                    self.inject(now + r.delay, answer(r.mac, r.ip));
                }
            }
            Ok(())
        }

        async fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let Some((at, _)) = self.queue.front() else {
                return std::future::pending().await;
            };
            sleep_until(*at).await;
            let (_, f) = self.queue.pop_front().unwrap();
            let n = f.len().min(buf.len());
            buf[..n].copy_from_slice(&f[..n]);
            Ok(n)
        }
    }

    /// The host: a neighbour table whose kernel learns `racers` in turn
    /// when it resolves, and the MACs that serve the port.
    struct FakeHost {
        table: RefCell<HashMap<IpAddr, Neighbour>>,
        racers: Vec<[u8; 6]>,
        resolved: RefCell<usize>,
        serving: Vec<[u8; 6]>,
        log: RefCell<Vec<String>>,
    }

    impl FakeHost {
        fn new(racers: &[[u8; 6]], serving: &[[u8; 6]]) -> Self {
            FakeHost {
                table: RefCell::default(),
                racers: racers.to_vec(),
                resolved: RefCell::new(0),
                serving: serving.to_vec(),
                log: RefCell::default(),
            }
        }

        fn ops(&self, what: &str) -> usize {
            self.log
                .borrow()
                .iter()
                .filter(|l| l.starts_with(what))
                .count()
        }
    }

    impl Host for FakeHost {
        async fn neighbours(
            &self,
            wanted: &HashSet<IpAddr>,
        ) -> io::Result<HashMap<IpAddr, Neighbour>> {
            let t = self.table.borrow();
            Ok(t.iter()
                .filter(|(ip, _)| wanted.contains(ip))
                .map(|(k, v)| (*k, *v))
                .collect())
        }

        async fn flush(&self, ip: IpAddr) -> io::Result<()> {
            self.log.borrow_mut().push(format!("flush {ip}"));
            self.table.borrow_mut().remove(&ip);
            Ok(())
        }

        async fn pin(&self, ip: IpAddr, mac: [u8; 6]) -> io::Result<()> {
            self.log.borrow_mut().push(format!("pin {ip} {mac:?}"));
            let n = Neighbour {
                mac,
                permanent: true,
            };
            self.table.borrow_mut().insert(ip, n);
            Ok(())
        }

        async fn connect(&self, ip: IpAddr, _: u16, timeout: Duration) -> Result<(), ConnectError> {
            let known = self.table.borrow().get(&ip).copied();
            let mac = match known {
                Some(n) => n.mac,
                None => {
                    let Some(mac) = self
                        .racers
                        .get(*self.resolved.borrow() % self.racers.len().max(1))
                        .copied()
                    else {
                        tokio::time::sleep(timeout).await;
                        return Err(ConnectError::Unreachable);
                    };
                    *self.resolved.borrow_mut() += 1;
                    let n = Neighbour {
                        mac,
                        permanent: false,
                    };
                    self.table.borrow_mut().insert(ip, n);
                    mac
                }
            };
            if self.serving.contains(&mac) {
                tokio::time::sleep(MS).await;
                Ok(())
            } else {
                tokio::time::sleep(timeout).await;
                Err(ConnectError::TimedOut)
            }
        }
    }

    fn plan(ips: &[IpAddr], rounds: u64) -> Plan {
        Plan {
            ips: ips.to_vec(),
            source: SRC,
            source6: SRC6,
            interval: 100 * MS,
            rounds,
            duration: None,
            connect: None,
        }
    }

    fn with_connect(mut p: Plan, neigh: NeighMode) -> Plan {
        p.connect = Some(ConnectPlan {
            ports: vec![Some(80); p.ips.len()],
            timeout: 50 * MS,
            neigh,
        });
        p
    }

    async fn probe(seg: &mut Segment, host: &FakeHost, plan: &Plan) -> Outcome {
        run(seg, host, plan, std::future::pending(), |_| {})
            .await
            .unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn zero_one_and_two_responders() {
        let mut seg = Segment::new(&[answers(A, LB), answers(A, LB2), answers(B, LB2)]);
        let host = FakeHost::new(&[], &[]);
        let none = IpAddr::from(Ipv4Addr::new(198, 51, 100, 102));
        let out = probe(&mut seg, &host, &plan(&[LB, LB2, none], 10)).await;
        let t = out.prober.targets();
        assert_eq!(
            t.iter().map(|t| t.verdict()).collect::<Vec<_>>(),
            [
                ProbeVerdict::OneResponder,
                ProbeVerdict::Conflict,
                ProbeVerdict::NoResponder
            ]
        );
        assert_eq!((t[0].requests, t[0].answered, t[0].replies), (10, 10, 10));
        assert_eq!((t[1].answered, t[1].several, t[1].replies), (10, 10, 20));
        assert_eq!((t[2].requests, t[2].replies), (10, 0));
        assert_eq!(seg.sent, 30);
        assert_eq!((out.prober.rounds(), out.interrupted), (10, false));
        assert_eq!(out.elapsed, Duration::from_secs(1), "10 rounds of 100 ms");
        assert_eq!(t[0].macs[0].first, Some(2 * MS));
        assert_eq!(t[0].macs[0].last, Some(902 * MS));
        assert!(
            host.log.borrow().is_empty(),
            "no connects, no neighbour changes"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn ipv4_and_ipv6_in_one_run() {
        let mut seg = Segment::new(&[answers(A, LB), answers(A, LB6), answers(B, LB6)]);
        let host = FakeHost::new(&[], &[A]);
        let p = with_connect(plan(&[LB, LB6], 4), NeighMode::Pin);
        let out = probe(&mut seg, &host, &p).await;
        let t = out.prober.targets();
        assert_eq!(
            (t[0].verdict(), t[1].verdict()),
            (ProbeVerdict::OneResponder, ProbeVerdict::Conflict)
        );
        assert_eq!((t[1].requests, t[1].answered, t[1].replies), (4, 4, 8));
        assert_eq!(seg.sent, 8, "one ARP request and one NS per round");
        // Each IPv6 responder pinned in turn, as for IPv4; the pins removed.
        assert_eq!(
            (t[1].macs[0].connect.ok, t[1].macs[1].connect.timed_out),
            (2, 2)
        );
        assert_eq!(host.ops(&format!("pin {LB6}")), 4);
        assert!(host.table.borrow().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_responder_that_hands_over_mid_run_has_moved() {
        let until = 450 * MS;
        let old = Responder {
            until,
            ..answers(A, LB)
        };
        let new = Responder {
            from: until,
            ..answers(B, LB)
        };
        let mut seg = Segment::new(&[old, new]);
        let out = probe(&mut seg, &FakeHost::new(&[], &[]), &plan(&[LB], 10)).await;
        let t = &out.prober.targets()[0];
        assert_eq!(t.verdict(), ProbeVerdict::Moved);
        assert_eq!((t.macs[0].answered, t.macs[1].answered), (5, 5));
        assert_eq!(
            (t.macs[0].last, t.macs[1].first),
            (Some(402 * MS), Some(502 * MS))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn stop_ends_at_once_with_the_rounds_so_far() {
        let mut seg = Segment::new(&[answers(A, LB)]);
        let stop = tokio::time::sleep(350 * MS);
        let host = FakeHost::new(&[], &[]);
        let out = run(&mut seg, &host, &plan(&[LB], 1000), stop, |_| {})
            .await
            .unwrap();
        assert!(out.interrupted);
        assert_eq!(out.prober.rounds(), 4);
        assert_eq!(out.elapsed, 350 * MS);
        assert_eq!(out.prober.targets()[0].answered, 4);
    }

    #[tokio::test(start_paused = true)]
    async fn failed_sends_are_counted_and_the_probe_goes_on() {
        let mut seg = Segment::new(&[answers(A, LB)]);
        seg.down = true;
        let out = probe(&mut seg, &FakeHost::new(&[], &[]), &plan(&[LB], 4)).await;
        let t = &out.prober.targets()[0];
        assert_eq!((t.requests, t.send_errors, out.io_errors), (0, 4, 4));
        assert_eq!(t.verdict(), ProbeVerdict::NoResponder);
        let e = out.last_io_error.unwrap();
        assert!(e.starts_with("sending: ") && e.contains("down"), "{e}");
    }

    #[tokio::test(start_paused = true)]
    async fn the_duration_bounds_the_rounds() {
        let mut seg = Segment::new(&[answers(A, LB)]);
        let mut p = plan(&[LB], u64::MAX);
        p.duration = Some(Duration::from_millis(1000));
        let out = probe(&mut seg, &FakeHost::new(&[], &[]), &p).await;
        assert_eq!(out.prober.rounds(), 10);
    }

    #[tokio::test(start_paused = true)]
    async fn new_responders_are_reported_as_they_come() {
        let late = Responder {
            from: 250 * MS,
            ..answers(B, LB)
        };
        let mut seg = Segment::new(&[answers(A, LB), late]);
        let mut seen = Vec::new();
        let host = FakeHost::new(&[], &[]);
        run(
            &mut seg,
            &host,
            &plan(&[LB], 5),
            std::future::pending(),
            |Event::NewResponder(r)| {
                seen.push((r.mac, r.at, r.responders));
            },
        )
        .await
        .unwrap();
        assert_eq!(seen, [(A, 2 * MS, 1), (B, 302 * MS, 2)]);
    }

    #[tokio::test(start_paused = true)]
    async fn garbage_and_other_ips_change_nothing() {
        let mut seg = Segment::new(&[answers(A, LB)]);
        for i in 0..10_000u32 {
            let at = Duration::from_micros(u64::from(i) * 40);
            let mut junk = answer(B, LB);
            junk[14 + (i as usize % 8)] ^= 0xff; // a broken ARP header
            seg.inject(at, junk);
            seg.inject(at, answer(B, Ipv4Addr::new(198, 51, 100, 107).into()));
            seg.inject(at, vec![0xab; i as usize % 80]);
        }
        let out = probe(&mut seg, &FakeHost::new(&[], &[]), &plan(&[LB], 5)).await;
        let t = &out.prober.targets()[0];
        assert_eq!(t.verdict(), ProbeVerdict::OneResponder);
        assert_eq!((t.replies, t.macs.len()), (5, 1));
        assert_eq!(out.prober.unrelated, 10_000);
        assert!(out.prober.malformed >= 8_000, "{}", out.prober.malformed);
    }

    #[tokio::test(start_paused = true)]
    async fn flush_lets_the_race_decide_and_attributes_each_connect() {
        // Both answer; the kernel learns A, then B, ...; only A serves.
        let mut seg = Segment::new(&[answers(A, LB), answers(B, LB)]);
        let host = FakeHost::new(&[A, B], &[A]);
        let out = probe(
            &mut seg,
            &host,
            &with_connect(plan(&[LB], 6), NeighMode::Flush),
        )
        .await;
        let t = &out.prober.targets()[0];
        assert_eq!((t.macs[0].connect.ok, t.macs[0].connect.failed()), (3, 0));
        assert_eq!((t.macs[1].connect.ok, t.macs[1].connect.timed_out), (0, 3));
        assert_eq!(host.ops("flush"), 6, "one flush per connect, none after");
        assert!(!host.table.borrow()[&LB].permanent);
        let s = Summary::new(
            &out,
            "eth0",
            ME,
            &with_connect(plan(&[LB], 6), NeighMode::Flush),
        );
        assert!(
            s.problems().unwrap().contains("3 of 6 connects failed"),
            "{:?}",
            s.problems()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn pin_tests_each_responder_and_removes_its_pins() {
        let mut seg = Segment::new(&[answers(A, LB), answers(B, LB)]);
        let host = FakeHost::new(&[], &[A]);
        let out = probe(
            &mut seg,
            &host,
            &with_connect(plan(&[LB], 6), NeighMode::Pin),
        )
        .await;
        let t = &out.prober.targets()[0];
        assert_eq!((t.macs[0].connect.ok, t.macs[1].connect.timed_out), (3, 3));
        assert_eq!(host.ops("pin"), 6);
        assert!(
            host.table.borrow().is_empty(),
            "the pin is gone: {:?}",
            host.log.borrow()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_operators_permanent_entry_is_put_back() {
        let mut seg = Segment::new(&[answers(A, LB)]);
        let host = FakeHost::new(&[], &[A]);
        let theirs = Neighbour {
            mac: B,
            permanent: true,
        };
        host.table.borrow_mut().insert(LB, theirs);
        for neigh in [NeighMode::Pin, NeighMode::Flush] {
            probe(&mut seg, &host, &with_connect(plan(&[LB], 3), neigh)).await;
            assert_eq!(host.table.borrow().get(&LB), Some(&theirs), "{neigh:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn pins_are_removed_when_stopped_mid_connect() {
        let mut seg = Segment::new(&[answers(B, LB)]);
        let host = FakeHost::new(&[], &[]);
        // Round 1: settle at 25 ms, the connect to B hangs for 50 ms.
        let stop = tokio::time::sleep(40 * MS);
        let p = with_connect(plan(&[LB], 100), NeighMode::Pin);
        let out = run(&mut seg, &host, &p, stop, |_| {}).await.unwrap();
        assert!(out.interrupted);
        assert_eq!(host.ops("pin"), 1);
        assert!(host.table.borrow().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn slow_connects_stretch_the_round_and_keep_counting() {
        let mut seg = Segment::new(&[answers(B, LB)]);
        let host = FakeHost::new(&[B], &[]);
        let mut p = with_connect(plan(&[LB], 3), NeighMode::Keep);
        p.connect.as_mut().unwrap().timeout = 300 * MS;
        let out = probe(&mut seg, &host, &p).await;
        let t = &out.prober.targets()[0];
        assert_eq!(
            (t.requests, t.answered, t.macs[0].connect.timed_out),
            (3, 3, 3)
        );
        assert_eq!(out.elapsed, 3 * 300 * MS, "no settling without pins");
        assert_eq!(
            host.ops("flush") + host.ops("pin"),
            0,
            "keep changes nothing"
        );
    }
}
