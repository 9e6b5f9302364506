//! The `arp-guard` binary: parse the command line, set up logging and a
//! runtime, hand over to `guard::commands`.
#![deny(clippy::unwrap_used, clippy::expect_used)]

use std::{future::Future, process::ExitCode, time::Duration};

use clap::Parser as _;
use guard::{
    cli::{Cli, Command, LogFormat},
    commands,
};
use guard_wire::cli::{end_quietly_on_a_closed_pipe, exit};
use tracing_subscriber::{layer::SubscriberExt as _, util::SubscriberInitExt as _};

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
    // kube's client logs every failed request at ERROR ("failed with error
    // client error (Connect)", once per retry, saying nothing of the cause);
    // the feed classifies failures and logs each cause once, with what to
    // fix (sources/cluster/cause.rs, problems.rs). Its other lines stay as
    // asked.
    let quiet = tracing_subscriber::filter::filter_fn(|m| {
        !(m.target() == "kube_client::client::builder" && *m.level() == tracing::Level::ERROR)
    });
    match cli.log_format {
        LogFormat::Text => builder.finish().with(quiet).init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .finish()
            .with(quiet)
            .init(),
    }
}

/// The daemon on two worker threads (the loop, and the API beside it).
fn daemon(f: impl Future<Output = anyhow::Result<()>>) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let r = rt.block_on(f);
    // Exit even if some blocking task (a stuck read) never returns.
    rt.shutdown_timeout(Duration::from_secs(2));
    r
}

/// A one-off command on the calling thread.
fn oneshot(f: impl Future<Output = anyhow::Result<()>>) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let r = rt.block_on(f);
    rt.shutdown_timeout(Duration::from_millis(100));
    r
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Not the daemon: a client closing its connection must never end it.
    if !matches!(cli.command, Command::Run(_)) {
        end_quietly_on_a_closed_pipe();
    }
    init_logging(&cli);
    let result = match &cli.command {
        Command::Run(args) => daemon(commands::run(args)),
        Command::Counters(args) => oneshot(commands::counters(args)),
        Command::Validate(args) => commands::validate(args),
        Command::Uninstall(args) => oneshot(commands::uninstall(args)),
        Command::Status(args) => oneshot(commands::status(args)),
        Command::Explain(args) => oneshot(commands::explain(args)),
        Command::Events(args) => oneshot(commands::events(args)),
        Command::Responders(args) => oneshot(commands::responders(args)),
        Command::Clients(args) => oneshot(commands::clients(args)),
        Command::Probe(args) => oneshot(commands::probe(args)),
        Command::Doctor(args) => oneshot(commands::doctor(args)),
        Command::Reference(args) => guard::reference::write(&args.out),
    };
    exit(result, "arp-guard")
}
