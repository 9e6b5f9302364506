//! Asking every guard: the same command in each guard Pod, `parallel` at
//! a time, each within its own deadline and all within the command's;
//! every node gets an answer or the reason it has none (no guard Pod, not
//! running, no answer in time, the command failed). None is silently
//! missing.

use std::{
    collections::BTreeMap,
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use futures::{stream, StreamExt as _};
use serde::Serialize;

use super::{
    cluster::{Denied, GuardPod},
    exec::{ExecError, ExecOut, Runner},
};

/// A node to ask, and its guard Pod if it has one.
#[derive(Debug, Clone)]
pub struct Target {
    pub node: String,
    pub pod: Option<GuardPod>,
}

/// The nodes to ask: `only` (--node), else every node with a guard Pod
/// and every node of `nodes` without one.
pub fn targets(
    pods: &BTreeMap<String, GuardPod>,
    nodes: Option<&std::collections::BTreeSet<String>>,
    only: Option<&str>,
) -> Vec<Target> {
    let mut names: std::collections::BTreeSet<&str> = pods.keys().map(String::as_str).collect();
    names.extend(nodes.into_iter().flatten().map(String::as_str));
    if let Some(n) = only {
        names = std::iter::once(n).collect();
    }
    (names.into_iter())
        .map(|n| Target {
            node: n.to_owned(),
            pod: pods.get(n).cloned(),
        })
        .collect()
}

/// Why a node has no answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Unanswered {
    /// No guard Pod on the node (the DaemonSet does not run there, or its
    /// Pod is gone).
    NoGuardPod,
    /// Its container is not running (waiting reason or phase).
    NotRunning { why: String },
    /// No answer within the deadline.
    Timeout { after_s: u64 },
    /// No answer before the command's own deadline (`--timeout`): asked
    /// too late, or still answering then.
    Deadline { after_s: u64 },
    /// The exec failed (the Pod went away, the kubelet did not answer).
    ExecFailed { error: String },
    /// The guard's command could not run (exit 2: its daemon did not
    /// answer, ...), with what it said.
    CommandFailed { code: i32, stderr: String },
    /// It printed something that is not the document asked for (an older
    /// guard that lacks the command, ...).
    Unreadable { error: String },
    /// Its guard runs but has no ArpGuardNode (yet): starting, a guard
    /// without the API or `--node-report-interval 0`, an older version, or
    /// its writes refused (its log says why).
    NoReport,
}

impl std::fmt::Display for Unanswered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unanswered::NoGuardPod => write!(f, "no guard Pod on this node"),
            Unanswered::NotRunning { why } => write!(f, "guard not running ({why})"),
            Unanswered::Timeout { after_s } => {
                write!(f, "not answering (no answer within {after_s}s)")
            }
            Unanswered::Deadline { after_s } => {
                write!(f, "no answer before the command's --timeout ({after_s}s)")
            }
            Unanswered::ExecFailed { error } => write!(f, "could not be asked: {error}"),
            Unanswered::CommandFailed { code, stderr } => {
                write!(
                    f,
                    "its command failed (exit {code}): {}",
                    guard_wire::text::clip(stderr.trim(), 300)
                )
            }
            Unanswered::Unreadable { error } => write!(f, "unreadable answer: {error}"),
            Unanswered::NoReport => write!(
                f,
                "no ArpGuardNode from its guard (starting, an older version, or its writes refused: see its log; --live asks it)"
            ),
        }
    }
}

/// One node's answer.
#[derive(Debug, Clone)]
pub struct NodeAnswer<T> {
    pub node: String,
    /// Its guard Pod is Ready (None: no Pod).
    pub ready: Option<bool>,
    /// The document and the command's exit code (0, or 1 for a finding).
    pub answer: Result<(T, i32), Unanswered>,
}

/// How the guards are asked.
pub struct Plan<'a> {
    pub runner: &'a dyn Runner,
    /// The guards' namespace (named in a 403).
    pub namespace: &'a str,
    pub parallel: usize,
    /// One guard's deadline.
    pub timeout: Duration,
    /// The command's, from `since`, for every ask it makes: at 5,000 nodes
    /// of hung guards, `parallel` at a time, each node's deadline alone
    /// would be half an hour.
    pub total: Duration,
    pub since: tokio::time::Instant,
}

