//! One collection followed for presence (and for the uplink hints), on the
//! one list+watch loop (`sources::cluster::listwatch`): the first page of
//! each list from the API server's watch cache (`resourceVersion=0`), then
//! watches resumed from the last resourceVersion seen, for ever. With
//! nothing changing this costs one watch request per watch timeout and a
//! bookmark a minute: what a guard reads of the other guards does not grow
//! with their number. What the loop sees goes into a channel, a list as one
//! step.

use std::{sync::Arc, time::Duration};

use kube::Client;
use tokio::sync::mpsc;

use crate::sources::cluster::{
    decode::{Obj, Object},
    dial::Dialer,
    listwatch::{self, Closed, Event, Follow, Sink, StreamCtl},
};

/// Objects per list page.
const PAGE: u32 = 100;

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

/// Which collection, with which label selector, watched how long at a time.
pub struct Collection {
    pub client: Client,
    /// The watches' connections (`dial`).
    pub dialer: Dialer,
    pub path: String,
    pub labels: String,
    /// Each watch asks for a random time in [this, twice this).
    pub watch_min: Duration,
}

/// The loop's steps into the channel, a list gathered into one.
struct Channel<T> {
    tx: mpsc::Sender<Step<T>>,
    listing: Vec<Obj<T>>,
}

impl<T: Send> Sink<T> for Channel<T> {
    async fn send(&mut self, step: listwatch::Step<T>, _more: bool) -> Result<(), Closed> {
        let out = match step {
            listwatch::Step::Event(Event::Listing) => {
                self.listing.clear();
                return Ok(());
            }
            listwatch::Step::Event(Event::Listed(o)) => {
                self.listing.push(o);
                return Ok(());
            }
            listwatch::Step::Event(Event::ListDone) => {
                Step::Listed(std::mem::take(&mut self.listing))
            }
            listwatch::Step::Event(Event::Apply(o)) => Step::Apply(o),
            listwatch::Step::Event(Event::Delete(o)) => Step::Delete(o),
            listwatch::Step::Progress => Step::Progress,
            listwatch::Step::Failed(f) | listwatch::Step::Silent(f, _) => Step::Failed(Failed {
                code: f.code,
                text: f.text,
            }),
            listwatch::Step::Idle(d) => Step::Failed(Failed {
                code: None,
                text: format!("watch: no event, bookmark or end of watch within {d:?}: relisting"),
            }),
        };
        self.tx.send(out).await.map_err(|_| Closed)
    }
}

/// Follow `c` for ever, reporting into `tx` (until no one listens).
pub async fn follow<T: Object>(c: Collection, tx: mpsc::Sender<Step<T>>) {
    let collection = listwatch::Collection {
        path: c.path,
        labels: Some(c.labels).filter(|l| !l.is_empty()),
        cached: true,
        page: PAGE,
        ..Default::default()
    };
    let sink = Channel {
        tx,
        listing: Vec::new(),
    };
    let ctl = Arc::new(StreamCtl::default());
    Follow::new((c.client, c.dialer), collection, c.watch_min, ctl, sink)
        .run::<T>()
        .await;
}
