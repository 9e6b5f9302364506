//! Keeps the ownership file's content current: reload on change, reject bad
//! updates, keep the last good state in force.
//!
//! Reads never block anything: they are bounded (regular files only, up to a
//! size limit, opened non-blocking) and run on a thread of their own with a
//! deadline, one at a time, so even a file system that hangs in `read()`
//! (a stuck network mount) only delays reloads and is logged.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use notify::Watcher as _;
use tokio::sync::{mpsc, oneshot, watch};

use crate::ownership_file::{self, FileError, OwnershipFile};

/// How long one read may take before it is reported as hanging.
pub const READ_DEADLINE: Duration = Duration::from_secs(5);

/// One read of the file, on its own thread (a hung read holds that thread,
/// never the caller or the runtime's shutdown).
fn spawn_read(path: &Path, max_bytes: u64) -> oneshot::Receiver<Result<String, FileError>> {
    let (tx, rx) = oneshot::channel();
    let path = path.to_owned();
    let spawned = std::thread::Builder::new()
        .name("ownership-file-read".into())
        .spawn(move || {
            let _ = tx.send(ownership_file::read_bounded(&path, max_bytes));
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start a thread to read the ownership file");
    }
    rx
}

/// Read `path` with a deadline; the error names the path and what happened.
pub async fn read(path: &Path, max_bytes: u64) -> Result<String, FileError> {
    let hung = || FileError {
        path: path.to_owned(),
        line: None,
        field: None,
        message: format!("reading did not finish within {READ_DEADLINE:?} (a hung file system?)"),
    };
    match tokio::time::timeout(READ_DEADLINE, spawn_read(path, max_bytes)).await {
        Ok(Ok(r)) => r,
        Ok(Err(_)) => Err(hung()),
        Err(_) => Err(hung()),
    }
}

/// Watch `path` (inotify on its directory, so atomic renames and Kubernetes
/// ConfigMap symlink swaps are seen) and re-read it at least every `poll`.
/// Every valid new content is published on `tx`; an invalid one is logged
/// with file, line and field (once per distinct problem), and nothing is
/// published.
pub async fn watch(
    path: PathBuf,
    first_text: String,
    tx: watch::Sender<OwnershipFile>,
    poll: Duration,
    max_bytes: u64,
) {
    let (ev_tx, mut ev_rx) = mpsc::unbounded_channel::<()>();
    let dir = path.parent().map(|p| {
        if p.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            p.to_owned()
        }
    });
    let _watcher = dir.and_then(|dir| {
        let mut w = notify::recommended_watcher(move |_res: notify::Result<notify::Event>| {
            let _ = ev_tx.send(());
        })
        .map_err(|e| tracing::warn!(error = %e, "inotify unavailable; polling the ownership file only"))
        .ok()?;
        w.watch(&dir, notify::RecursiveMode::NonRecursive)
            .map_err(|e| tracing::warn!(dir = %dir.display(), error = %e, "cannot watch directory; polling only"))
            .ok()?;
        Some(w)
    });
    let mut last_text = first_text;
    // The last problem logged: each distinct one is logged once.
    let mut last_rejected: Option<String> = None;
    // A digest of the last content rejected as invalid.
    let mut rejected_digest: Option<u64> = None;
    let reject = |last: &mut Option<String>, why: String, what: &str| {
        if last.as_deref() != Some(&why) {
            tracing::error!(file = %path.display(), error = %why, "{what}; keeping the last good state");
            *last = Some(why);
        }
    };
    // A read still running from before (a hung file system): no second one.
    let mut pending: Option<oneshot::Receiver<Result<String, FileError>>> = None;
    let mut ticker = tokio::time::interval(poll.max(Duration::from_millis(100)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            Some(()) = ev_rx.recv() => {
                // Let a burst of events (write, chmod, rename) settle.
                tokio::time::sleep(Duration::from_millis(50)).await;
                while ev_rx.try_recv().is_ok() {}
            }
            _ = ticker.tick() => {}
        }
        let mut rx = pending
            .take()
            .unwrap_or_else(|| spawn_read(&path, max_bytes));
        let text = match tokio::time::timeout(READ_DEADLINE, &mut rx).await {
            Ok(Ok(Ok(t))) => t,
            Ok(Ok(Err(e))) => {
                reject(
                    &mut last_rejected,
                    e.to_string(),
                    "ownership file unreadable",
                );
                continue;
            }
            Ok(Err(_)) => continue,
            Err(_) => {
                pending = Some(rx);
                reject(
                    &mut last_rejected,
                    format!(
                        "{}: reading did not finish within {READ_DEADLINE:?} (a hung file system?)",
                        path.display()
                    ),
                    "ownership file unreadable",
                );
                continue;
            }
        };
        // Same as what is in force, or as what was rejected already: nothing
        // to do (a big bad file is not re-parsed every poll).
        let digest = {
            use std::hash::{Hash as _, Hasher as _};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            text.hash(&mut h);
            h.finish()
        };
        if text == last_text || rejected_digest == Some(digest) {
            continue;
        }
        // A writer may be half-way through (`cat > file`): take the content
        // only once it reads the same twice, a moment apart. The next event or
        // poll comes back to it otherwise.
        tokio::time::sleep(Duration::from_millis(100)).await;
        if read(&path, max_bytes).await.ok().as_deref() != Some(text.as_str()) {
            continue;
        }
        match ownership_file::parse(&path, &text) {
            Ok(file) => {
                tracing::info!(file = %path.display(), ips = file.ips.len(), "ownership file reloaded");
                last_text = text;
                last_rejected = None;
                rejected_digest = None;
                tx.send_replace(file);
            }
            Err(e) => {
                rejected_digest = Some(digest);
                reject(&mut last_rejected, e.to_string(), "ownership file rejected")
            }
        }
    }
}
