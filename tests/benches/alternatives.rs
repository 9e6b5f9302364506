//! `sudo cargo bench -p arp-guard-tests --bench alternatives`: arp-guard side
//! by side with what a user would pick instead (issue 12, parts 4 and 5), on
//! the same frames, in namespaces the bench creates (`alternatives_bed.rs`):
//!
//! 1. Coverage: which frame kinds each approach keeps from the neighbour
//!    (measured; `tests/alternatives.rs` asserts the same table).
//! 2. Cost per frame under an ARP request flood from the neighbour (an
//!    AF_PACKET socket sending as fast as it can), for requests for LB IPs
//!    and for the node's own IP, with N LB IPs in the tables; interleaved
//!    rounds, medians with min-max, and per-round differences to the floor
//!    (nothing attached) of the same round. For arp-guard also the kernel's
//!    own run time per program run (`BPF_ENABLE_STATS`).
//! 3. Throughput on the guarded veth: iperf3 TCP and 64-byte UDP from the
//!    node, with and without the guard, interleaved.
//!
//! `BENCH_SHORT=1`: a few LB IPs and short rounds (well under a minute), for
//! CI; nothing is asserted. Besides the text, every figure is printed as a
//! line `RESULT <table> <row> <column>=<value> ...`.

#[path = "../alternatives_bed.rs"]
mod alternatives_bed;

use std::{
    collections::BTreeMap,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use alternatives_bed::{
    coverage, coverage_bed, wire_ips, AltBed, Approach, Plan, APPROACHES, NODE_IP, PEER_IP,
};
use anyhow::{bail, Context as _, Result};
use serde_json::Value;
use testbed::{ArpSpec, Netns};

struct Config {
    short: bool,
    /// LB IPs in the tables (at most 354 of them on the wire).
    sizes: Vec<u32>,
    rounds: usize,
    flood: Duration,
    iperf_rounds: usize,
    iperf_secs: u32,
}

fn main() -> Result<()> {
    testbed::require_root();
    let short = std::env::var_os("BENCH_SHORT").is_some_and(|v| v != "0" && !v.is_empty());
    let cfg = if short {
        Config {
            short,
            sizes: vec![20],
            rounds: 2,
            flood: Duration::from_millis(300),
            iperf_rounds: 1,
            iperf_secs: 1,
        }
    } else {
        Config {
            short,
            sizes: vec![300, 65_536],
            // Many short rounds: the paired differences to the floor are
            // taken seconds apart, and their median shrugs off a busy moment.
            rounds: 11,
            flood: Duration::from_secs(1),
            iperf_rounds: 7,
            iperf_secs: 2,
        }
    };
    let only = std::env::args().nth(1).filter(|a| !a.starts_with('-'));
    let want = |part: &str| only.as_deref().is_none_or(|o| o == part);
    println!(
        "alternatives bench{}: {} cores, load average {}",
        if cfg.short { " (BENCH_SHORT)" } else { "" },
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split_whitespace()
            .next()
            .unwrap_or("?")
    );
    if want("coverage") {
        coverage_part()?;
    }
    if want("flood") {
        for &n in &cfg.sizes {
            flood_part(&cfg, n)?;
        }
    }
    if want("throughput") {
        throughput_part(&cfg)?;
    }
    Ok(())
}

fn coverage_part() -> Result<()> {
    let mut bed = coverage_bed("altbc")?;
    let table = coverage(&mut bed)?;
    println!(
        "\ncoverage: what reached the neighbour (dropped/rewritten: the LB IP was kept from it)"
    );
    print!("{:<22}", "frame kind");
    for (a, _) in &table {
        print!(" {:>11}", a.name());
    }
    println!();
    for (i, k) in alternatives_bed::KINDS.iter().enumerate() {
        print!("{:<22}", k.name());
        let mut line = format!("RESULT alt_coverage {}", k.name());
        for (a, row) in &table {
            print!(" {:>11}", row[i].1.name());
            line.push_str(&format!(" {}={}", a.name(), row[i].1.name()));
        }
        println!();
        println!("{line}");
    }
    // The trial, repeated: 100 speaker GARPs under each approach.
    let cap = testbed::RawSocket::open(&bed.peer, "eth0")?;
    print!("{:<22}", "speaker GARPs of 100");
    let mut line = String::from("RESULT alt_coverage speaker_gratuitous_of_100");
    for a in APPROACHES {
        bed.apply(a)?;
        let got = alternatives_bed::speaker_burst(&bed, &cap, 100)?;
        print!(" {got:>11}");
        line.push_str(&format!(" {}={got}", a.name()));
    }
    bed.clear()?;
    println!();
    println!("{line}");
    Ok(())
}

// ---- the flood --------------------------------------------------------------

/// What the neighbour asks for in a flood.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Target {
    /// The LB IPs on the wire, in turn: the node's kernel answers, and every
    /// approach but nothing should stop the answer.
    Lb,
    /// The node's own IP: answered, and every approach lets it through (the
    /// pass path's cost).
    NodeIp,
}

