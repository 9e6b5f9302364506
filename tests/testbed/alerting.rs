//! Proving an alert: a test's scenario scraped ([`crate::scrape`]), then
//! promtool evaluates the shipped rules on those series ([`crate::promtool`])
//! and finds the alerts the scenario should fire firing, with their labels
//! and summaries, and every dashboard query given to this test returning
//! data ([`crate::dashboard`]).
//!
//! A scenario lasts seconds; the rules' windows and `for:` last minutes.
//! After the last scrape every series is held, except those the test says
//! grow: those go on at the pace they kept over the last [`TAIL`] (a
//! counter of frames that keep coming, an age that keeps ageing), the
//! steady state the scenario stands for.

use std::{collections::BTreeMap, time::Duration};

use anyhow::{Context as _, Result};
use serde_json::Value;

use crate::{
    promtool::{self, Expect, Timeline},
    scrape::Sample,
};

/// The scrape interval, and the step of promtool's timeline.
pub const STEP: Duration = Duration::from_secs(1);
/// The steps over which a growing series' pace is measured.
pub const TAIL: usize = 10;

/// The running test's name (libtest names its thread after it).
pub fn this_test() -> String {
    let t = std::thread::current();
    let name = t.name().unwrap_or_default();
    name.rsplit("::").next().unwrap_or(name).to_owned()
}

/// The rule of `alert` in a rules file.
fn rule<'a>(spec: &'a Value, alert: &str) -> Option<&'a Value> {
    (spec["groups"].as_array().into_iter().flatten())
        .flat_map(|g| g["rules"].as_array().into_iter().flatten())
        .find(|r| r["alert"] == alert)
}

/// An alert's `for:` (0 without one).
pub fn for_of(spec: &Value, alert: &str) -> Duration {
    let f = rule(spec, alert)
        .and_then(|r| r["for"].as_str())
        .unwrap_or("0s");
    let (n, unit) = f.split_at(f.trim_end_matches(|c: char| c.is_ascii_alphabetic()).len());
    let n: u64 = n.parse().unwrap_or(0);
    Duration::from_secs(match unit {
        "h" => n * 3600,
        "m" => n * 60,
        _ => n,
    })
}

/// Prometheus's `humanizeDuration` for a value of a minute or more (what
/// the summaries show), else its four significant digits of seconds.
pub fn humanize_duration(v: f64) -> String {
    let d = v as i64;
    let (days, hours, minutes, seconds) = (d / 86400, d / 3600 % 24, d / 60 % 60, d % 60);
    if days != 0 {
        format!("{days}d {hours}h {minutes}m {seconds}s")
    } else if hours != 0 {
        format!("{hours}h {minutes}m {seconds}s")
    } else if minutes != 0 {
        format!("{minutes}m {seconds}s")
    } else {
        format!("{v}s")
    }
}

/// One firing instance of an alert: its labels (the rule's severity is
/// added) and, where the summary shows it, the value (`{{ $value }}`, with
/// `| humanizeDuration` where the summary pipes it so).
pub struct Firing {
    pub labels: BTreeMap<String, String>,
    pub value: Option<f64>,
}

impl Firing {
    pub fn new(labels: &[(&str, &str)], value: Option<f64>) -> Self {
        Firing {
            labels: (labels.iter())
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            value,
        }
    }

    /// On `instance` alone.
    pub fn on(instance: &str) -> Self {
        Self::new(&[("instance", instance)], None)
    }
}

/// `alert` expected at `at` exactly as `each` (one per firing instance).
pub fn firing(spec: &Value, alert: &str, at: Duration, each: &[Firing]) -> Result<Expect> {
    let r = rule(spec, alert).with_context(|| format!("no rule {alert}"))?;
    let severity = r["labels"]["severity"].as_str().unwrap_or_default();
    let exp = each
        .iter()
        .map(|f| {
            let mut labels = f.labels.clone();
            labels.insert("severity".into(), severity.into());
            let mut summary = promtool::summary(spec, alert, &labels).unwrap_or_default();
            if let Some(v) = f.value {
                summary = summary
                    .replace("{{ $value | humanizeDuration }}", &humanize_duration(v))
                    .replace("{{ $value }}", &format!("{v}"));
            }
            (labels, BTreeMap::from([("summary".to_owned(), summary)]))
        })
        .collect();
    Ok(Expect {
        at,
        alert: alert.into(),
        exp,
    })
}

