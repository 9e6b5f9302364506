//! One `kubectl arp-guard` command, from its arguments to its exit: the
//! client (`connect`), what the API holds read once (`cluster`), the
//! guards asked (`fanout` over `exec`), the merge (`status`, `views`) and
//! the output.

use std::{net::IpAddr, time::Duration};

use anyhow::{Context as _, Result};
use guard_wire::{
    api::StatusDoc,
    cli::Found,
    clients::ClientsDoc,
    plugin_cli::{Format, PluginCli, PluginCommand},
};
use kube::Api;

use crate::{
    cluster::{ClusterReads, Reader},
    exec, fanout,
    fanout::{NodeAnswer, Plan, Target, Unanswered},
    node_view::{self, NodeView},
    output, status, status_table, views,
};

/// Run one `kubectl arp-guard` command.
pub async fn run(cli: PluginCli) -> Result<()> {
    let c = &cli.conn;
    let client = crate::connect::client(c.kubeconfig.as_deref(), c.context.as_deref()).await?;
    let reader = Reader {
        client: &client,
        namespace: &c.namespace,
        selector: &c.selector,
        container: &c.container,
        timeout: c.request_timeout,
    };
    let runner = exec::KubeRunner {
        pods: Api::namespaced(client.clone(), &c.namespace),
    };
    let plan = Plan {
        runner: &runner,
        namespace: &c.namespace,
        parallel: c.parallel as usize,
        timeout: c.node_timeout,
        total: c.timeout,
        since: tokio::time::Instant::now(),
    };
    let ask = Ask {
        reader: &reader,
        plan: &plan,
        node: c.node.as_deref(),
        format: c.output,
        live: c.live,
    };
    match &cli.command {
        PluginCommand::Status { ip } => ask.status(*ip).await,
        PluginCommand::Clients { ip } => ask.clients(*ip).await,
        PluginCommand::Responders { ip } => ask.responders(*ip).await,
        PluginCommand::Explain { ip } => ask.text(&["explain".into(), ip.to_string()]).await,
        PluginCommand::Doctor { all_nodes } => {
            if c.node.is_none() && !all_nodes {
                anyhow::bail!("say which node: --node NAME, or --all-nodes");
            }
            ask.text(&["doctor".into()]).await
        }
        PluginCommand::Events { ip, since } => ask.events(*ip, *since).await,
    }
}

/// One command's means: the API reads, the guards' fan-out, the output.
struct Ask<'a> {
    reader: &'a Reader<'a>,
    plan: &'a Plan<'a>,
    node: Option<&'a str>,
    format: Format,
    /// Ask the guards now (pods/exec) instead of reading their objects.
    live: bool,
}

/// The guard's own command line: `arp-guard ARGS -o json` (or the table).
fn argv(args: &[String], json: bool) -> Vec<String> {
    let mut v = vec!["arp-guard".to_owned()];
    v.extend(args.iter().cloned());
    if json {
        v.extend(["-o".to_owned(), "json".to_owned()]);
    }
    v
}

fn ip_arg(ip: Option<IpAddr>) -> Vec<String> {
    ip.map(|ip| ip.to_string()).into_iter().collect()
}