impl Target {
    fn name(self) -> &'static str {
        match self {
            Target::Lb => "lb_ip",
            Target::NodeIp => "node_ip",
        }
    }
}

#[derive(Clone, Copy, Default, Debug)]
struct Sample {
    sent: u64,
    secs: f64,
    replies: u64,
    /// The sending thread's CPU time per frame: its syscalls and, this
    /// kernel having no IRQ time accounting, the softirq work run on the way
    /// out of them (the node's ARP processing and reply included).
    sender_ns: f64,
    /// Busy CPU time of the whole machine per frame (/proc/stat).
    busy_ns: f64,
    /// Kernel-measured BPF run time per run: arp-guard's egress and ingress programs.
    egress_ns: Option<f64>,
    ingress_ns: Option<f64>,
    /// The daemon's own CPU (userspace and its syscalls), % of one core.
    daemon_pct: Option<f64>,
}

fn flood_part(cfg: &Config, n: u32) -> Result<()> {
    let on_wire = (n as usize).min(300);
    let lb = wire_ips(on_wire);
    let t = Instant::now();
    let mut bed = AltBed::new(
        "altbf",
        Plan {
            foreign: lb.clone(),
            owned: vec![],
            foreign_on_uplink: vec![],
            table_only: n - on_wire as u32,
        },
    )?;
    println!(
        "\nARP request flood, {n} LB IPs in the tables ({on_wire} on the node's kube-ipvs0; bed in {:.1?}), \
         {} rounds of {:?} per approach and target",
        t.elapsed(),
        cfg.rounds,
        cfg.flood
    );
    let lb_frames: Vec<Vec<u8>> = lb
        .iter()
        .map(|ip| ArpSpec::request(bed.peer_mac, PEER_IP, *ip).to_bytes())
        .collect();
    let node_frames = vec![ArpSpec::request(bed.peer_mac, PEER_IP, NODE_IP).to_bytes()];
    let sender = Sender::open(&bed.peer, "eth0")?;
    let mut samples: BTreeMap<(usize, Target), Vec<Sample>> = BTreeMap::new();
    for round in 0..cfg.rounds {
        // A different approach first in each round.
        for j in 0..APPROACHES.len() {
            let ai = (round + j) % APPROACHES.len();
            let a = APPROACHES[ai];
            bed.apply(a)?;
            settle(cfg, a);
            for target in [Target::Lb, Target::NodeIp] {
                let frames = if target == Target::Lb {
                    &lb_frames
                } else {
                    &node_frames
                };
                let s = flood_once(&bed, &sender, frames, cfg.flood, false)?;
                samples.entry((ai, target)).or_default().push(s);
            }
        }
    }
    // The guard's programs timed by the kernel, in rounds of their own:
    // the timing costs two clock reads per run, which the rounds above
    // must not pay.
    bed.apply(Approach::ArpGuard)?;
    settle(cfg, Approach::ArpGuard);
    let stats = enable_stats()?;
    let guard_i = APPROACHES
        .iter()
        .position(|a| *a == Approach::ArpGuard)
        .unwrap();
    for _ in 0..cfg.rounds.min(3) {
        for target in [Target::Lb, Target::NodeIp] {
            let frames = if target == Target::Lb {
                &lb_frames
            } else {
                &node_frames
            };
            let s = flood_once(&bed, &sender, frames, cfg.flood, true)?;
            samples
                .entry((APPROACHES.len() + guard_i, target))
                .or_default()
                .push(s);
        }
    }
    drop(stats);
    bed.clear()?;
    drop(bed);
    report_flood(n, &samples);
    Ok(())
}

