//! A takeover as a guard reports it: in `/status`, `/explain`, and in
//! `kubectl arp-guard status` (the daemon's bookkeeping of takeovers is
//! `guard::model::takeover`).

use guard_common::Origin;
use serde::{Deserialize, Serialize};

/// The last takeover of an IP by this node, as the status shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TakeoverRecord {
    /// When the ownership change was seen (Unix seconds).
    pub at_unix: u64,
    /// From the ownership change to the first announcement that left this
    /// node (0 when it left before the change was seen, within the window);
    /// None: none yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_announcement_ms: Option<u64>,
    /// Who sent it: `speaker`, `kernel`, `redirect`, or `guard` (a held
    /// announcement re-sent by the guard).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via: Option<Origin>,
    /// No announcement within the threshold (it may have come later: then
    /// `first_announcement_ms` says when).
    pub silent: bool,
}
