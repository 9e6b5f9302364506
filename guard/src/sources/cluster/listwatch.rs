//! The one list+watch loop, for every collection the guard follows (the
//! feed's Services, Leases and ServiceL2Statuses; presence's records and
//! Pods; the announcers' uplink hints), each on a task of its own: list,
//! then watch from the listed resourceVersion, resumed from the last one
//! seen, for ever, as client-go's reflector and kube's watcher do. Only a
//! 410 Gone, or a stream stuck past its deadline, relists. What it sees
//! goes to a [`Sink`], in the task itself (no channel between the socket,
//! the parser and the feed).
//!
//! Driven by hand rather than by `kube::runtime::watcher` so that its
//! progress is visible (an event, a bookmark, the server's end of a watch),
//! its objects are decoded one by one into the slim types of `decode`, and
//! its watch is read in its own task from a connection kept between
//! watches (`dial`, `wire`).
//!
//! **Quiet at rest.** Each watch asks the server to end it after a random
//! time in [W, 2W) (`--kube-watch-timeout` W, as client-go's reflector asks
//! for [5, 10) minutes), so a guard's watches are reopened rarely and never
//! in step with another guard's. Bookmarks are asked for; the API server
//! sends one about every minute on every watch, and once a stream has seen
//! one come before its watch's end it is judged by them: silent for
//! [`HEARTBEAT_SILENCE`](super::pace::HEARTBEAT_SILENCE) is stuck. A server that sends bookmarks only at a
//! watch's end is judged by the end (its timeout and [`IDLE_MARGIN`](super::pace::IDLE_MARGIN)).

use std::{
    future::Future,
    sync::{atomic::Ordering::Relaxed, Arc},
    time::{Duration, Instant},
};

use kube::{api::WatchParams, Client};

pub use super::collection::{list_request, Collection, LB_SERVICES};
pub use super::pace::{backoff, StreamCtl};

use super::{
    cause::{Cause, Failure},
    decode::{Obj, Object, WatchLine},
    dial::{Dialer, Link, KEEPALIVE_DEAD},
    pace::{spread, Heartbeat},
    wire::{self, Read},
};

/// A list page or the opening of a watch gives up after this long.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// First retry of a failed list or watch; doubling per attempt up to 30 s.
const RETRY: Duration = Duration::from_millis(500);
/// The longest a server's `Retry-After` holds a stream back.
const RETRY_AFTER_MAX: Duration = Duration::from_secs(60);

/// What a stream saw of one object, or of its collection.
pub enum Event<T> {
    /// A relist begins: until [`Event::ListDone`] the objects that follow
    /// are the whole collection.
    Listing,
    Listed(Obj<T>),
    ListDone,
    /// Added or changed (a Service that stopped being of type
    /// LoadBalancer comes as [`Event::Delete`]: it is no longer guarded).
    Apply(Obj<T>),
    /// Gone (its content does not matter, only its key).
    Delete(Obj<T>),
}

/// What the loop reports.
pub enum Step<T> {
    Event(Event<T>),
    /// The server showed it is alive for this stream: a bookmark, or its
    /// clean end of a watch.
    Progress,
    /// A list or watch failed (retried with back-off): blind from now.
    Failed(Failure),
    /// The watch's connection went silent and the kernel gave up on it
    /// (keepalive): blind for this long already.
    Silent(Failure, Duration),
    /// Nothing at all within the idle deadline: relisted, blind since the
    /// stream's last progress.
    Idle(Duration),
}

/// No one listens any more: the loop ends.
pub struct Closed;

/// Where a stream's steps go.
pub trait Sink<T>: Send {
    /// Deliver `step`; `more`: another event read with it follows at once
    /// (a burst is delivered as one).
    fn send(
        &mut self,
        step: Step<T>,
        more: bool,
    ) -> impl Future<Output = Result<(), Closed>> + Send;
}

/// How a watch ended.
enum End {
    /// Resume from the last resourceVersion.
    Resume,
    /// List again (410 Gone, or stuck).
    Relist,
}

/// One collection's loop.
pub struct Follow<S> {
    client: Client,
    dialer: Dialer,
    c: Collection,
    /// W: each watch asks for a random time in [W, 2W).
    watch_min: Duration,
    ctl: Arc<StreamCtl>,
    sink: S,
    /// The connection of the last watch, kept for the next one.
    kept: Option<Link>,
    attempt: u32,
    /// Whether the server sends bookmarks through a watch.
    heartbeat: Heartbeat,
}

