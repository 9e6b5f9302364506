//! Keeps the ownership file's content current: reload on change, reject bad
//! updates, keep the last good state in force.

use std::{path::PathBuf, time::Duration};

use notify::Watcher as _;
use tokio::sync::{mpsc, watch};

use crate::ownership_file::{self, OwnershipFile};

/// Watch `path` (inotify on its directory, so atomic renames and Kubernetes
/// ConfigMap symlink swaps are seen) and re-read it at least every `poll`.
/// Every valid new content is published on `tx`; an invalid one is logged
/// with file, line and field, and nothing is published.
pub async fn watch(
    path: PathBuf,
    first_text: String,
    tx: watch::Sender<OwnershipFile>,
    poll: Duration,
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
    let mut last_rejected: Option<String> = None;
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
        let text = match tokio::fs::read_to_string(&path).await {
            Ok(t) => t,
            Err(e) => {
                let why = format!("cannot read: {e}");
                if last_rejected.as_deref() != Some(&why) {
                    tracing::error!(file = %path.display(), error = %why, "ownership file unreadable; keeping the last good state");
                    last_rejected = Some(why);
                }
                continue;
            }
        };
        if text == last_text {
            continue;
        }
        // A writer may be half-way through (`cat > file`): take the content
        // only once it reads the same twice, a moment apart. The next event or
        // poll comes back to it otherwise.
        tokio::time::sleep(Duration::from_millis(100)).await;
        if tokio::fs::read_to_string(&path).await.ok().as_deref() != Some(text.as_str()) {
            continue;
        }
        match ownership_file::parse(&path, &text) {
            Ok(file) => {
                tracing::info!(file = %path.display(), ips = file.ips.len(), "ownership file reloaded");
                last_text = text;
                last_rejected = None;
                tx.send_replace(file);
            }
            Err(e) => {
                let why = e.to_string();
                if last_rejected.as_deref() != Some(&why) {
                    tracing::error!(error = %why, "ownership file rejected; keeping the last good state");
                    last_rejected = Some(why);
                }
            }
        }
    }
}