/// After the daemon's start, give its start-up work (a debug build's
/// included) time to finish: the rounds measure it enforcing, not starting.
fn settle(cfg: &Config, a: Approach) {
    if a == Approach::ArpGuard {
        std::thread::sleep(if cfg.short {
            Duration::from_millis(300)
        } else {
            Duration::from_secs(2)
        });
    }
}

/// CPU time of process `pid` so far (all its threads), in ns.
fn process_cpu_ns(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command name (which may hold spaces), from field 3.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    // utime and stime: fields 14 and 15, here 11 and 12 (0-based from field 3).
    let ticks = f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    ticks * 1_000_000_000 / hz
}

fn flood_once(
    bed: &AltBed,
    sender: &Sender,
    frames: &[Vec<u8>],
    dur: Duration,
    bpf_stats: bool,
) -> Result<Sample> {
    // Replies counted as what arrives on the neighbour's eth0 (IPv6 is off: nothing else does).
    let rx0 = rx_packets(&bed.peer)?;
    let progs0 = if bpf_stats {
        prog_stats(&bed.node)?
    } else {
        vec![]
    };
    let daemon = bed.guard.as_ref().map(|d| d.pid());
    let d0 = daemon.map(process_cpu_ns);
    let busy0 = busy_ns()?;
    let (sent, secs, cpu) = sender.flood(frames, dur)?;
    let busy1 = busy_ns()?;
    let daemon_pct = daemon
        .zip(d0)
        .map(|(pid, d0)| (process_cpu_ns(pid) - d0) as f64 / (secs * 1e9) * 100.0);
    // Let the last replies land.
    std::thread::sleep(Duration::from_millis(50));
    let replies = rx_packets(&bed.peer)? - rx0;
    let per = |ns: u64| ns as f64 / sent.max(1) as f64;
    let mut s = Sample {
        sent,
        secs,
        replies,
        sender_ns: per(cpu),
        busy_ns: per(busy1 - busy0),
        daemon_pct,
        ..Sample::default()
    };
    if bpf_stats {
        let progs1 = prog_stats(&bed.node)?;
        for (kind, t1, c1) in progs1 {
            let Some((_, t0, c0)) = progs0.iter().find(|p| p.0 == kind) else {
                continue;
            };
            let v = (t1 - t0) as f64 / (c1 - c0).max(1) as f64;
            if kind == "egress" {
                s.egress_ns = Some(v);
            } else {
                s.ingress_ns = Some(v);
            }
        }
    }
    Ok(s)
}

/// median, min, max of a non-empty sample.
fn mmm(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (testbed::percentile(&v, 0.5), v[0], v[v.len() - 1])
}

