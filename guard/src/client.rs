//! `arp-guard status | explain | events`: clients of the running daemon's API.

use anyhow::{bail, Result};
use serde_json::Value;

use crate::{
    api,
    cli::{ClientArgs, ExplainArgs, Output},
};

fn fetch(args: &ClientArgs, path: &str) -> Result<Value> {
    let (code, body) = api::get(args.api, path, None)?;
    if code != 200 {
        bail!("the daemon answered {code} for {path}: {}", body.trim());
    }
    Ok(serde_json::from_str(&body)?)
}

fn s(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        v => v.to_string(),
    }
}

pub fn status(args: &ClientArgs) -> Result<()> {
    let v = fetch(args, "/status")?;
    if args.output == Output::Json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!(
        "node {}  mode {}  ready {}",
        s(&v["node"]),
        s(&v["mode"]),
        s(&v["ready"])
    );
    for r in v["not_ready"].as_array().into_iter().flatten() {
        println!("  not ready: {}", s(r));
    }
    for i in v["interfaces"].as_array().into_iter().flatten() {
        println!(
            "  interface {:<12} {:<9} {}",
            s(&i["name"]),
            s(&i["state"]),
            s(&i["detail"])
        );
    }
    if !v["feed"].is_null() {
        let f = &v["feed"];
        println!(
            "  kubernetes feed: announcers {}  synced {}  blind {}  degraded {}  unconfirmed leases {}",
            s(&f["announcers"]),
            s(&f["synced"]),
            s(&f["blind"]),
            s(&f["degraded"]),
            s(&f["unconfirmed_leases"])
        );
        for st in f["streams"].as_array().into_iter().flatten() {
            let health = if st["healthy"] == true {
                "healthy"
            } else {
                "FAILING"
            };
            println!(
                "    stream {:<32} {health} {}",
                s(&st["name"]),
                st["error"].as_str().unwrap_or("")
            );
        }
    }
    println!(
        "  LB IPs {} (owned {}, foreign {}, unknown {}), not enforced {}, map memory {} bytes",
        s(&v["lb_ips"]["total"]),
        s(&v["lb_ips"]["owned"]),
        s(&v["lb_ips"]["foreign"]),
        s(&v["lb_ips"]["unknown"]),
        s(&v["not_enforced"]),
        s(&v["map_memory_bytes"])
    );
    println!();
    println!(
        "{:<16} {:<8} {:<10} {:<10} {:<10} SOURCE",
        "LB IP", "STATE", "PASSED", "DROPPED", "REWRITTEN"
    );
    for ip in v["ips"].as_array().into_iter().flatten() {
        // Monitor mode's would_* count with what enforce would have done.
        let n = |k: &str| ip["counters"][k].as_u64().unwrap_or(0);
        println!(
            "{:<16} {:<8} {:<10} {:<10} {:<10} {}",
            s(&ip["ip"]),
            s(&ip["state"]),
            n("passed"),
            n("dropped") + n("would_drop"),
            n("rewritten") + n("would_rewrite"),
            s(&ip["source"])
        );
    }
    Ok(())
}

pub fn explain(args: &ExplainArgs) -> Result<()> {
    let v = fetch(&args.client, &format!("/explain?ip={}", args.ip))?;
    if args.client.output == Output::Json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    if v["lb_ip"] != true {
        println!(
            "{} is not an LB IP for this node: its ARP frames pass untouched.",
            args.ip
        );
        return Ok(());
    }
    println!("{} is {} on this node", args.ip, s(&v["state"]));
    println!("  because: {}", s(&v["source"]));
    println!(
        "  known for {} s; mode {}, leak action {}",
        s(&v["known_for_seconds"]),
        s(&v["mode"]),
        s(&v["leak_action"])
    );
    println!("  what the program does with it:");
    println!(
        "    {:<12} {:<14} {:<8} VERDICT",
        "INTERFACE", "KIND", "ORIGIN"
    );
    for w in v["would"].as_array().into_iter().flatten() {
        println!(
            "    {:<12} {:<14} {:<8} {}",
            s(&w["interface"]),
            s(&w["kind"]),
            s(&w["origin"]),
            s(&w["verdict"])
        );
    }
    Ok(())
}

pub fn events(args: &ClientArgs) -> Result<()> {
    let json = args.output == Output::Json;
    let mut print = |piece: &str| {
        for line in piece.lines().filter(|l| !l.is_empty()) {
            if json {
                println!("{line}");
                continue;
            }
            match serde_json::from_str::<Value>(line) {
                Ok(e) if e["lagged"].is_null() => println!(
                    "{} {} {} {} {} lb_ip={} requester={} {} state={}",
                    s(&e["time"]),
                    s(&e["interface"]),
                    s(&e["verdict"]),
                    s(&e["kind"]),
                    s(&e["origin"]),
                    s(&e["lb_ip"]),
                    s(&e["requester_ip"]),
                    s(&e["requester_mac"]),
                    s(&e["state"])
                ),
                Ok(e) => println!(
                    "(the stream fell behind: {} events skipped)",
                    s(&e["lagged"])
                ),
                Err(_) => println!("{line}"),
            }
        }
    };
    let (code, body) = api::get(args.api, "/events", Some(&mut print))?;
    if code != 200 {
        bail!("the daemon answered {code}: {}", body.trim());
    }
    Ok(())
}
