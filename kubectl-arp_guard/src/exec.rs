//! Running the guard's own command in its Pod (pods/exec over the API
//! server: WebSocket, `v5.channel.k8s.io` or `v4.channel.k8s.io`), behind
//! [`Runner`] so that the fan-out and the merge are tested without one.

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use kube::{api::AttachParams, Api};
use tokio::io::AsyncReadExt as _;

use super::cluster::GuardPod;

/// Longest output read from one guard: a node's brief documents are a few
/// kB, a whole status about 200 bytes per LB IP (32 MiB: some 150,000). More
/// is not read: that node's answer is an error saying so.
pub const MAX_OUTPUT: usize = 32 << 20;

/// What a command in a guard's Pod printed, and how it exited.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOut {
    pub code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// Why a command could not be run in a Pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecError {
    /// The user may not exec into the guard Pods (the API's message).
    Forbidden(String),
    /// Anything else: the Pod went away, the kubelet did not answer...
    Failed(String),
}

/// Runs `argv` in a guard's Pod.
pub trait Runner: Send + Sync {
    fn run<'a>(
        &'a self,
        pod: &'a GuardPod,
        argv: &'a [String],
    ) -> BoxFuture<'a, Result<ExecOut, ExecError>>;
}

/// The real one: pods/exec through the API server.
pub struct KubeRunner {
    pub pods: Api<Pod>,
}

impl Runner for KubeRunner {
    fn run<'a>(
        &'a self,
        pod: &'a GuardPod,
        argv: &'a [String],
    ) -> BoxFuture<'a, Result<ExecOut, ExecError>> {
        Box::pin(exec(&self.pods, pod, argv))
    }
}

async fn exec(pods: &Api<Pod>, pod: &GuardPod, argv: &[String]) -> Result<ExecOut, ExecError> {
    let ap = AttachParams::default()
        .container(pod.container.clone())
        .stdout(true)
        .stderr(true);
    let mut p = match pods.exec(&pod.name, argv.iter().cloned(), &ap).await {
        Ok(p) => p,
        Err(kube::Error::Api(s)) if s.code == 403 => {
            return Err(ExecError::Forbidden(s.message.clone()))
        }
        Err(e) => return Err(ExecError::Failed(format!("exec: {e}"))),
    };
    // The status comes once the output is read to its end: both are read
    // together (the process's pipes hold a few kB).
    let status = p.take_status();
    let (stdout, stderr) = (p.stdout(), p.stderr());
    let read = |r: Option<tokio::io::ReadHalf<tokio::io::SimplexStream>>, what| async move {
        match r {
            Some(r) => read_bounded(r, MAX_OUTPUT, what).await,
            None => Ok(Vec::new()),
        }
    };
    let status = async move {
        Ok(match status {
            Some(s) => s.await,
            None => None,
        })
    };
    let (stdout, stderr, status) =
        tokio::try_join!(read(stdout, "output"), read(stderr, "error output"), status)?;
    let _ = p.join().await;
    let code = match status {
        None => {
            return Err(ExecError::Failed(
                "the exec ended without an exit status".into(),
            ))
        }
        Some(s) => exit_code(&s),
    };
    Ok(ExecOut {
        code,
        stdout,
        stderr,
    })
}

/// All of `r`, up to `max` bytes; more is an error naming `what` (and the
/// caller's dropping the exec ends it at once: the command would otherwise
/// block on a pipe no one reads, until the node's deadline).
async fn read_bounded(
    r: impl tokio::io::AsyncRead + Unpin,
    max: usize,
    what: &str,
) -> Result<Vec<u8>, ExecError> {
    let mut out = Vec::new();
    let _ = r.take(max as u64 + 1).read_to_end(&mut out).await;
    if out.len() > max {
        return Err(ExecError::Failed(format!(
            "its {what} is larger than {} MiB: not read",
            max >> 20
        )));
    }
    Ok(out)
}

/// The exit code a `metav1.Status` of the error channel carries: 0 for
/// Success, the `ExitCode` cause of a NonZeroExitCode, else -1.
pub fn exit_code(s: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Status) -> i32 {
    if s.status.as_deref() == Some("Success") {
        return 0;
    }
    let causes = s.details.as_ref().and_then(|d| d.causes.as_ref());
    (causes.into_iter().flatten())
        .find(|c| c.reason.as_deref() == Some("ExitCode"))
        .and_then(|c| c.message.as_deref()?.parse().ok())
        .unwrap_or(-1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An output up to the bound is read whole; one byte more is an error
    /// that says so, read no further (the writer is still writing).
    #[tokio::test]
    async fn an_output_over_the_bound_is_an_error_not_a_cut_document() {
        use tokio::io::AsyncWriteExt as _;
        let max = 2 << 20;
        let (mut w, r) = tokio::io::duplex(64 << 10);
        let writer = tokio::spawn(async move {
            let _ = w.write_all(&vec![b'x'; max]).await;
        });
        assert_eq!(read_bounded(r, max, "output").await.unwrap().len(), max);
        writer.await.unwrap();
        let (mut w, r) = tokio::io::duplex(64 << 10);
        // Never ends on its own: the reader must stop.
        tokio::spawn(async move { while w.write_all(&[b'x'; 4096]).await.is_ok() {} });
        let e = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            read_bounded(r, max, "output"),
        )
        .await
        .expect("stops at the bound");
        assert_eq!(
            e,
            Err(ExecError::Failed(
                "its output is larger than 2 MiB: not read".into()
            ))
        );
    }

    #[test]
    fn the_exit_code_is_read_from_the_error_channel_s_status() {
        let s = |v: serde_json::Value| serde_json::from_value(v).unwrap();
        assert_eq!(
            exit_code(&s(serde_json::json!({"metadata": {}, "status": "Success"}))),
            0
        );
        let failed = serde_json::json!({
            "metadata": {}, "status": "Failure", "reason": "NonZeroExitCode",
            "message": "command terminated with non-zero exit code: error executing command [arp-guard], exit code 1",
            "details": {"causes": [{"reason": "ExitCode", "message": "1"}]}
        });
        assert_eq!(exit_code(&s(failed)), 1);
        let other = serde_json::json!({"metadata": {}, "status": "Failure", "reason": "InternalError", "message": "boom"});
        assert_eq!(exit_code(&s(other)), -1);
    }
}