fn report_flood(n: u32, samples: &BTreeMap<(usize, Target), Vec<Sample>>) {
    println!(
        "{:<24} {:>20} {:>8} {:>22} {:>14} {:>22} {:>14} {:>9} {:>9} {:>9}",
        "approach / target",
        "kpps sent (min-max)",
        "replies",
        "sender ns/frame",
        "- floor",
        "busy ns/frame",
        "- floor",
        "bpf egr",
        "bpf ingr",
        "daemon %"
    );
    for target in [Target::Lb, Target::NodeIp] {
        let floor = &samples[&(0, target)];
        for (ai, a) in APPROACHES.iter().enumerate() {
            let s = &samples[&(ai, target)];
            let kpps = mmm(s.iter().map(|x| x.sent as f64 / x.secs / 1e3).collect());
            let replies: u64 = s.iter().map(|x| x.replies).sum();
            let sent: u64 = s.iter().map(|x| x.sent).sum();
            let ratio = replies as f64 / sent.max(1) as f64;
            let sender = mmm(s.iter().map(|x| x.sender_ns).collect());
            let busy = mmm(s.iter().map(|x| x.busy_ns).collect());
            // Paired with the floor of the same round.
            let d_sender = mmm(s
                .iter()
                .zip(floor)
                .map(|(x, f)| x.sender_ns - f.sender_ns)
                .collect());
            let d_busy = mmm(s
                .iter()
                .zip(floor)
                .map(|(x, f)| x.busy_ns - f.busy_ns)
                .collect());
            // The kernel's run times, from the rounds with BPF stats on.
            let timed = samples.get(&(APPROACHES.len() + ai, target));
            let egress: Vec<f64> = timed
                .into_iter()
                .flatten()
                .filter_map(|x| x.egress_ns)
                .collect();
            let ingress: Vec<f64> = timed
                .into_iter()
                .flatten()
                .filter_map(|x| x.ingress_ns)
                .collect();
            let bpf = |v: &[f64]| {
                if v.is_empty() {
                    None
                } else {
                    Some(mmm(v.to_vec()))
                }
            };
            let (egress, ingress) = (bpf(&egress), bpf(&ingress));
            let daemon: Vec<f64> = s.iter().filter_map(|x| x.daemon_pct).collect();
            let daemon = bpf(&daemon);
            let show = |o: Option<(f64, f64, f64)>| o.map_or("-".into(), |m| format!("{:.0}", m.0));
            println!(
                "{:<24} {:>6.0} ({:>5.0}-{:>5.0}) {:>8.3} {:>6.0} ({:>5.0}-{:>5.0}) {:>+5.0} ({:+.0}..{:+.0}) {:>6.0} ({:>5.0}-{:>5.0}) {:>+5.0} ({:+.0}..{:+.0}) {:>9} {:>9} {:>9}",
                format!("{} / {}", a.name(), target.name()),
                kpps.0, kpps.1, kpps.2,
                ratio,
                sender.0, sender.1, sender.2,
                d_sender.0, d_sender.1, d_sender.2,
                busy.0, busy.1, busy.2,
                d_busy.0, d_busy.1, d_busy.2,
                show(egress),
                show(ingress),
                show(daemon),
            );
            let mut line = format!(
                "RESULT alt_flood_n{n} {}_{} kpps={:.1} kpps_min={:.1} kpps_max={:.1} replies_per_request={:.3} \
                 sender_ns={:.0} sender_ns_min={:.0} sender_ns_max={:.0} sender_ns_over_floor={:.0} \
                 sender_ns_over_floor_min={:.0} sender_ns_over_floor_max={:.0} busy_ns={:.0} busy_ns_min={:.0} \
                 busy_ns_max={:.0} busy_ns_over_floor={:.0} busy_ns_over_floor_min={:.0} busy_ns_over_floor_max={:.0} rounds={}",
                a.name(), target.name(),
                kpps.0, kpps.1, kpps.2, ratio,
                sender.0, sender.1, sender.2, d_sender.0, d_sender.1, d_sender.2,
                busy.0, busy.1, busy.2, d_busy.0, d_busy.1, d_busy.2,
                s.len()
            );
            for (name, m) in [
                ("bpf_egress_ns", egress),
                ("bpf_ingress_ns", ingress),
                ("daemon_cpu_pct", daemon),
            ] {
                if let Some(m) = m {
                    line.push_str(&format!(
                        " {name}={:.0} {name}_min={:.0} {name}_max={:.0}",
                        m.0, m.1, m.2
                    ));
                }
            }
            println!("{line}");
        }
    }
}

/// The kernel times every BPF program run while the returned fd is open.
fn enable_stats() -> Result<OwnedFd> {
    aya::sys::enable_stats(aya::sys::Stats::RunTime).context("BPF_ENABLE_STATS")
}

/// A send-only packet socket (protocol 0: it receives nothing, so the
/// flood pays for no copies to it) bound to one interface of a namespace.
struct Sender {
    fd: OwnedFd,
    ifindex: i32,
}

