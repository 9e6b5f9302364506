//! Differential fuzzing: the real BPF program, run by the kernel through
//! BPF_PROG_TEST_RUN, against the host-side reference (`guard_common`'s
//! parser and `decide`, with the same map contents) on the corpus in
//! `tests/corpus/frames.hex` and on at least 100,000 generated frames: valid
//! ARP of every kind, tagged and double-tagged, truncated at every offset,
//! wrong hardware/protocol types and lengths, random bytes, non-ARP traffic;
//! IPv6 Neighbor Solicitations and Advertisements of LB and other addresses
//! with extension headers, wrong hop limits and codes, broken options.
//!
//! Every return code and output frame is compared per frame; counters and
//! totals per batch, and a batch that disagrees is replayed frame by frame.
//! Any disagreement fails the test and prints the frame in hex.
//! `ARP_GUARD_FUZZ_SEED` and `ARP_GUARD_FUZZ_FRAMES` change the run.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use guard::testing::{Datapath, Rng, Snapshot};
use guard_common::{
    classify, classify_nd, frame, judge, ndp, ndp_build::NdSpec, v4_key, Facts, IpKey, Kind,
    LeakAction, Liveness, Mode, Origin, Ownership, Parsed, Verdict,
};

use test_run::{counter_delta, lb_ips, lb_ips6, DeltaKey, DROP, PASS, PRIMARY};

/// One generated frame that BPF_PROG_TEST_RUN accepts.
fn generate(r: &mut Rng) -> Vec<u8> {
    let mut f = generate_raw(r);
    // BPF_PROG_TEST_RUN refuses IPv4/IPv6 frames shorter than their header
    // (EINVAL); a real stack never hands such a frame to TC either.
    if f.len() >= 14
        && matches!(u16::from_be_bytes([f[12], f[13]]), 0x0800 | 0x86dd)
        && f.len() < 14 + 40
    {
        f.resize(14 + 40, 0);
    }
    f
}

fn generate_raw(r: &mut Rng) -> Vec<u8> {
    let ips: Vec<[u8; 4]> = lb_ips()
        .iter()
        .map(|(ip, _, _)| ip.octets())
        .chain([[198, 51, 100, 1], PRIMARY.octets(), [0; 4]])
        .collect();
    let mut f = Vec::with_capacity(64);
    f.extend_from_slice(&[0xff; 6]);
    f.extend_from_slice(&[2, 0, 0, 0x5e, 0x53, 9]);
    let tags = *r.pick(&[0, 0, 0, 1, 1, 2, 3]);
    for _ in 0..tags {
        f.extend_from_slice(&r.pick(&[0x8100u16, 0x88a8, 0x8100, 0x9100]).to_be_bytes());
        f.extend_from_slice(&(r.below(4096) as u16).to_be_bytes());
    }
    match r.below(12) {
        // IPv6 Neighbor Discovery.
        10 | 11 => return generate_nd(r, f.len() - 12),
        // Non-ARP traffic.
        0 => {
            f.extend_from_slice(&r.pick(&[0x0800u16, 0x86dd, 0x88cc, 0x8035]).to_be_bytes());
            let n = r.below(60);
            f.extend(r.bytes(n));
            return f;
        }
        // Random bytes after the MACs (at least an ethertype's worth).
        1 => {
            let n = 2 + r.below(50);
            f.extend(r.bytes(n));
            return f;
        }
        _ => {}
    }
    f.extend_from_slice(&0x0806u16.to_be_bytes());
    let spa = *r.pick(&ips);
    let tpa = if r.below(3) == 0 { spa } else { *r.pick(&ips) };
    let op = *r.pick(&[1u16, 2, 1, 2, 3, 4, 0]);
    let mut arp = Vec::with_capacity(28);
    arp.extend_from_slice(&r.pick(&[1u16, 1, 1, 6]).to_be_bytes());
    arp.extend_from_slice(&r.pick(&[0x0800u16, 0x0800, 0x0800, 0x86dd]).to_be_bytes());
    arp.push(*r.pick(&[6, 6, 6, 8]));
    arp.push(*r.pick(&[4, 4, 4, 16]));
    arp.extend_from_slice(&op.to_be_bytes());
    arp.extend_from_slice(&[2, 0, 0, 0x5e, 0x53, 9]);
    arp.extend_from_slice(&spa);
    arp.extend(r.bytes(6));
    arp.extend_from_slice(&tpa);
    f.extend(arp);
    // Ethernet padding, or a cut anywhere (never below the Ethernet header:
    // BPF_PROG_TEST_RUN, like a NIC, needs one).
    match r.below(4) {
        0 => {
            let cut = 14 + r.below(f.len() - 14);
            f.truncate(cut);
        }
        1 => {
            let n = r.below(20);
            f.extend(r.bytes(n));
        }
        _ => {}
    }
    f
}

