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

use super::file::{self as ownership_file, FileError};
use crate::model::ownership::OwnershipFile;

/// The ownership file and how it is read.
#[derive(Debug, Clone)]
pub struct FileConfig {
    pub path: PathBuf,
    /// Re-read at least this often, even without a change notification.
    pub poll: Duration,
    /// Largest file read.
    pub max_bytes: u64,
}

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
pub async fn watch(cfg: FileConfig, first_text: String, tx: watch::Sender<OwnershipFile>) {
    let (ev_tx, mut ev_rx) = mpsc::unbounded_channel::<()>();
    let _watcher = notifier(&cfg.path, ev_tx);
    let mut ticker = tokio::time::interval(cfg.poll.max(Duration::from_millis(100)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut state = Reloader {
        cfg,
        last_text: first_text,
        last_rejected: None,
        rejected_digest: None,
        pending: None,
    };
    loop {
        tokio::select! {
            Some(()) = ev_rx.recv() => {
                // Let a burst of events (write, chmod, rename) settle.
                tokio::time::sleep(Duration::from_millis(50)).await;
                while ev_rx.try_recv().is_ok() {}
            }
            _ = ticker.tick() => {}
        }
        if let Some(file) = state.reload().await {
            tx.send_replace(file);
        }
    }
}

/// inotify on the file's directory, sending a unit on every change in it;
/// None (polling only) where it cannot be had.
fn notifier(path: &Path, ev_tx: mpsc::UnboundedSender<()>) -> Option<notify::RecommendedWatcher> {
    let dir = match path.parent() {
        Some(p) if p.as_os_str().is_empty() => PathBuf::from("."),
        Some(p) => p.to_owned(),
        None => return None,
    };
    let mut w = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
        // Reading the file (ours included) is not a change: an open or a
        // read-only close would otherwise make every reload wake the next.
        use notify::event::{AccessKind, AccessMode, EventKind};
        let read_only = res.as_ref().is_ok_and(
            |e| matches!(e.kind, EventKind::Access(a) if a != AccessKind::Close(AccessMode::Write)),
        );
        if !read_only {
            let _ = ev_tx.send(());
        }
    })
    .map_err(|e| tracing::warn!(error = %e, "inotify unavailable; polling the ownership file only"))
    .ok()?;
    w.watch(&dir, notify::RecursiveMode::NonRecursive)
        .map_err(|e| tracing::warn!(dir = %dir.display(), error = %e, "cannot watch directory; polling only"))
        .ok()?;
    Some(w)
}

/// What the watcher remembers between reads.
struct Reloader {
    cfg: FileConfig,
    /// The content in force.
    last_text: String,
    /// The last problem logged: each distinct one is logged once.
    last_rejected: Option<String>,
    /// A digest of the last content rejected as invalid.
    rejected_digest: Option<u64>,
    /// A read still running from before (a hung file system): no second one.
    pending: Option<oneshot::Receiver<Result<String, FileError>>>,
}

impl Reloader {
    fn reject(&mut self, why: String, what: &str) {
        if self.last_rejected.as_deref() != Some(&why) {
            tracing::error!(file = %self.cfg.path.display(), error = %why, "{what}; keeping the last good state");
            self.last_rejected = Some(why);
        }
    }

    /// Read the file; a new, valid content to put in force.
    async fn reload(&mut self) -> Option<OwnershipFile> {
        let text = self.read().await?;
        // Same as what is in force, or as what was rejected already: nothing
        // to do (a big bad file is not re-parsed every poll).
        let digest = {
            use std::hash::{Hash as _, Hasher as _};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            text.hash(&mut h);
            h.finish()
        };
        if text == self.last_text || self.rejected_digest == Some(digest) {
            return None;
        }
        // A writer may be half-way through (`cat > file`): take the content
        // only once it reads the same twice, a moment apart. The next event or
        // poll comes back to it otherwise.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let again = read(&self.cfg.path, self.cfg.max_bytes).await.ok();
        if again.as_deref() != Some(text.as_str()) {
            return None;
        }
        match ownership_file::parse(&self.cfg.path, &text) {
            Ok(file) => {
                tracing::info!(file = %self.cfg.path.display(), ips = file.ips.len(), "ownership file reloaded");
                self.last_text = text;
                self.last_rejected = None;
                self.rejected_digest = None;
                Some(file)
            }
            Err(e) => {
                self.rejected_digest = Some(digest);
                self.reject(e.to_string(), "ownership file rejected");
                None
            }
        }
    }

    /// One read, waiting for a hung one from before rather than starting another.
    async fn read(&mut self) -> Option<String> {
        let (path, max_bytes) = (&self.cfg.path, self.cfg.max_bytes);
        let mut rx = self
            .pending
            .take()
            .unwrap_or_else(|| spawn_read(path, max_bytes));
        match tokio::time::timeout(READ_DEADLINE, &mut rx).await {
            Ok(Ok(Ok(t))) => Some(t),
            Ok(Ok(Err(e))) => {
                self.reject(e.to_string(), "ownership file unreadable");
                None
            }
            Ok(Err(_)) => None,
            Err(_) => {
                self.pending = Some(rx);
                let why = format!(
                    "{}: reading did not finish within {READ_DEADLINE:?} (a hung file system?)",
                    self.cfg.path.display()
                );
                self.reject(why, "ownership file unreadable");
                None
            }
        }
    }
}
