//! `sudo cargo bench -p arp-guard-tests --bench takeover`: what the guard
//! adds to a takeover, as the client lives it. For each announcer's order of
//! API write and announcement (Cilium: Lease, then one gratuitous ARP;
//! kube-vip: Lease, then a request and a reply; MetalLB: the announcements,
//! then its ServiceL2Status 0–500 ms later), rounds of takeovers back and
//! forth between two nodes, and the time from the takeover to the client's
//! existing neighbour entry holding the new owner's MAC:
//!
//! - `none`: no guard (the floor: the announcement goes straight out);
//! - `guard`: arp-guard in enforce mode on both nodes (held announcements
//!   re-sent at the takeover);
//! - `no-hold`: arp-guard with `--announce-hold 0` (what it did before: an
//!   announcement dropped before the guard heard of the takeover is lost).
//!
//! Per row: rounds whose client's entry held the new MAC within 1 s (`ip
//! neigh`, polled); p50/p99 of the time until the new owner's announcement
//! reached the client's interface (a packet socket there: the precise
//! figure); for `guard`, how long the held announcements waited (the
//! daemon's log, p50/p99).
//! `BENCH_SHORT=1`: 2 rounds each. `BENCH_ROUNDS=n`: n rounds each.
//! Output: `RESULT takeover <style>-<variant> key=value ...`.

use std::time::Duration;

use testbed::{
    percentile,
    takeover::{Style, TakeoverBed},
};

fn rounds() -> usize {
    if let Some(n) = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return n;
    }
    if std::env::var_os("BENCH_SHORT").is_some() {
        2
    } else {
        30
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The `held_ms` of each "held announcements re-sent" line of a guard.
fn held_ms(t: &TakeoverBed) -> Vec<f64> {
    t.guards
        .iter()
        .flat_map(|g| g.lines("held announcements re-sent"))
        .filter_map(|l| {
            let v: serde_json::Value = serde_json::from_str(&l).ok()?;
            v["held_ms"].as_f64()
        })
        .collect()
}

fn run(style: Style, variant: &str, n: usize) {
    let tag = format!("tb{}{}", &style.announcer()[..2], &variant[..2]);
    let (guard, extra): (bool, &[&str]) = match variant {
        "none" => (false, &[]),
        "guard" => (true, &[]),
        _ => (true, &["--announce-hold", "0"]),
    };
    let mut t = TakeoverBed::new(&tag, style, guard, extra).unwrap();
    let mut moved = Vec::new();
    let mut within = 0;
    for _ in 0..n {
        let r = t.round(Duration::from_secs(3)).unwrap();
        within += usize::from(r.moved_after.is_some_and(|d| d <= Duration::from_secs(1)));
        if let Some(d) = r.arrived_after {
            moved.push(ms(d));
        }
    }
    moved.sort_by(f64::total_cmp);
    let mut held = held_ms(&t);
    held.sort_by(f64::total_cmp);
    let q = |v: &[f64], p: f64| {
        if v.is_empty() {
            "-".to_owned()
        } else {
            format!("{:.1}", percentile(v, p))
        }
    };
    println!(
        "{:<9} {:<8} moved within 1 s: {within}/{n}; arrived p50 {} ms, p99 {} ms; held p50 {} ms, p99 {} ms ({} re-sent)",
        style.announcer(),
        variant,
        q(&moved, 0.5),
        q(&moved, 0.99),
        q(&held, 0.5),
        q(&held, 0.99),
        held.len()
    );
    println!(
        "RESULT takeover {}-{variant} within_1s={within}/{n} arrived_p50_ms={} arrived_p99_ms={} held_p50_ms={} held_p99_ms={} resent={}",
        style.announcer(),
        q(&moved, 0.5),
        q(&moved, 0.99),
        q(&held, 0.5),
        q(&held, 0.99),
        held.len()
    );
}

fn main() {
    testbed::require_root();
    let n = rounds();
    for style in [Style::Cilium, Style::KubeVip, Style::MetalLb] {
        for variant in ["none", "guard", "no-hold"] {
            run(style, variant, n);
        }
    }
}