/// An NDP frame: an NS or NA about an IPv6 LB IP or another address,
/// `tag_bytes` of tags, sometimes broken the ways a receiver would notice.
fn generate_nd(r: &mut Rng, tag_bytes: usize) -> Vec<u8> {
    let ips: Vec<IpKey> = lb_ips6()
        .iter()
        .map(|(ip, _)| ip.octets())
        .chain([[0xfd; 16], [0; 16]])
        .collect();
    let mac = [2, 0, 0, 0x5e, 0x53, 9];
    let mut spec = match r.below(3) {
        0 => NdSpec::solicit(mac, *r.pick(&ips), *r.pick(&ips)),
        1 => NdSpec::unsolicited(mac, *r.pick(&ips)),
        _ => NdSpec::advert(
            mac,
            *r.pick(&ips),
            [2, 0, 0, 0, 0, 1],
            *r.pick(&ips),
            *r.pick(&[0x40u8, 0x60, 0xe0, 0]),
        ),
    };
    spec.sll = r.below(4) > 0;
    spec.ext_headers = *r.pick(&[0u8, 0, 0, 1, 2, 4, 5]);
    spec.hop_limit = *r.pick(&[255u8, 255, 255, 64]);
    if tag_bytes >= 4 {
        spec.tags[0] = Some((0x8100, r.below(4096) as u16));
    }
    if tag_bytes >= 8 {
        spec.tags[1] = Some((0x8100, r.below(4096) as u16));
    }
    let mut f = testbed::nd_bytes(&spec);
    match r.below(6) {
        // A byte anywhere after the Ethernet header changed.
        0 => {
            let at = 14 + r.below(f.len() - 14);
            f[at] = r.next_u64() as u8;
        }
        // Cut (BPF_PROG_TEST_RUN wants a whole IPv6 header).
        1 => {
            let min = 14 + 40 + 4 * spec.tags.iter().flatten().count();
            let cut = min + r.below(f.len() - min);
            f.truncate(cut);
        }
        // Ethernet padding.
        2 => {
            let k = r.below(20);
            f.extend(r.bytes(k));
        }
        _ => {}
    }
    f
}

/// What the reference says the program must do with `frame`.
struct Expect {
    ret: i32,
    out: Vec<u8>,
    /// (ip, kind, origin, state, verdict) counted, if any.
    counted: Option<DeltaKey>,
    stats: BTreeMap<&'static str, u64>,
}

