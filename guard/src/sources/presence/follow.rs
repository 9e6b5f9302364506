//! One collection followed for presence: listed once (the first page from
//! the API server's watch cache, `resourceVersion=0`), then watched from
//! the listed resourceVersion and resumed from the last one seen (bookmarks
//! keep it current), for ever. Only a 410 Gone relists. With nothing
//! changing this costs one watch request per [`WATCH_TIMEOUT`] and a
//! bookmark a minute: what a guard reads of the other guards does not grow
//! with their number.

use std::time::Duration;

use kube::{api::WatchParams, Client};
use tokio::sync::mpsc;

use super::request::cached_list;
use crate::sources::cluster::{
    decode::{self, Obj, Object, WatchLine},
    dial::Dialer,
    stream::{backoff, IDLE_MARGIN},
    wire::{self, Read},
};

/// The server ends each watch after this long (what kube's own watcher
/// asks); a watch silent for this plus [`IDLE_MARGIN`] is stuck.
pub const WATCH_TIMEOUT: Duration = Duration::from_secs(290);
/// Objects per list page.
const PAGE: u32 = 100;
/// First retry of a failed list or watch; doubling up to 30 s.
const RETRY: Duration = Duration::from_millis(500);

/// What the follower reports.
pub enum Step<T> {
    /// The whole collection, as listed (everything before is gone).
    Listed(Vec<Obj<T>>),
    Apply(Obj<T>),
    Delete(Obj<T>),
    /// The server showed the watch is current (a bookmark, its end).
    Progress,
    /// A list or watch failed; retried with back-off.
    Failed(Failed),
}

/// Why a list or watch failed: the API's HTTP status when it answered one.
#[derive(Debug, Clone)]
pub struct Failed {
    pub code: Option<u16>,
    pub text: String,
}

impl Failed {
    fn of(what: &str, e: &kube::Error) -> Failed {
        let code = match e {
            kube::Error::Api(s) => Some(s.code),
            _ => None,
        };
        Failed {
            code,
            text: format!("{what}: {e}"),
        }
    }

    fn other(text: String) -> Failed {
        Failed { code: None, text }
    }
}

/// Which collection, with which label selector.
pub struct Collection {
    pub client: Client,
    /// The watches' connections (`dial`).
    pub dialer: Dialer,
    pub path: String,
    pub labels: String,
}

/// The follower ends when no one listens any more.
struct Closed;

/// Follow `c` for ever, reporting into `tx`.
pub async fn follow<T: Object>(c: Collection, tx: mpsc::Sender<Step<T>>) {
    let mut attempt = 0u32;
    loop {
        let listed = tokio::time::timeout(WATCH_TIMEOUT, list::<T>(&c)).await;
        let mut rv = match listed {
            Ok(Ok((items, rv))) => {
                if tx.send(Step::Listed(items)).await.is_err() {
                    return;
                }
                rv
            }
            Ok(Err(e)) => {
                if failed(&tx, e, &mut attempt).await.is_err() {
                    return;
                }
                continue;
            }
            Err(_) => {
                let e = Failed::other(format!("list: no answer within {WATCH_TIMEOUT:?}"));
                if failed(&tx, e, &mut attempt).await.is_err() {
                    return;
                }
                continue;
            }
        };
        attempt = 0;
        loop {
            match watch(&c, &mut rv, &tx).await {
                Ok(End::Resume) => attempt = 0,
                Ok(End::Relist) => break,
                Ok(End::Failed(e)) => {
                    if failed(&tx, e, &mut attempt).await.is_err() {
                        return;
                    }
                }
                Err(Closed) => return,
            }
        }
    }
}

/// Report a failure, then wait out the back-off.
async fn failed<T>(tx: &mpsc::Sender<Step<T>>, e: Failed, attempt: &mut u32) -> Result<(), ()> {
    tx.send(Step::Failed(e)).await.map_err(drop)?;
    tokio::time::sleep(backoff(RETRY, *attempt)).await;
    *attempt += 1;
    Ok(())
}