impl<S> Follow<S> {
    pub fn new(
        (client, dialer): (Client, Dialer),
        c: Collection,
        watch_min: Duration,
        ctl: Arc<StreamCtl>,
        sink: S,
    ) -> Self {
        Follow {
            client,
            dialer,
            c,
            watch_min: watch_min.max(Duration::from_secs(1)),
            ctl,
            sink,
            kept: None,
            attempt: 0,
            heartbeat: Heartbeat::default(),
        }
    }

    pub async fn run<T: Object>(mut self)
    where
        S: Sink<T>,
    {
        while let Ok(()) = self.relist_and_watch().await {}
    }

    /// The field selector of the next request.
    fn fields(&self) -> Option<String> {
        let lb = (self.c.lb_filter.as_ref()).is_some_and(|f| f.load(Relaxed));
        match (lb, &self.c.fields) {
            (true, Some(f)) => Some(format!("{LB_SERVICES},{f}")),
            (true, None) => Some(LB_SERVICES.to_owned()),
            (false, f) => f.clone(),
        }
    }

    /// The server cannot filter Services by type (before Kubernetes 1.31
    /// it answers 400 "field label not supported: spec.type"): from now on
    /// every Service is read and the others dropped as they are decoded.
    fn filter_unsupported(&self, e: &kube::Error) -> bool {
        let kube::Error::Api(s) = e else {
            return false;
        };
        let Some(f) = self.c.lb_filter.as_ref() else {
            return false;
        };
        if s.code != 400 || !s.message.contains("spec.type") {
            return false;
        }
        if f.swap(false, Relaxed) {
            tracing::info!(
                error = %crate::model::text::clip(&s.message, 200),
                "the API server cannot select Services by spec.type (Kubernetes before 1.31): \
                 reading every Service and keeping only those of type LoadBalancer"
            );
        }
        true
    }

    async fn relist_and_watch<T: Object>(&mut self) -> Result<(), Closed>
    where
        S: Sink<T>,
    {
        let Some(mut rv) = self.list().await? else {
            return Ok(());
        };
        self.attempt = 0;
        loop {
            match self.watch(&mut rv).await? {
                End::Resume => continue,
                End::Relist => return Ok(()),
            }
        }
    }

    /// Report a failure and wait out the back-off (or the server's
    /// `Retry-After`, if longer).
    async fn failed<T>(&mut self, step: Step<T>) -> Result<(), Closed>
    where
        S: Sink<T>,
    {
        let after = match &step {
            Step::Failed(f) | Step::Silent(f, _) => f.retry_after,
            _ => None,
        };
        self.sink.send(step, false).await?;
        let wait = backoff(RETRY, self.attempt).max(after.unwrap_or_default().min(RETRY_AFTER_MAX));
        self.ctl.pause(wait).await;
        self.attempt += 1;
        Ok(())
    }

    /// List, page by page; `Listing` goes out with the first page that
    /// arrives, `ListDone` after the last. The listed resourceVersion, or
    /// None after a failure (reported).
    async fn list<T: Object>(&mut self) -> Result<Option<String>, Closed>
    where
        S: Sink<T>,
    {
        let mut cont: Option<String> = None;
        let mut first = true;
        loop {
            let req = list_request(&self.c, self.fields().as_deref(), cont.as_deref());
            let page = (self.ctl)
                .request(tokio::time::timeout(
                    REQUEST_TIMEOUT,
                    wire::list::<T>(&self.client, req),
                ))
                .await;
            let page = match page {
                Ok(Ok(p)) => p,
                // Listed again at once, without the filter.
                Ok(Err(e)) if self.filter_unsupported(&e) => return Ok(None),
                Ok(Err(e)) => {
                    let f = Step::Failed(Failure::of("list", &e));
                    return self.failed(f).await.map(|()| None);
                }
                Err(_) => {
                    let f = Step::Failed(Failure::timeout("list", REQUEST_TIMEOUT));
                    return self.failed(f).await.map(|()| None);
                }
            };
            if std::mem::take(&mut first) {
                self.sink.send(Step::Event(Event::Listing), false).await?;
            }
            for o in page.items {
                self.sink.send(Step::Event(Event::Listed(o)), true).await?;
            }
            match page.continue_token {
                Some(c) => cont = Some(c),
                None => {
                    self.sink.send(Step::Event(Event::ListDone), false).await?;
                    return Ok(Some(page.resource_version.unwrap_or_default()));
                }
            }
        }
    }