/// The facts and the decision, as the program makes them; `e` gets the
/// verdict, the counter and the stats.
#[allow(clippy::too_many_arguments)]
fn judged(
    e: &mut Expect,
    stats: &mut BTreeMap<&'static str, u64>,
    ip: IpKey,
    kind: Kind,
    state: Ownership,
    on_egress: bool,
    mode: Mode,
    leak_action: LeakAction,
    live: Liveness,
    origin: Origin,
) -> Verdict {
    let mut facts = Facts {
        kind,
        origin,
        state,
        ip_on_egress: on_egress,
        egress_has_ipv4: true,
        mode,
        leak_action,
        liveness: live,
    };
    // The shared judgement, as the program makes it: the heartbeat is read
    // (and a stale or dead one counted) only for an IP this node does not own.
    let j = judge(kind, origin, state, mode, leak_action, &mut facts);
    match j.liveness {
        Some(Liveness::Stale) => {
            stats.insert("heartbeat_stale", 1);
        }
        Some(Liveness::Dead) => {
            stats.insert("heartbeat_dead_passed", 1);
        }
        _ => {}
    }
    let verdict = j.verdict;
    if verdict == Verdict::Dropped {
        e.ret = DROP;
    }
    e.counted = Some((ip, kind as u8, origin as u8, j.state as u8, verdict as u8));
    // Every decision that stops (or would stop) a frame makes an event,
    // delivered or suppressed by the rate limit; so does the first
    // announcement that passes for an entry the daemon asked to watch.
    if verdict != Verdict::Passed
        || (kind.is_announcement() && WATCHED.with(|w| w.borrow_mut().remove(&ip)))
    {
        stats.insert("events", 1);
    }
    verdict
}

thread_local! {
    /// The LB entries whose next passing announcement the program reports
    /// (`LbEntry.watch`: every entry written in a state other than foreign,
    /// cleared by the program when it reports). Per test thread, as each
    /// test loads its own program.
    static WATCHED: std::cell::RefCell<std::collections::BTreeSet<IpKey>> = Default::default();
}

/// The reference for an NDP frame.
#[allow(clippy::too_many_arguments)]
fn reference_nd(
    f: &[u8],
    nd: &guard_common::NdFrame,
    mut e: Expect,
    mut stats: BTreeMap<&'static str, u64>,
    mode: Mode,
    leak_action: LeakAction,
    live: Liveness,
    origin: Origin,
) -> Expect {
    stats.insert("ndp", 1);
    let lb = nd
        .claimed()
        .and_then(|ip| lb_ips6().into_iter().find(|(a, _)| a.octets() == ip));
    let Some((ip, state)) = lb else {
        stats.insert("ndp_not_lb", 1);
        e.stats = stats;
        return e;
    };
    let kind = match classify_nd(f, nd) {
        guard_common::NdClass::Announces(kind) => Some(kind),
        guard_common::NdClass::Nothing => None,
        guard_common::NdClass::Malformed => {
            stats.insert("ndp_malformed", 1);
            e.stats = stats;
            return e;
        }
    };
    if let Some(kind) = kind {
        let ip = ip.octets();
        // NDP is never rewritten: the output is the input.
        judged(
            &mut e,
            &mut stats,
            ip,
            kind,
            state,
            false,
            mode,
            leak_action,
            live,
            origin,
        );
    }
    e.stats = stats;
    e
}

fn reference(
    f: &[u8],
    mode: Mode,
    leak_action: LeakAction,
    live: Liveness,
    origin: Origin,
) -> Expect {
    let mut stats = BTreeMap::from([("frames", 1u64)]);
    let mut e = Expect {
        ret: PASS,
        out: f.to_vec(),
        counted: None,
        stats: BTreeMap::new(),
    };
    let ethertype = u16::from_be_bytes([f[12], f[13]]);
    let parsed = if ethertype == frame::ETH_P_ARP
        || frame::is_vlan(ethertype)
        || ethertype == ndp::ETH_P_IPV6
    {
        guard_common::parse(f, ethertype)
    } else {
        Parsed::Other
    };
    let arp = match parsed {
        Parsed::Other => {
            e.stats = stats;
            return e;
        }
        Parsed::NdMalformed => {
            stats.insert("ndp", 1);
            stats.insert("ndp_malformed", 1);
            e.stats = stats;
            return e;
        }
        Parsed::Ipv6Unfollowed => {
            stats.insert("ipv6_unfollowed", 1);
            e.stats = stats;
            return e;
        }
        Parsed::Nd(nd) => return reference_nd(f, &nd, e, stats, mode, leak_action, live, origin),
        Parsed::Malformed => {
            stats.insert("arp", 1);
            stats.insert("malformed", 1);
            e.stats = stats;
            return e;
        }
        Parsed::Arp(a) => a,
    };
    stats.insert("arp", 1);
    let Some((_, state, on_egress)) = lb_ips()
        .into_iter()
        .find(|(ip, _, _)| u32::from(*ip) == arp.spa)
    else {
        stats.insert("not_lb", 1);
        e.stats = stats;
        return e;
    };
    let Some(kind) = classify(&arp) else {
        e.stats = stats;
        return e;
    };
    let ip = v4_key(arp.spa);
    let verdict = judged(
        &mut e,
        &mut stats,
        ip,
        kind,
        state,
        on_egress,
        mode,
        leak_action,
        live,
        origin,
    );
    if verdict == Verdict::Rewritten {
        let at = arp.spa_offset();
        e.out[at..at + 4].copy_from_slice(&PRIMARY.octets());
    }
    e.stats = stats;
    e
}