impl Sender {
    fn open(ns: &Netns, iface: &str) -> Result<Self> {
        let iface = iface.to_owned();
        ns.enter(move || {
            let name = std::ffi::CString::new(iface.clone())?;
            // SAFETY: plain syscalls with valid arguments; errors checked.
            unsafe {
                let ifindex = libc::if_nametoindex(name.as_ptr()) as i32;
                if ifindex == 0 {
                    bail!("no interface {iface}");
                }
                let fd = libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0);
                if fd < 0 {
                    bail!("socket(AF_PACKET): {}", std::io::Error::last_os_error());
                }
                Ok(Sender {
                    fd: OwnedFd::from_raw_fd(fd),
                    ifindex,
                })
            }
        })
    }

    /// Send `frames` round-robin for `dur`: (frames sent, seconds, the
    /// sending thread's CPU ns).
    fn flood(&self, frames: &[Vec<u8>], dur: Duration) -> Result<(u64, f64, u64)> {
        // SAFETY: sockaddr_ll is plain data.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = 0x0806u16.to_be();
        sll.sll_ifindex = self.ifindex;
        sll.sll_halen = 6;
        sll.sll_addr[..6].copy_from_slice(&frames[0][..6]);
        let cpu0 = thread_cpu_ns();
        let t0 = Instant::now();
        let (mut sent, mut i) = (0u64, 0usize);
        loop {
            for _ in 0..64 {
                let f = &frames[i];
                i = (i + 1) % frames.len();
                // SAFETY: the buffer and sockaddr outlive the call.
                let r = unsafe {
                    libc::sendto(
                        self.fd.as_raw_fd(),
                        f.as_ptr() as *const libc::c_void,
                        f.len(),
                        0,
                        &sll as *const _ as *const libc::sockaddr,
                        std::mem::size_of::<libc::sockaddr_ll>() as u32,
                    )
                };
                if r >= 0 {
                    sent += 1;
                }
            }
            if t0.elapsed() >= dur {
                break;
            }
        }
        let secs = t0.elapsed().as_secs_f64();
        Ok((sent, secs, thread_cpu_ns() - cpu0))
    }
}

fn thread_cpu_ns() -> u64 {
    // SAFETY: timespec is plain data; clock_gettime writes it.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: a valid clock id and pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Busy time of all CPUs so far (user+nice+system+irq+softirq+steal), in ns.
fn busy_ns() -> Result<u64> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let line = stat.lines().next().context("/proc/stat")?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    // user nice system idle iowait irq softirq steal
    let busy = v[0] + v[1] + v[2] + v[5] + v[6] + v.get(7).copied().unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    Ok(busy * 1_000_000_000 / hz)
}

/// Packets received on eth0 of `ns`.
fn rx_packets(ns: &Netns) -> Result<u64> {
    let out = ns.ip(&["-s", "-j", "link", "show", "dev", "eth0"])?;
    let v: Value = serde_json::from_str(&out)?;
    v[0]["stats64"]["rx"]["packets"]
        .as_u64()
        .context("rx packets in ip -s -j link")
}

/// The BPF programs in the TCX chains of the node's eth0: (direction,
/// run_time_ns, run_cnt). Kernel-measured while BPF_ENABLE_STATS is on.
fn prog_stats(ns: &Netns) -> Result<Vec<(String, u64, u64)>> {
    use aya::programs::{SchedClassifier, TcAttachType};
    let ids = ns.enter(|| {
        let mut ids = Vec::new();
        for (dir, t) in [
            ("egress", TcAttachType::Egress),
            ("ingress", TcAttachType::Ingress),
        ] {
            let (_, progs) = SchedClassifier::query_tcx("eth0", t)?;
            ids.extend(progs.iter().map(|p| (dir.to_owned(), p.id())));
        }
        Ok(ids)
    })?;
    let mut out = Vec::new();
    for (dir, id) in ids {
        let info: Value = serde_json::from_str(&ns.exec(&[
            "bpftool",
            "-j",
            "prog",
            "show",
            "id",
            &id.to_string(),
        ])?)?;
        out.push((
            dir,
            info["run_time_ns"].as_u64().unwrap_or(0),
            info["run_cnt"].as_u64().unwrap_or(0),
        ));
    }
    Ok(out)
}

// ---- throughput -------------------------------------------------------------

/// A child process killed on drop.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One iperf3 run from the node to the neighbour: (value, unit).
fn iperf(bed: &AltBed, udp: bool, secs: u32) -> Result<(f64, f64)> {
    let secs = secs.to_string();
    let mut args = vec!["iperf3", "-c", "198.51.100.1", "-t", &secs, "-J"];
    if udp {
        args.extend(["-u", "-l", "64", "-b", "0"]);
    }
    let out = bed.node.exec_output(&args)?;
    let v: Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("iperf3 -J: {}", String::from_utf8_lossy(&out.stderr)))?;
    if let Some(e) = v["error"].as_str() {
        bail!("iperf3: {e}");
    }
    let end = &v["end"];
    if udp {
        let s = &end["sum"];
        let secs = s["seconds"].as_f64().context("seconds")?;
        let packets = s["packets"].as_f64().context("packets")?;
        let lost = s["lost_packets"].as_f64().unwrap_or(0.0);
        // Received and sent datagrams per second.
        Ok(((packets - lost) / secs, packets / secs))
    } else {
        let bps = end["sum_received"]["bits_per_second"]
            .as_f64()
            .context("sum_received")?;
        let retr = end["sum_sent"]["retransmits"].as_f64().unwrap_or(0.0);
        Ok((bps / 1e6, retr))
    }
}