    /// Open a watch from `rv` asking for `timeout`: the watch, or how the
    /// attempt ended.
    async fn open<T: Object>(
        &mut self,
        rv: &str,
        timeout: Duration,
    ) -> Result<Result<wire::Watch, End>, Closed>
    where
        S: Sink<T>,
    {
        // Bookmarks are on by default: they are the progress of a quiet stream.
        let mut wp = WatchParams::default().timeout(timeout.as_secs() as u32);
        wp.label_selector = self.c.labels.clone();
        wp.field_selector = self.fields();
        let opened = (self.ctl)
            .request(tokio::time::timeout(
                REQUEST_TIMEOUT,
                wire::watch(&self.dialer, self.kept.take(), &self.c.path, &wp, rv),
            ))
            .await;
        let end = match opened {
            Ok(Ok(w)) => return Ok(Ok(w)),
            Ok(Err(kube::Error::Api(s))) if s.code == 410 => End::Relist,
            Ok(Err(e)) if self.filter_unsupported(&e) => End::Relist,
            Ok(Err(e)) => {
                self.failed(Step::Failed(Failure::of("watch", &e))).await?;
                End::Resume
            }
            Err(_) => {
                let f = Failure::timeout("watch", REQUEST_TIMEOUT);
                self.failed(Step::Failed(f)).await?;
                End::Resume
            }
        };
        Ok(Err(end))
    }

    /// One watch from `rv` (kept up to date) until the server ends it or it fails.
    async fn watch<T: Object>(&mut self, rv: &mut String) -> Result<End, Closed>
    where
        S: Sink<T>,
    {
        let timeout = spread(self.watch_min);
        let mut w = match self.open(rv, timeout).await? {
            Ok(w) => w,
            Err(end) => return Ok(end),
        };
        let opened_at = Instant::now();
        let mut delivered = false;
        // The idle deadline follows the last thing the watch delivered; its
        // timer is moved only when it fires early (not for every event),
        // or when the deadline shrinks (the first heartbeat).
        let mut seen = opened_at;
        let mut idle = self.heartbeat.idle(timeout);
        let timer = tokio::time::sleep(idle);
        tokio::pin!(timer);
        loop {
            let read = tokio::select! {
                r = w.next::<T>() => r,
                () = &mut timer => {
                    if seen.elapsed() < idle {
                        timer.as_mut().reset((seen + idle).into());
                        continue;
                    }
                    self.sink.send(Step::Idle(idle), false).await?;
                    self.heartbeat.went_idle();
                    return Ok(End::Relist);
                }
            };
            if let Read::Line(WatchLine::Bookmark(_)) = &read {
                if self.heartbeat.bookmark(opened_at.elapsed(), timeout) {
                    idle = self.heartbeat.idle(timeout);
                    timer.as_mut().reset((Instant::now() + idle).into());
                }
            }
            // Ended or cut with nothing delivered, at once (a proxy closing
            // watches): a failure, with back-off, not a hot loop that looks
            // healthy.
            let at_once = !delivered && opened_at.elapsed() < Duration::from_secs(1);
            let step = match Outcome::of(read, at_once, rv) {
                Outcome::Step(step) => step,
                Outcome::Ended => {
                    self.attempt = 0;
                    self.kept = w.into_reusable();
                    self.sink.send(Step::Progress, false).await?;
                    return Ok(End::Resume);
                }
                Outcome::Cut => return Ok(End::Resume),
                Outcome::Gone(f) => {
                    self.sink.send(Step::Failed(f), false).await?;
                    return Ok(End::Relist);
                }
                Outcome::Failed(step) => {
                    self.failed(step).await?;
                    return Ok(End::Resume);
                }
            };
            seen = Instant::now();
            delivered = true;
            let more = w.more_ready();
            self.sink.send(step, more).await?;
        }
    }
}

/// What one read of a watch comes to.
enum Outcome<T> {
    /// An event or a bookmark, to deliver.
    Step(Step<T>),
    /// The server ended the watch (its timeout, or a proxy's): progress,
    /// resumed on the same connection.
    Ended,
    /// Cut inside the body, cleanly: resumed at once, as kube's watcher
    /// does, but it shows nothing of the server.
    Cut,
    /// 410 Gone in the stream: relisted.
    Gone(Failure),
    /// Reported, and resumed after the back-off.
    Failed(Step<T>),
}