/// Totals that changed. Delivered and suppressed drop events depend on the
/// rate limit's clock, so only their sum ("events") is compared.
fn stat_delta(before: &Snapshot, after: &Snapshot) -> BTreeMap<&'static str, u64> {
    let mut d: BTreeMap<&'static str, u64> = BTreeMap::new();
    for (k, v) in &after.stats {
        let n = v - before.stats[k];
        let k = if k.starts_with("events_") {
            "events"
        } else {
            *k
        };
        if n > 0 {
            *d.entry(k).or_default() += n;
        }
    }
    d
}

fn hex(f: &[u8]) -> String {
    f.iter().map(|b| format!("{b:02x}")).collect()
}

struct Harness {
    /// How often each outcome was exercised (so the run cannot be vacuous).
    seen: std::cell::RefCell<BTreeMap<String, u64>>,
    dp: Datapath,
    mode: Mode,
    leak_action: LeakAction,
    live: Liveness,
    /// Kernel-built, or redirected (the test context names an ingress device).
    origin: Origin,
    redirect_ok: bool,
    /// When the heartbeat was last dated.
    dated: Instant,
}

/// Half the margin a stale heartbeat has before it is dead
/// (`test_run::DEAD_AFTER` less `test_run::STALE_AGE`: 0.8 s).
const RE_DATE: Duration = Duration::from_millis(400);

impl Harness {
    fn new() -> Self {
        let dp = test_run::datapath(true);
        WATCHED.with(|w| {
            let v4 = lb_ips()
                .into_iter()
                .filter(|(_, s, _)| *s != Ownership::Foreign)
                .map(|(ip, ..)| v4_key(u32::from(ip)));
            let v6 = lb_ips6()
                .into_iter()
                .filter(|(_, s)| *s != Ownership::Foreign)
                .map(|(ip, _)| ip.octets());
            *w.borrow_mut() = v4.chain(v6).collect();
        });
        let redirect_ok = dp.test_run_sets_ingress();
        if !redirect_ok {
            eprintln!("NOTE: this kernel's BPF_PROG_TEST_RUN cannot set ingress_ifindex: no redirect-origin batches");
        }
        Harness {
            redirect_ok,
            seen: Default::default(),
            dp,
            mode: Mode::Enforce,
            leak_action: LeakAction::Rewrite,
            live: Liveness::Fresh,
            origin: Origin::Kernel,
            dated: Instant::now(),
        }
    }

    fn configure(&mut self, mode: Mode, leak_action: LeakAction, live: Liveness, origin: Origin) {
        // Kernels before 5.12 cannot name an ingress device in a test run
        // (the VM lane's 5.10): their redirect batches run as kernel ones.
        self.origin = if origin == Origin::Redirect && !self.redirect_ok {
            Origin::Kernel
        } else {
            origin
        };
        self.dp.set_config(mode, leak_action).unwrap();
        // A fresh heartbeat could age into `stale` during a long batch: dated an hour ahead.
        test_run::date_heartbeat(&mut self.dp, live);
        self.dated = Instant::now();
        (self.mode, self.leak_action, self.live) = (mode, leak_action, live);
    }