fn throughput_part(cfg: &Config) -> Result<()> {
    if Command::new("iperf3").arg("--version").output().is_err() {
        println!("\nthroughput: iperf3 is not installed (apt-get install iperf3); skipped");
        println!("RESULT alt_throughput skipped reason=no_iperf3");
        return Ok(());
    }
    let lb = wire_ips(20);
    let mut bed = AltBed::new(
        "altbt",
        Plan {
            foreign: lb,
            owned: vec![],
            foreign_on_uplink: vec![],
            table_only: 280,
        },
    )?;
    let _server = Killed(
        bed.peer
            .command(std::path::Path::new("iperf3"))
            .args(["-s", "-B", &PEER_IP.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?,
    );
    std::thread::sleep(Duration::from_millis(300));
    println!(
        "\nthroughput on the guarded veth, node -> neighbour through the guard's egress: iperf3, {} interleaved rounds of {} s",
        cfg.iperf_rounds, cfg.iperf_secs
    );
    let pair = [Approach::Nothing, Approach::ArpGuard];
    let mut tcp: [Vec<f64>; 2] = Default::default();
    let mut udp: [Vec<f64>; 2] = Default::default();
    let mut udp_sent: [Vec<f64>; 2] = Default::default();
    let mut egress: Vec<f64> = Vec::new();
    for round in 0..cfg.iperf_rounds {
        for j in 0..2 {
            let i = (round + j) % 2;
            bed.apply(pair[i])?;
            settle(cfg, pair[i]);
            tcp[i].push(iperf(&bed, false, cfg.iperf_secs)?.0);
            let (rx, tx) = iperf(&bed, true, cfg.iperf_secs)?;
            udp[i].push(rx);
            udp_sent[i].push(tx);
        }
    }
    // The guard's egress program on these frames, timed by the kernel in a
    // run of its own (UDP: the most frames).
    bed.apply(Approach::ArpGuard)?;
    let stats = enable_stats()?;
    let p0 = prog_stats(&bed.node)?;
    iperf(&bed, true, cfg.iperf_secs)?;
    let p1 = prog_stats(&bed.node)?;
    drop(stats);
    for ((k, t1, c1), (_, t0, c0)) in p1.iter().zip(&p0) {
        if k == "egress" {
            egress.push((t1 - t0) as f64 / (c1 - c0).max(1) as f64);
        }
    }
    bed.clear()?;
    for (name, unit, v) in [
        ("tcp", "Mbit/s", &tcp),
        ("udp64_received", "pps", &udp),
        ("udp64_sent", "pps", &udp_sent),
    ] {
        let (f, g) = (mmm(v[0].clone()), mmm(v[1].clone()));
        let ratio = mmm(v[1].iter().zip(&v[0]).map(|(g, f)| g / f).collect());
        println!(
            "{name:<16} without {:>9.0} ({:.0}-{:.0}) {unit}   with the guard {:>9.0} ({:.0}-{:.0})   \
             with/without per round {:.2} ({:.2}-{:.2})",
            f.0, f.1, f.2, g.0, g.1, g.2, ratio.0, ratio.1, ratio.2
        );
        for (row, m) in [("nothing", f), ("arp_guard", g)] {
            println!(
                "RESULT alt_throughput {row}_{name} median={:.0} min={:.0} max={:.0} unit={} runs={}",
                m.0,
                m.1,
                m.2,
                unit.replace("Mbit/s", "mbit_per_s"),
                v[0].len()
            );
        }
        println!(
            "RESULT alt_throughput ratio_{name} median={:.3} min={:.3} max={:.3}",
            ratio.0, ratio.1, ratio.2
        );
    }
    if !egress.is_empty() {
        let m = mmm(egress);
        println!(
            "guard egress program during iperf3 (non-ARP frames): {:.0} ns per run ({:.0}-{:.0}, kernel's run time)",
            m.0, m.1, m.2
        );
        println!(
            "RESULT alt_throughput arp_guard_bpf_egress ns_per_frame={:.0} min={:.0} max={:.0}",
            m.0, m.1, m.2
        );
    }
    Ok(())
}
