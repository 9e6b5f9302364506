//! The daemon's state in one JSON document, written to `--status-file`
//! whenever it changes (atomically: write, then rename), so that an operator
//! (`kubectl exec ... cat`) or a probe can see what the guard is doing.

use std::path::Path;

use crate::telemetry::status::DaemonStatus;

/// Write `status` to `path` if it differs from `last`; remembers what was written.
pub fn publish(path: &Path, status: &DaemonStatus, last: &mut Option<DaemonStatus>) {
    if last.as_ref() == Some(status) {
        return;
    }
    let tmp = path.with_extension("tmp");
    let text = match serde_json::to_string_pretty(status) {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(error = %e, "cannot encode the status");
            return;
        }
    };
    match std::fs::write(&tmp, text + "\n").and_then(|()| std::fs::rename(&tmp, path)) {
        Ok(()) => *last = Some(status.clone()),
        Err(e) => {
            tracing::warn!(file = %path.display(), error = %e, "cannot write the status file")
        }
    }
}
