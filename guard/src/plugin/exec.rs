//! Running the guard's own command in its Pod (pods/exec over the API
//! server: WebSocket, `v5.channel.k8s.io` or `v4.channel.k8s.io`), behind
//! [`Runner`] so that the fan-out and the merge are tested without one.

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use kube::{api::AttachParams, Api};
use tokio::io::AsyncReadExt as _;

use super::cluster::GuardPod;

/// Longest output kept from one guard (a node's documents are a few kB;
/// more is cut and said so).
pub const MAX_OUTPUT: usize = 4 << 20;

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
    let read = |r: Option<tokio::io::ReadHalf<tokio::io::SimplexStream>>| async move {
        let mut out = Vec::new();
        if let Some(r) = r {
            let _ = r.take(MAX_OUTPUT as u64).read_to_end(&mut out).await;
        }
        out
    };
    let status = async move {
        match status {
            Some(s) => s.await,
            None => None,
        }
    };
    let (stdout, stderr, status) = tokio::join!(read(stdout), read(stderr), status);
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