/// The test that fires each alert, as the reference names it
/// (`guard::reference::FIRED_BY`: alert, file, test).
pub type FiredBy<'a> = &'a [(&'a str, &'a str, &'a str)];

/// What one test proves.
pub struct Proof<'a> {
    /// `file!()` of the test.
    pub file: &'a str,
    pub fired_by: FiredBy<'a>,
    /// Which series go on growing after the last scrape, at the pace they
    /// kept (by name: [`promtool::counter_like`], say).
    pub grows: &'a dyn Fn(&str) -> bool,
    /// Metrics that are ages in seconds: after the last scrape, those above
    /// 0 grow by exactly one second per second.
    pub ages: &'a [&'a str],
    /// The alerts this scenario fires (each [`firing`]).
    pub expect: Vec<Expect>,
}

impl Proof<'_> {
    /// promtool on `samples` (a scenario of this test): every alert of
    /// `expect` fires as expected, at its time, and each is the one the
    /// reference says this test fires; every dashboard query given to this
    /// test returns data after the last scrape. Its files stay under
    /// `promtool::workdir` on failure.
    pub fn check(&self, spec: &Value, samples: &[Sample]) -> Result<()> {
        let test = this_test();
        for e in &self.expect {
            let row = (self.fired_by.iter()).find(|(a, _, _)| *a == e.alert);
            let ok = row.is_some_and(|(_, f, t)| self.file.ends_with(f) && *t == test);
            anyhow::ensure!(
                ok,
                "{} fires {}, which the reference says {row:?} fires (FIRED_BY in guard/src/reference.rs)",
                test,
                e.alert
            );
        }
        let input = promtool::series(samples, STEP);
        let mut slopes = promtool::slopes(&input, TAIL, self.grows);
        for (name, values) in &input {
            let age = self
                .ages
                .contains(&name.split('{').next().unwrap_or_default());
            // An age of something there (0: nothing to age).
            if age && values.values().next_back().is_some_and(|v| *v > 0.0) {
                slopes.insert(name.clone(), STEP.as_secs_f64());
            }
        }
        let end = samples.iter().map(|s| s.at).max().unwrap_or_default();
        let end = Duration::from_secs(end.as_secs());
        let exprs = crate::dashboard::exprs_for(self.file, &test, end)?;
        let until = (self.expect.iter().map(|e| e.at))
            .chain([end])
            .max()
            .unwrap_or_default()
            + STEP;
        let t = Timeline {
            input: &input,
            slopes: &slopes,
            step: STEP,
            until,
        };
        let dir = promtool::workdir(&test);
        promtool::run(&dir, spec, &t, &self.expect, &exprs)?;
        let _ = std::fs::remove_dir_all(&dir);
        eprintln!(
            "{test}: {} alert(s) and {} dashboard quer(ies) proven",
            self.expect.len(),
            exprs.len()
        );
        Ok(())
    }
}

/// The end of the scrapes (whole seconds).
pub fn end_of(samples: &[Sample]) -> Duration {
    let last = samples.iter().map(|s| s.at).max().unwrap_or_default();
    Duration::from_secs(last.as_secs())
}

/// A minute past the time an alert that holds from `from` on fires.
pub fn fired_after(spec: &serde_json::Value, alert: &str, from: Duration) -> Duration {
    from + for_of(spec, alert) + Duration::from_secs(60)
}

/// That `alert` of the shipped rule fires for `each`, a minute past its
/// `for` after the last of `samples` (the series held from then on), on
/// the series real guards exported: the whole proof of a test that fires
/// one alert (`file`: its `file!()`, checked against `fired_by`). Err: why
/// not, for the test to panic with its guards' logs.
pub fn prove_one(
    file: &str,
    fired_by: FiredBy<'_>,
    samples: &[Sample],
    alert: &str,
    each: &[Firing],
) -> Result<()> {
    let spec = promtool::shipped_rules()?;
    let at = fired_after(&spec, alert, end_of(samples));
    let proof = Proof {
        file,
        fired_by,
        grows: &promtool::counter_like,
        ages: &[],
        expect: vec![firing(&spec, alert, at, each)?],
    };
    proof.check(&spec, samples)
}