impl<T: Object> Outcome<T> {
    /// `read` of a watch; `at_once`: nothing was delivered and the watch
    /// is not a second old; `rv` follows the events.
    fn of(read: Read<T>, at_once: bool, rv: &mut String) -> Self {
        let failed = |cause, text: String| Outcome::Failed(Step::Failed(Failure::new(cause, text)));
        match read {
            Read::End | Read::Cut if at_once => {
                failed(Cause::Other, "watch: the server ended it at once".into())
            }
            Read::End => Outcome::Ended,
            Read::Cut => Outcome::Cut,
            Read::Failed(e) => failed(Cause::of_io(&e), format!("watch: {e}")),
            Read::Silent(e) => {
                let text = format!("watch: the connection went silent ({e})");
                Outcome::Failed(Step::Silent(
                    Failure::new(Cause::Timeout, text),
                    KEEPALIVE_DEAD,
                ))
            }
            Read::Garbled(e) => failed(Cause::Other, e),
            Read::Line(WatchLine::Error(410, m)) => Outcome::Gone(Failure::new(
                Cause::Other,
                format!("watch: {m} (relisting)"),
            )),
            Read::Line(l) => match event(l, rv) {
                f @ Step::Failed(_) => Outcome::Failed(f),
                step => Outcome::Step(step),
            },
        }
    }
}

/// A watch line as a step; `rv` follows it. An object the stream does not
/// want (a Service that is not, or no longer, of type LoadBalancer) goes as
/// a deletion: if it was known, it is no longer guarded.
fn event<T: Object>(l: WatchLine<T>, rv: &mut String) -> Step<T> {
    let mut follow = |o: &Obj<T>| {
        if let Some(v) = o.resource_version() {
            rv.clear();
            rv.push_str(v);
        }
    };
    match l {
        WatchLine::Added(o) | WatchLine::Modified(o) => {
            follow(&o);
            let wanted = !matches!(&o, Obj::Good(g) if !g.wanted());
            Step::Event(if wanted {
                Event::Apply(o)
            } else {
                Event::Delete(o)
            })
        }
        WatchLine::Deleted(o) => {
            follow(&o);
            Step::Event(Event::Delete(o))
        }
        WatchLine::Bookmark(v) => {
            if let Some(v) = v {
                *rv = v;
            }
            Step::Progress
        }
        WatchLine::Error(code, m) => {
            let mut f = Failure::new(Cause::of_code(code), format!("watch: {m} ({code})"));
            f.code = Some(code);
            Step::Failed(f)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watches_spread_over_twice_their_minimum() {
        let min = Duration::from_secs(300);
        let got: Vec<Duration> = (0..200)
            .map(|_| {
                std::thread::sleep(Duration::from_micros(37));
                spread(min)
            })
            .collect();
        assert!(got.iter().all(|d| *d >= min && *d < 2 * min), "{got:?}");
        let lo = got.iter().filter(|d| **d < min * 3 / 2).count();
        assert!(
            (40..=160).contains(&lo),
            "spread over the range: {lo} of 200 low"
        );
    }

    #[test]
    fn a_list_request_reads_the_cache_only_when_asked_and_pages_without_a_version() {
        let mut c = Collection {
            path: "/api/v1/nodes".into(),
            labels: Some("a!=b,c=d".into()),
            page: 500,
            ..Default::default()
        };
        let q = |r: http::Request<Vec<u8>>| r.uri().query().unwrap_or_default().to_owned();
        let feed = q(list_request(&c, Some("spec.type=LoadBalancer"), None));
        assert!(
            !feed.contains("resourceVersion"),
            "a consistent read: {feed}"
        );
        assert!(
            feed.contains("labelSelector=a%21%3Db%2Cc%3Dd")
                && feed.contains("fieldSelector=spec.type%3DLoadBalancer")
                && feed.contains("limit=500"),
            "{feed}"
        );
        c.cached = true;
        let first = q(list_request(&c, None, None));
        assert!(
            first.contains("resourceVersion=0&resourceVersionMatch=NotOlderThan"),
            "{first}"
        );
        let next = q(list_request(&c, None, Some("eyJ+/=")));
        assert!(!next.contains("resourceVersion"), "{next}");
        assert!(next.contains("continue=eyJ%2B%2F%3D"), "{next}");
    }
}