    /// Keep a stale heartbeat stale: it is dated 1.2 s back under a 2 s
    /// dead threshold, and a slow batch (the VM lane, emulated beside the
    /// host's tests) ages it past that. Dated again while it has aged less
    /// than half its margin, so that every frame meets the state the
    /// reference judges with.
    fn keep_liveness(&mut self) {
        if self.live == Liveness::Stale && self.dated.elapsed() > RE_DATE {
            test_run::date_heartbeat(&mut self.dp, self.live);
            self.dated = Instant::now();
        }
    }

    /// Run one frame; panic with its hex on any per-frame disagreement.
    fn run_one(&self, f: &[u8], expect: &Expect) {
        let (ret, out) = self
            .dp
            .test_run_from(
                f,
                if self.origin == Origin::Redirect {
                    test_run::LO
                } else {
                    0
                },
            )
            .unwrap_or_else(|e| panic!("BPF_PROG_TEST_RUN failed on {}: {e:#}", hex(f)));
        let ctx = || {
            format!(
                "frame {} ({:?}, {:?}, {:?}, {:?})",
                hex(f),
                self.mode,
                self.leak_action,
                self.live,
                self.origin
            )
        };
        assert_eq!(ret, expect.ret, "return code differs for {}", ctx());
        assert_eq!(out, expect.out, "output frame differs for {}", ctx());
    }

    /// Run a batch, compare per frame and then the counters over the batch.
    fn run_batch(&mut self, frames: &[Vec<u8>]) {
        let before = Snapshot::of_datapath(&self.dp).unwrap();
        let mut want_counters: BTreeMap<DeltaKey, u64> = BTreeMap::new();
        let mut want_stats: BTreeMap<&'static str, u64> = BTreeMap::new();
        for f in frames {
            let e = reference(f, self.mode, self.leak_action, self.live, self.origin);
            self.keep_liveness();
            self.run_one(f, &e);
            let ndp = e.stats.contains_key("ndp") || e.stats.contains_key("ipv6_unfollowed");
            let family = if ndp { "ndp " } else { "" };
            let outcome = match e.counted {
                Some((.., v)) => Verdict::from_u8(v).map_or("?", Verdict::as_str).to_owned(),
                None if e.stats.contains_key("malformed") => "malformed".into(),
                None if e.stats.contains_key("ndp_malformed") => "malformed".into(),
                None if e.stats.contains_key("ipv6_unfollowed") => "unfollowed".into(),
                None if e.stats.contains_key("not_lb") => "not_lb".into(),
                None if e.stats.contains_key("ndp_not_lb") => "not_lb".into(),
                None => "not_arp".into(),
            };
            let outcome = format!("{family}{outcome}");
            *self.seen.borrow_mut().entry(outcome).or_default() += 1;
            if let Some(k) = e.counted {
                *want_counters.entry(k).or_default() += 1;
            }
            for (k, v) in e.stats {
                *want_stats.entry(k).or_default() += v;
            }
        }
        let after = Snapshot::of_datapath(&self.dp).unwrap();
        if counter_delta(&before, &after) == want_counters
            && stat_delta(&before, &after) == want_stats
        {
            return;
        }
        // Find the frame: replay one at a time.
        for f in frames {
            let e = reference(f, self.mode, self.leak_action, self.live, self.origin);
            self.keep_liveness();
            let b = Snapshot::of_datapath(&self.dp).unwrap();
            self.run_one(f, &e);
            let a = Snapshot::of_datapath(&self.dp).unwrap();
            let want: BTreeMap<_, _> = e.counted.into_iter().map(|k| (k, 1)).collect();
            assert_eq!(
                counter_delta(&b, &a),
                want,
                "counters differ for frame {}",
                hex(f)
            );
            assert_eq!(
                stat_delta(&b, &a),
                e.stats,
                "totals differ for frame {}",
                hex(f)
            );
        }
        panic!("the batch's counters differed, but no single frame reproduces it");
    }
}

