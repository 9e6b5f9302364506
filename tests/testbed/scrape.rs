//! Prometheus's part, for tests of the alerting rules: the guards'
//! `/metrics` scraped on a schedule (one thread per node, inside its
//! namespace), kept with the time of each scrape, so that the series the
//! daemons really exported can be replayed to promtool ([`crate::promtool`]).

use std::{
    fs::File,
    os::fd::AsRawFd,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};

use crate::Netns;

/// One scrape of one target.
#[derive(Debug, Clone)]
pub struct Sample {
    /// Since the scraper started.
    pub at: Duration,
    /// The target's `instance` label.
    pub instance: String,
    /// The exposition text.
    pub text: String,
}

/// Scrapes until stopped (or dropped).
pub struct Scraper {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    samples: Arc<Mutex<Vec<Sample>>>,
    started: Instant,
}

impl Scraper {
    /// Scrape `127.0.0.1:9477/metrics` in each namespace every `every`,
    /// labelled `instance`. A scrape that fails (a daemon not up yet) is
    /// missing from the samples, as in Prometheus.
    pub fn start(targets: &[(&str, &Netns)], every: Duration) -> Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let started = Instant::now();
        let mut threads = Vec::new();
        for (instance, ns) in targets {
            let path = format!("/run/netns/{}", ns.name);
            let file = File::open(&path).with_context(|| format!("opening {path}"))?;
            let (stop, samples, instance) = (stop.clone(), samples.clone(), instance.to_string());
            threads.push(std::thread::spawn(move || {
                // SAFETY: setns on this thread only; the fd is valid while `file` lives.
                if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    return;
                }
                let mut next = started;
                while !stop.load(Ordering::SeqCst) {
                    if let Some(text) = scrape() {
                        let at = started.elapsed();
                        samples.lock().unwrap().push(Sample {
                            at,
                            instance: instance.clone(),
                            text,
                        });
                    }
                    next += every;
                    std::thread::sleep(next.saturating_duration_since(Instant::now()));
                }
            }));
        }
        Ok(Scraper {
            stop,
            threads,
            samples,
            started,
        })
    }

    /// Since the scraper started (the samples' clock).
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// The samples so far.
    pub fn samples(&self) -> Vec<Sample> {
        self.samples.lock().unwrap().clone()
    }

    /// Stop scraping; every sample.
    pub fn stop(mut self) -> Vec<Sample> {
        self.halt();
        self.samples()
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Scraper {
    fn drop(&mut self) {
        self.halt();
    }
}

/// One GET of the metrics (None: not answered).
fn scrape() -> Option<String> {
    let addr = "127.0.0.1:9477";
    std::net::TcpStream::connect_timeout(&addr.parse().ok()?, Duration::from_secs(1)).ok()?;
    let got = std::panic::catch_unwind(|| crate::http_get(addr, "/metrics")).ok()?;
    (got.0 == 200).then_some(got.1)
}