impl Ask<'_> {
    /// The nodes to ask (the Pods and the Nodes, read once).
    async fn targets(&self) -> Result<(Vec<Target>, ClusterReads)> {
        let mut reads = ClusterReads {
            pods: self.reader.pods().await?,
            ..Default::default()
        };
        self.read_nodes(&mut reads).await;
        let t = fanout::targets(&reads.pods, reads.nodes.as_ref(), self.node);
        Ok((t, reads))
    }

    /// The cluster's Nodes into `reads`; with --node they are not read
    /// (nor said unread).
    async fn read_nodes(&self, reads: &mut ClusterReads) {
        if self.node.is_some() {
            return;
        }
        match self.reader.nodes().await {
            Ok(n) => reads.nodes = Some(n),
            Err(why) => {
                // Said once, whatever the view: a node without a guard Pod
                // would otherwise be missing without a word.
                eprintln!("note: the cluster's Nodes could not be read ({why}): nodes without a guard Pod are not listed");
                reads.nodes_unread = Some(why);
            }
        }
    }

    fn print<T: serde::Serialize>(&self, doc: &T, table: impl FnOnce() -> String) -> Result<()> {
        match output::document(self.format, doc)? {
            Some(text) => print!("{text}"),
            None => print!("{}", table()),
        }
        Ok(())
    }

    /// The nodes' views from the API: every node's ArpGuardNode (one list),
    /// with its guard Pod's readiness (a Table); a node with a Pod and no
    /// object, or with neither, says so.
    async fn views_from_api(&self) -> Result<(Vec<NodeView>, ClusterReads)> {
        let mut reads = ClusterReads {
            pods: self.reader.pods_ready().await?,
            ..Default::default()
        };
        self.read_nodes(&mut reads).await;
        let reports = self.reader.reports().await?;
        let mut names: std::collections::BTreeSet<String> = reads.pods.keys().cloned().collect();
        names.extend(reads.nodes.iter().flatten().cloned());
        names.extend(reports.iter().map(|r| r.metadata.name.clone()));
        if let Some(n) = self.node {
            names = std::iter::once(n.to_owned()).collect();
        }
        let views = (names.into_iter())
            .map(|n| {
                let ready = reads.pods.get(&n).map(|p| p.ready);
                match reports.iter().find(|r| r.metadata.name == n) {
                    Some(r) => node_view::of_report(r, ready),
                    None => NodeView {
                        unanswered: Some(match reads.pods.get(&n) {
                            None => Unanswered::NoGuardPod,
                            Some(p) if !p.running => Unanswered::NotRunning {
                                why: p.why.clone().unwrap_or_default(),
                            },
                            Some(_) => Unanswered::NoReport,
                        }),
                        node: n,
                        ready,
                        ..Default::default()
                    },
                }
            })
            .collect();
        Ok((views, reads))
    }

    /// The guards that did not report (findings); an error when none did.
    fn unreported(views: &[NodeView]) -> Result<usize> {
        let answers: Vec<NodeAnswer<()>> = (views.iter())
            .map(|v| NodeAnswer {
                node: v.node.clone(),
                ready: v.ready,
                answer: v.unanswered.clone().map_or(Ok(((), 0)), Err),
            })
            .collect();
        fanout::missing_as(&answers, "reported")
    }

    async fn status(&self, ip: Option<IpAddr>) -> Result<()> {
        if !self.live {
            let (views, mut reads) = self.views_from_api().await?;
            reads.services = self.reader.services().await?;
            reads.events = self.reader.events(Duration::from_secs(3600)).await?;
            let s = status::merge(&reads, &views, None, ip, status::Source::Api);
            self.print_status(&s)?;
            Self::unreported(&views)?;
            return Found::if_any(s.findings(), "finding(s), listed above");
        }
        let (targets, mut reads) = self.targets().await?;
        reads.records = self.reader.records().await?;
        reads.services = self.reader.services().await?;
        reads.events = self.reader.events(Duration::from_secs(3600)).await?;
        let mut args = vec!["status".to_owned(), "--brief".to_owned()];
        args.extend(ip_arg(ip));
        let answers = self
            .plan
            .ask(targets, &argv(&args, true), fanout::json::<StatusDoc>)
            .await?;
        // An LB IP whose owner no brief answer names (its owner's guard did
        // not answer): one guard that answered is asked for its whole view.
        let named = |ip: &IpAddr| {
            (answers.iter())
                .filter_map(|a| a.answer.as_ref().ok())
                .any(|(d, _)| d.ips.iter().any(|r| r.ip == *ip && r.entry.owner.is_some()))
        };
        let unnamed = (reads.services.keys())
            .filter(|i| ip.is_none_or(|ip| ip == **i))
            .filter(|i| !named(i))
            .count();
        let reference = match (unnamed > 0, answers.iter().find(|a| a.answer.is_ok())) {
            (true, Some(a)) => {
                let t = vec![Target {
                    node: a.node.clone(),
                    pod: reads.pods.get(&a.node).cloned(),
                }];
                let mut args = vec!["status".to_owned()];
                args.extend(ip_arg(ip));
                let full = self
                    .plan
                    .ask(t, &argv(&args, true), fanout::json::<StatusDoc>)
                    .await?;
                full.into_iter()
                    .next()
                    .and_then(|a| a.answer.ok())
                    .map(|(d, _)| d)
            }
            _ => None,
        };
        let views: Vec<NodeView> = (answers.iter())
            .map(|a| node_view::of_answer(a, &reads.records))
            .collect();
        let reference = reference.map(|d| {
            let mut v = NodeView::default();
            v.absorb(&d, &Default::default());
            v
        });
        let s = status::merge(&reads, &views, reference.as_ref(), ip, status::Source::Live);
        self.print_status(&s)?;
        fanout::missing(&answers)?;
        Found::if_any(s.findings(), "finding(s), listed above")
    }

    fn print_status(&self, s: &status::ClusterStatus) -> Result<()> {
        let now = jiff::Timestamp::now().as_second().max(0) as u64;
        let wide = self.format == Format::Wide;
        self.print(s, || status_table::table(s, wide, now))
    }

    async fn clients(&self, ip: Option<IpAddr>) -> Result<()> {
        if !self.live {
            let (views, _) = self.views_from_api().await?;
            let rows = views::client_counts(&views, ip);
            let stale: usize = rows.iter().map(|r| r.stale).sum();
            self.print(&rows, || views::client_counts_table(&rows, &views))?;
            let missing = Self::unreported(&views)?;
            return Found::if_any(stale + missing, "stale clients or guards without a report");
        }
        let (targets, _) = self.targets().await?;
        let mut args = vec!["clients".to_owned()];
        args.extend(ip_arg(ip));
        let answers = self
            .plan
            .ask(targets, &argv(&args, true), fanout::json::<ClientsDoc>)
            .await?;
        let (table, stale) = views::clients_table(&answers);
        self.print(&views::docs(&answers), || table)?;
        let missing = fanout::missing(&answers)?;
        Found::if_any(stale + missing, "stale clients or guards without an answer")
    }

    async fn responders(&self, ip: Option<IpAddr>) -> Result<()> {
        if !self.live {
            let (views, _) = self.views_from_api().await?;
            let rows = views::conflicts(&views, ip);
            self.print(&rows, || views::conflicts_table(&rows, &views))?;
            let missing = Self::unreported(&views)?;
            return Found::if_any(rows.len() + missing, "conflicts or guards without a report");
        }
        let (targets, _) = self.targets().await?;
        let mut args = vec!["responders".to_owned()];
        args.extend(ip_arg(ip));
        let read = fanout::json::<views::ResponderDoc>;
        let answers = self.plan.ask(targets, &argv(&args, true), read).await?;
        let (table, conflicts) = views::responders_table(&answers);
        self.print(&views::docs(&answers), || table)?;
        let missing = fanout::missing(&answers)?;
        Found::if_any(conflicts + missing, "conflicts or guards without an answer")
    }

    /// A node command whose table is its own text (`explain`, `doctor`):
    /// labelled by node in the table formats, the node's JSON otherwise.
    async fn text(&self, args: &[String]) -> Result<()> {
        let (targets, _) = self.targets().await?;
        let table = matches!(self.format, Format::Table | Format::Wide);
        let (found, missing) = if table {
            let answers = self
                .plan
                .ask(targets, &argv(args, false), fanout::text)
                .await?;
            let (text, found) = views::labelled_text(&answers);
            print!("{text}");
            (found, fanout::missing(&answers)?)
        } else {
            let read = fanout::json::<serde_json::Value>;
            let answers = self.plan.ask(targets, &argv(args, true), read).await?;
            self.print(&views::docs(&answers), String::new)?;
            let found = (answers.iter())
                .filter(|a| matches!(a.answer, Ok((_, 1))))
                .count();
            (found, fanout::missing(&answers)?)
        };
        Found::if_any(found + missing, "nodes with a finding or without an answer")
    }

    async fn events(&self, ip: Option<IpAddr>, since: Duration) -> Result<()> {
        let mut events = self.reader.events(since).await?;
        if let Some(ip) = ip {
            let services = self.reader.services().await?;
            let svc = services
                .get(&ip)
                .with_context(|| format!("{ip} is no LoadBalancer Service's IP"))?;
            events.retain(|e| &e.service == svc);
        }
        if let Some(n) = self.node {
            events.retain(|e| e.node == n);
        }
        self.print(&events, || views::events_table(&events))?;
        let warnings = events.iter().filter(|e| e.kind == "Warning").count();
        Found::if_any(warnings, "Warning Events")
    }
}