impl Plan<'_> {
    /// Run `argv` on every target and read each output with `read`, in the
    /// targets' order. A 403 ends it (the user may not exec): the guards not
    /// asked yet are not. What has not answered by the command's deadline
    /// is listed as such.
    pub async fn ask<T>(
        &self,
        targets: Vec<Target>,
        argv: &[String],
        read: fn(&[u8]) -> Result<T, String>,
    ) -> Result<Vec<NodeAnswer<T>>, Denied> {
        // An absurd --timeout is no deadline (rather than an overflow).
        let deadline = (self.since.checked_add(self.total))
            .unwrap_or_else(|| self.since + Duration::from_secs(86_400 * 365));
        let denied = AtomicBool::new(false);
        let late = || {
            Ok(Err(Unanswered::Deadline {
                after_s: self.total.as_secs(),
            }))
        };
        let (deadline, denied, late) = (&deadline, &denied, &late);
        let asked = stream::iter(targets.into_iter().enumerate())
            .map(|(i, t)| async move {
                if denied.load(Ordering::Relaxed) {
                    let error = "not asked: exec is forbidden".into();
                    return (i, Ok(Err(Unanswered::ExecFailed { error })), t);
                }
                // A node without a running guard is said as such, late or not
                // (`one` answers it at once, without asking).
                let to_ask = t.pod.as_ref().is_some_and(|p| p.running);
                if to_ask && tokio::time::Instant::now() >= *deadline {
                    return (i, late(), t);
                }
                let r = tokio::time::timeout_at(*deadline, self.one(&t, argv, read))
                    .await
                    .unwrap_or_else(|_| late());
                if matches!(r, Err(ExecError::Forbidden(_))) {
                    denied.store(true, Ordering::Relaxed);
                }
                (i, r, t)
            })
            .buffer_unordered(self.parallel.max(1));
        let mut all: Vec<_> = asked.collect().await;
        all.sort_by_key(|(i, _, _)| *i);
        let mut out = Vec::with_capacity(all.len());
        for (_, r, t) in all {
            // A 403 means the user may not exec into any guard Pod.
            let answer = match r {
                Err(ExecError::Forbidden(message)) => {
                    return Err(Denied {
                        verb: "create",
                        resource: "pods/exec",
                        scope: format!("namespace {}", self.namespace),
                        message,
                    })
                }
                Err(ExecError::Failed(error)) => Err(Unanswered::ExecFailed { error }),
                Ok(a) => a,
            };
            out.push(NodeAnswer {
                node: t.node,
                ready: t.pod.as_ref().map(|p| p.ready),
                answer,
            });
        }
        Ok(out)
    }

    async fn one<T>(
        &self,
        t: &Target,
        argv: &[String],
        read: fn(&[u8]) -> Result<T, String>,
    ) -> Result<Result<(T, i32), Unanswered>, ExecError> {
        let Some(pod) = &t.pod else {
            return Ok(Err(Unanswered::NoGuardPod));
        };
        if !pod.running {
            let why = pod.why.clone().unwrap_or_else(|| "not running".into());
            return Ok(Err(Unanswered::NotRunning { why }));
        }
        let out = match tokio::time::timeout(self.timeout, self.runner.run(pod, argv)).await {
            Err(_) => {
                let after_s = self.timeout.as_secs();
                return Ok(Err(Unanswered::Timeout { after_s }));
            }
            Ok(r) => r?,
        };
        Ok(judge(&out, read))
    }
}