#[test]
fn corpus_agrees_with_reference() {
    testbed::require_root();
    let mut h = Harness::new();
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/corpus/frames.hex"
    ))
    .unwrap();
    let frames: Vec<Vec<u8>> = text
        .lines()
        .filter_map(|l| l.split('#').next().map(str::trim).filter(|h| !h.is_empty()))
        .map(|h| {
            (0..h.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap())
                .collect()
        })
        .collect();
    assert!(frames.len() >= 10, "corpus too small");
    for mode in [Mode::Enforce, Mode::Monitor] {
        for live in [Liveness::Fresh, Liveness::Stale, Liveness::Dead] {
            for origin in [Origin::Kernel, Origin::Redirect] {
                h.configure(mode, LeakAction::Rewrite, live, origin);
                h.run_batch(&frames);
            }
        }
    }
}

#[test]
fn generated_frames_agree_with_reference() {
    testbed::require_root();
    let seed: u64 = std::env::var("ARP_GUARD_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x00a7_9a4d);
    let total: usize = std::env::var("ARP_GUARD_FUZZ_FRAMES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(120_000);
    eprintln!("fuzz: seed {seed}, {total} frames (ARP_GUARD_FUZZ_SEED / ARP_GUARD_FUZZ_FRAMES)");
    let mut r = Rng(seed | 1);
    let mut h = Harness::new();
    let mut done = 0;
    let mut batch_no = 0u64;
    while done < total {
        let mode = if batch_no % 5 == 4 {
            Mode::Monitor
        } else {
            Mode::Enforce
        };
        let leak = if batch_no % 3 == 2 {
            LeakAction::Drop
        } else {
            LeakAction::Rewrite
        };
        let live = match batch_no % 7 {
            5 => Liveness::Stale,
            6 => Liveness::Dead,
            _ => Liveness::Fresh,
        };
        let origin = if batch_no % 4 == 3 {
            Origin::Redirect
        } else {
            Origin::Kernel
        };
        h.configure(mode, leak, live, origin);
        let frames: Vec<Vec<u8>> = (0..1000).map(|_| generate(&mut r)).collect();
        h.run_batch(&frames);
        done += frames.len();
        batch_no += 1;
    }
    // Every truncation of every corpus-like valid frame, tagged 0-2 times.
    h.configure(
        Mode::Enforce,
        LeakAction::Rewrite,
        Liveness::Fresh,
        Origin::Kernel,
    );
    let mut cuts = Vec::new();
    for _ in 0..50 {
        let f = loop {
            let f = generate(&mut r);
            if f.len() > 14 {
                break f;
            }
        };
        // BPF_PROG_TEST_RUN wants an untagged IP frame's whole header
        // (generate pads them to the IPv6 header's length).
        let ip = matches!(u16::from_be_bytes([f[12], f[13]]), 0x0800 | 0x86dd);
        let min = if ip { 14 + 40 } else { 14 };
        for len in min..=f.len() {
            cuts.push(f[..len].to_vec());
        }
    }
    h.run_batch(&cuts);
    let seen = h.seen.borrow();
    eprintln!("fuzz: outcomes {seen:?}");
    for outcome in [
        "passed",
        "dropped",
        "would_drop",
        "rewritten",
        "would_rewrite",
        "malformed",
        "not_lb",
        "not_arp",
        "ndp passed",
        "ndp dropped",
        "ndp would_drop",
        "ndp malformed",
        "ndp not_lb",
        "ndp unfollowed",
    ] {
        assert!(
            seen.get(outcome).copied().unwrap_or(0) >= 20,
            "outcome {outcome} barely exercised: {seen:?}"
        );
    }
    assert!(seen.values().sum::<u64>() >= 100_000);
}
