#![deny(clippy::unwrap_used, clippy::expect_used)]

use std::process::ExitCode;

use clap::Parser as _;
use guard::{
    cli::{Cli, Command, LogFormat, Output},
    counters::{CountersDoc, Snapshot},
    ownership_file, preflight, view,
};

fn init_logging(cli: &Cli) {
    let filter = tracing_subscriber::EnvFilter::try_new(&cli.log_level).unwrap_or_else(|e| {
        eprintln!(
            "arp-guard: bad --log-level {:?} ({e}); using info",
            cli.log_level
        );
        tracing_subscriber::EnvFilter::new("info")
    });
    // Colour only on a terminal: a file or a log collector gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(&cli);
    let result = match cli.command {
        Command::Run(args) => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(anyhow::Error::from)
            .and_then(|rt| {
                let r = rt.block_on(guard::run::run(*args));
                // Exit even if some blocking task (a stuck read) never returns.
                rt.shutdown_timeout(std::time::Duration::from_secs(2));
                r
            }),
        Command::Counters(args) => counters(&args),
        Command::Validate(args) => validate(&args.file, args.max_bytes, args.node_name),
        Command::Uninstall(args) => uninstall(&args.pin_dir, &args.interfaces, args.force),
        Command::Status(args) => guard::client::status(&args),
        Command::Explain(args) => guard::client::explain(&args),
        Command::Events(args) => guard::client::events(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("arp-guard: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The counters of the guard on `iface`: from the running daemon's API, else
/// from its pins, else through the kernel (TCX query and map ids: root only).
fn counters_of(iface: &str, args: &guard::cli::CountersArgs) -> anyhow::Result<CountersDoc> {
    let mut tried = Vec::new();
    match guard::api::get(args.api, &format!("/counters?interface={iface}"), None) {
        Ok((200, body)) => return Ok(serde_json::from_str(&body)?),
        Ok((404, body)) => anyhow::bail!("{}", body.trim()),
        Ok((code, body)) => tried.push(format!(
            "the API on {} answered {code}: {}",
            args.api,
            body.trim()
        )),
        Err(e) => tried.push(format!("{e:#}")),
    }
    match Snapshot::of_pins(&args.pin_dir) {
        Ok(s) => return Ok(s.to_doc().only(Some(iface))),
        Err(e) => tried.push(format!("pins: {e:#}")),
    }
    match Snapshot::of_attached(iface) {
        Ok(s) => Ok(s.to_doc().only(Some(iface))),
        Err(e) => {
            tried.push(format!("kernel: {e:#}"));
            anyhow::bail!(
                "cannot read the counters of {iface}:\n  {}",
                tried.join("\n  ")
            )
        }
    }
}

fn counters(args: &guard::cli::CountersArgs) -> anyhow::Result<()> {
    for iface in &args.interfaces {
        let doc = counters_of(iface, args)?;
        match args.output {
            Output::Table => {
                println!("== {iface} egress");
                print!("{}", doc.to_table());
            }
            Output::Json => {
                let mut v = serde_json::to_value(&doc)?;
                v["interface"] = serde_json::Value::String(iface.clone());
                println!("{v}");
            }
        }
    }
    Ok(())
}

fn uninstall(pin_dir: &std::path::Path, interfaces: &[String], force: bool) -> anyhow::Result<()> {
    guard::preflight::check_capabilities()?;
    // Held while the pins go, so that no daemon starts on them half-way.
    let _lock = match guard::pins::try_lock(pin_dir) {
        Ok(lock) => lock,
        Err(pid) => {
            let who = pid.map_or_else(
                || "a running arp-guard".to_owned(),
                |p| format!("arp-guard pid {p}"),
            );
            if !force {
                anyhow::bail!(
                    "{who} holds --pin-dir {}: stop it first (uninstalling under it would take the guard \
                     away from a daemon that relies on it), or pass --force",
                    pin_dir.display()
                );
            }
            eprintln!("arp-guard: --force: removing the pins {who} holds");
            None
        }
    };
    for name in guard::pins::uninstall(pin_dir)? {
        println!("removed {}/{name}", pin_dir.display());
    }
    let names: Vec<String> = if interfaces.is_empty() {
        guard::datapath::interface_names()
    } else {
        interfaces.to_vec()
    };
    // One interface failing (gone meanwhile) does not stop the others.
    let mut failed = Vec::new();
    for iface in names {
        match guard::datapath::remove_netlink_filter(&iface) {
            Ok(true) => println!("removed the netlink filter from {iface}"),
            Ok(false) => {}
            Err(e) => failed.push(format!("{iface}: {e:#}")),
        }
    }
    if !failed.is_empty() {
        anyhow::bail!("could not check every interface: {}", failed.join("; "));
    }
    Ok(())
}

fn validate(path: &std::path::Path, max_bytes: u64, node: Option<String>) -> anyhow::Result<()> {
    let file = ownership_file::load(path, max_bytes)?;
    let node = preflight::node_name(node)?;
    let table = guard::addrs::AddrTable::default();
    let v = view::compute(&view::Inputs {
        node: &node,
        file: Some(&file),
        lb_ips_from: &[],
        guarded: &[],
        addrs: &table,
        cluster: None,
    });
    println!(
        "{}: valid, {} IPs; as seen from node {node}:",
        path.display(),
        file.ips.len()
    );
    for (ip, e) in &file.ips {
        let state = match ip {
            std::net::IpAddr::V4(v4) => v.lb.get(v4).map_or("?", |l| l.state.as_str()),
            std::net::IpAddr::V6(_) => "not enforced (IPv6)",
        };
        println!(
            "  line {:<4} {:<40} owner={:<20} {state}",
            e.line,
            ip,
            e.owner.as_deref().unwrap_or("-")
        );
    }
    Ok(())
}