/// A guard command's output: exit 0 or 1 (a finding) with its document,
/// anything else a failure with what it said.
fn judge<T>(out: &ExecOut, read: fn(&[u8]) -> Result<T, String>) -> Result<(T, i32), Unanswered> {
    if !matches!(out.code, 0 | 1) {
        return Err(Unanswered::CommandFailed {
            code: out.code,
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    match read(&out.stdout) {
        Ok(t) => Ok((t, out.code)),
        Err(error) => Err(Unanswered::Unreadable { error }),
    }
}

impl Unanswered {
    /// A guard that should have answered did not (a finding). A node
    /// without a guard Pod is listed, not counted: the DaemonSet may not be
    /// meant to run there (a nodeSelector, Windows or virtual nodes).
    pub fn is_finding(&self) -> bool {
        !matches!(self, Unanswered::NoGuardPod)
    }
}

/// The guards that should have answered and did not (findings). When none
/// answered (every node asked, or the one `--node` named), the command
/// could not ask: an error naming why (exit 2), not a finding.
pub fn missing<T>(answers: &[NodeAnswer<T>]) -> anyhow::Result<usize> {
    missing_as(answers, "answered")
}

/// [`missing`], the guards having `said` (answered, reported) or not.
pub fn missing_as<T>(answers: &[NodeAnswer<T>], said: &str) -> anyhow::Result<usize> {
    const NAMED: usize = 5;
    if answers.is_empty() {
        anyhow::bail!("no node to ask: no guard Pod matches the selector in the namespace, and no Node was listed");
    }
    if !answers.iter().any(|a| a.answer.is_ok()) {
        let why: Vec<String> = (answers.iter().take(NAMED))
            .filter_map(|a| a.answer.as_ref().err().map(|u| format!("{}: {u}", a.node)))
            .collect();
        let more = answers.len().saturating_sub(NAMED);
        let more = if more > 0 {
            format!("; {more} more")
        } else {
            String::new()
        };
        anyhow::bail!("no guard {said} ({}{more})", why.join("; "));
    }
    Ok((answers.iter())
        .filter(|a| a.answer.as_ref().err().is_some_and(Unanswered::is_finding))
        .count())
}

/// A JSON document.
pub fn json<T: serde::de::DeserializeOwned>(b: &[u8]) -> Result<T, String> {
    serde_json::from_slice(b).map_err(|e| format!("not the JSON this plugin reads: {e}"))
}

/// Text, as printed.
pub fn text(b: &[u8]) -> Result<String, String> {
    Ok(String::from_utf8_lossy(b).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::future::BoxFuture;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn pod(node: &str, running: bool) -> GuardPod {
        GuardPod {
            name: format!("arp-guard-{node}"),
            node: node.into(),
            ready: running,
            running,
            why: (!running).then(|| "CrashLoopBackOff".into()),
            image: None,
            container: "arp-guard".into(),
        }
    }

    /// Answers by node: `hang` never, `deny` with a 403, `fail` exits 2,
    /// the others print their node's name as JSON. Counts how many ran at
    /// once.
    struct Fake {
        now: AtomicUsize,
        most: AtomicUsize,
        runs: AtomicUsize,
    }

    impl Runner for Fake {
        fn run<'a>(
            &'a self,
            pod: &'a GuardPod,
            _: &'a [String],
        ) -> BoxFuture<'a, Result<ExecOut, ExecError>> {
            Box::pin(async move {
                self.runs.fetch_add(1, Ordering::SeqCst);
                let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
                self.most.fetch_max(n, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
                self.now.fetch_sub(1, Ordering::SeqCst);
                match pod.node.as_str() {
                    "hang" => std::future::pending().await,
                    "deny" => Err(ExecError::Forbidden(
                        "cannot create resource \"pods/exec\"".into(),
                    )),
                    "fail" => Ok(ExecOut {
                        code: 2,
                        stdout: vec![],
                        stderr: b"no daemon answers".to_vec(),
                    }),
                    n => Ok(ExecOut {
                        code: 0,
                        stdout: format!("\"{n}\"").into_bytes(),
                        stderr: vec![],
                    }),
                }
            })
        }
    }

    /// Asking with `f`: `parallel` at a time, each within `timeout`, all
    /// within `total` from now.
    fn plan(f: &Fake, parallel: usize, timeout: Duration, total: Duration) -> Plan<'_> {
        Plan {
            runner: f,
            namespace: "arp-guard",
            parallel,
            timeout,
            total,
            since: tokio::time::Instant::now(),
        }
    }

    fn fake() -> Fake {
        Fake {
            now: AtomicUsize::new(0),
            most: AtomicUsize::new(0),
            runs: AtomicUsize::new(0),
        }
    }

    /// Every node is in the answer, in order, with its answer or why not;
    /// a hung guard costs the deadline, not the command; no more than
    /// `parallel` run at once.
    #[tokio::test]
    async fn every_node_answers_or_says_why_within_the_deadline() {
        let mut pods: BTreeMap<String, GuardPod> = ["a", "b", "c", "d", "fail", "hang"]
            .iter()
            .map(|n| (n.to_string(), pod(n, true)))
            .collect();
        pods.insert("down".into(), pod("down", false));
        let nodes = ["a", "b", "bare"].iter().map(|s| s.to_string()).collect();
        let f = fake();
        let plan = plan(&f, 2, Duration::from_millis(500), Duration::from_secs(60));
        let t = std::time::Instant::now();
        let got = plan
            .ask(targets(&pods, Some(&nodes), None), &[], json::<String>)
            .await
            .unwrap();
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        assert_eq!(f.most.load(Ordering::SeqCst), 2);
        let by: BTreeMap<&str, &Result<(String, i32), Unanswered>> =
            got.iter().map(|a| (a.node.as_str(), &a.answer)).collect();
        assert_eq!(by.len(), 8, "{by:?}");
        assert_eq!(by["a"], &Ok(("a".to_owned(), 0)));
        assert_eq!(by["bare"], &Err(Unanswered::NoGuardPod));
        assert_eq!(
            by["down"],
            &Err(Unanswered::NotRunning {
                why: "CrashLoopBackOff".into()
            })
        );
        assert_eq!(by["hang"], &Err(Unanswered::Timeout { after_s: 0 }));
        assert!(matches!(
            by["fail"],
            Err(Unanswered::CommandFailed { code: 2, .. })
        ));
        let only = plan
            .ask(
                targets(&pods, Some(&nodes), Some("zz")),
                &[],
                json::<String>,
            )
            .await
            .unwrap();
        assert_eq!(only.len(), 1);
        assert_eq!(only[0].answer, Err(Unanswered::NoGuardPod));
        // Four of eight could not answer: three are findings (down, hang,
        // fail), the node without a guard Pod is not; one alone without an
        // answer (a --node) is a command that could not ask.
        assert_eq!(missing(&got).unwrap(), 3);
        let e = missing(&only).unwrap_err().to_string();
        assert!(e.contains("no guard answered (zz: no guard Pod"), "{e}");
        assert!(missing::<String>(&[]).is_err());
    }

    /// A 403 ends the command with what to grant, and the guards not asked
    /// yet are not asked (each would be one more denied request).
    #[tokio::test]
    async fn a_forbidden_exec_ends_the_command_with_what_to_grant() {
        let pods = ["deny", "e", "f", "g"]
            .iter()
            .map(|n| (n.to_string(), pod(n, true)))
            .collect();
        let f = fake();
        let plan = plan(&f, 1, Duration::from_secs(5), Duration::from_secs(60));
        let e = plan
            .ask(targets(&pods, None, None), &[], json::<String>)
            .await
            .unwrap_err();
        let text = e.to_string();
        assert!(text.contains("`create` on pods/exec"), "{text}");
        assert!(text.contains("arp-guard-operator"), "{text}");
        assert_eq!(f.runs.load(Ordering::SeqCst), 1, "no exec after the 403");
    }

    /// Hung guards, one at a time, each with a long deadline of its own:
    /// the command's deadline ends the asking, and every node is still
    /// listed, each with why (those not asked by then too).
    #[tokio::test]
    async fn the_commands_deadline_bounds_a_cluster_of_hung_guards() {
        let mut pods: BTreeMap<String, GuardPod> = [
            ("a".to_string(), pod("a", true)),
            ("z-down".to_string(), pod("z-down", false)),
        ]
        .into_iter()
        .collect();
        for i in 0..5 {
            let mut p = pod("hang", true);
            p.name = format!("arp-guard-hang-{i}");
            pods.insert(format!("hang-{i}"), p);
        }
        let f = fake();
        let plan = plan(&f, 1, Duration::from_secs(30), Duration::from_millis(300));
        let t = std::time::Instant::now();
        let mut got = plan
            .ask(targets(&pods, None, None), &[], json::<String>)
            .await
            .unwrap();
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        assert_eq!(got.len(), 7);
        assert_eq!(got[0].answer, Ok(("a".to_owned(), 0)), "asked in time");
        let down = got.pop().unwrap();
        assert!(
            matches!(down.answer, Err(Unanswered::NotRunning { .. })),
            "a guard not running is said as such after the deadline too: {:?}",
            down.answer
        );
        for a in &got[1..] {
            assert_eq!(
                a.answer,
                Err(Unanswered::Deadline { after_s: 0 }),
                "{}",
                a.node
            );
        }
        assert_eq!(f.runs.load(Ordering::SeqCst), 2, "none asked after it");
        assert_eq!(missing(&got).unwrap(), 5, "each a finding");
        assert_eq!(down.node, "z-down");
    }
}