/// Every page; the collection and its resourceVersion. The first page from
/// the watch cache ([`cached_list`]): never a quorum read of etcd.
async fn list<T: Object>(c: &Collection) -> Result<(Vec<Obj<T>>, String), Failed> {
    let mut items = Vec::new();
    let mut cont: Option<String> = None;
    loop {
        let req = cached_list(&c.path, Some(&c.labels), PAGE, cont.as_deref())
            .map_err(|e| Failed::other(format!("list: {e}")))?;
        let text = (c.client.request_text(req).await).map_err(|e| Failed::of("list", &e))?;
        let page = decode::page::<T>(&text, T::wanted)
            .map_err(|e| Failed::other(format!("list: not a list: {e}")))?;
        items.extend(page.items);
        match page.continue_token {
            Some(token) => cont = Some(token),
            None => return Ok((items, page.resource_version.unwrap_or_default())),
        }
    }
}

/// How a watch ended.
enum End {
    Resume,
    Relist,
    Failed(Failed),
}

/// One watch from `rv` (kept current) until the server ends it or it fails.
async fn watch<T: Object>(
    c: &Collection,
    rv: &mut String,
    tx: &mpsc::Sender<Step<T>>,
) -> Result<End, Closed> {
    let idle = WATCH_TIMEOUT + IDLE_MARGIN;
    let wp = WatchParams::default()
        .labels(&c.labels)
        .timeout(WATCH_TIMEOUT.as_secs() as u32);
    let mut w =
        match tokio::time::timeout(idle, wire::watch(&c.dialer, None, &c.path, &wp, rv)).await {
            Ok(Ok(w)) => w,
            Ok(Err(kube::Error::Api(s))) if s.code == 410 => return Ok(End::Relist),
            Ok(Err(e)) => return Ok(End::Failed(Failed::of("watch", &e))),
            Err(_) => {
                let e = format!("watch: no answer within {idle:?}");
                return Ok(End::Failed(Failed::other(e)));
            }
        };
    loop {
        let step = match tokio::time::timeout(idle, w.next::<T>()).await {
            Err(_) => {
                let e = format!("watch: silent for {idle:?}");
                return Ok(End::Failed(Failed::other(e)));
            }
            Ok(Read::End) => {
                send(tx, Step::Progress).await?;
                return Ok(End::Resume);
            }
            Ok(Read::Failed(e)) => return Ok(End::Failed(Failed::other(format!("watch: {e}")))),
            Ok(Read::Garbled(e)) => return Ok(End::Failed(Failed::other(e))),
            Ok(Read::Line(WatchLine::Error(410, _))) => return Ok(End::Relist),
            Ok(Read::Line(WatchLine::Error(code, m))) => {
                return Ok(End::Failed(Failed {
                    code: Some(code),
                    text: format!("watch: {m} ({code})"),
                }))
            }
            Ok(Read::Line(WatchLine::Bookmark(v))) => {
                if let Some(v) = v {
                    *rv = v;
                }
                Step::Progress
            }
            Ok(Read::Line(WatchLine::Added(o) | WatchLine::Modified(o))) => {
                follow_rv(rv, &o);
                Step::Apply(o)
            }
            Ok(Read::Line(WatchLine::Deleted(o))) => {
                follow_rv(rv, &o);
                Step::Delete(o)
            }
        };
        send(tx, step).await?;
    }
}

fn follow_rv<T: Object>(rv: &mut String, o: &Obj<T>) {
    if let Some(v) = o.resource_version() {
        rv.clear();
        rv.push_str(v);
    }
}

async fn send<T>(tx: &mpsc::Sender<Step<T>>, s: Step<T>) -> Result<(), Closed> {
    tx.send(s).await.map_err(|_| Closed)
}
