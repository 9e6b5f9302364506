//! The shipped alerting rules evaluated by promtool on what the daemons
//! really exported: `promtool test rules` with the scraped samples
//! ([`crate::scrape`]) as `input_series`, on a virtual timeline with the
//! real spacing (one step per scrape interval), the last value of each
//! series held on for as long as the rules' windows and `for:` need.
//!
//! The PrometheusRule is a Kubernetes object: its `spec` (`groups`) is the
//! rules file promtool reads.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use anyhow::{Context as _, Result};
use serde_json::{json, Value};

use crate::scrape::Sample;

/// The shipped PrometheusRule's `spec`.
pub fn shipped_rules() -> Result<Value> {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/monitoring/prometheusrule.yaml");
    let text = std::fs::read_to_string(&path).with_context(|| format!("{}", path.display()))?;
    let rule: Value = serde_saphyr::from_str(&text).context("the PrometheusRule")?;
    Ok(rule["spec"].clone())
}

/// Every alert's name in a rules file.
pub fn alertnames(spec: &Value) -> Vec<String> {
    (spec["groups"].as_array().into_iter().flatten())
        .flat_map(|g| g["rules"].as_array().into_iter().flatten())
        .filter_map(|r| r["alert"].as_str().map(str::to_owned))
        .collect()
}

/// An alert's `summary` with `{{ $labels.NAME }}` filled from `labels`.
pub fn summary(spec: &Value, alert: &str, labels: &BTreeMap<String, String>) -> Option<String> {
    let rule = (spec["groups"].as_array().into_iter().flatten())
        .flat_map(|g| g["rules"].as_array().into_iter().flatten())
        .find(|r| r["alert"] == alert)?;
    let mut s = rule["annotations"]["summary"].as_str()?.to_owned();
    for (k, v) in labels {
        s = s.replace(&format!("{{{{ $labels.{k} }}}}"), v);
    }
    Some(s)
}

/// The samples as series: `name{labels,instance="..",job="arp-guard"}` ->
/// value at each step (the step nearest the scrape; a later scrape in the
/// same step wins).
pub fn series(samples: &[Sample], step: Duration) -> BTreeMap<String, BTreeMap<usize, f64>> {
    let mut out: BTreeMap<String, BTreeMap<usize, f64>> = BTreeMap::new();
    for s in samples {
        let tick = (s.at.as_secs_f64() / step.as_secs_f64()).round() as usize;
        for line in s.text.lines().filter(|l| !l.starts_with('#')) {
            let Some((name, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(v) = value.parse::<f64>() else {
                continue;
            };
            let extra = format!("instance=\"{}\",job=\"arp-guard\"", s.instance);
            let name = match name.strip_suffix('}') {
                Some(n) if !n.ends_with('{') => format!("{n},{extra}}}"),
                Some(n) => format!("{n}{extra}}}"),
                None => format!("{name}{{{extra}}}"),
            };
            out.entry(name).or_default().insert(tick, v);
        }
    }
    out
}

/// How often promtool evaluates the rules: an alert at an evaluation time
/// is what the last evaluation at or before it found.
pub const EVALUATION_INTERVAL: Duration = Duration::from_secs(15);

/// Series by name (`name{labels}`), each its value at each step.
pub type Series = BTreeMap<String, BTreeMap<usize, f64>>;

/// Whether a series is a counter's (or a histogram's part): it only grows.
pub fn counter_like(name: &str) -> bool {
    let metric = name.split("{").next().unwrap_or(name);
    ["_total", "_bucket", "_count", "_sum"]
        .iter()
        .any(|s| metric.ends_with(s))
}

/// How much each series of `input` that `grows` names grew per step over
/// its last `tail` steps: what a steady state adds per step after the last
/// scrape, when a scenario's few seconds stand for the minutes a rule's
/// window and `for:` need (a counter that went down, a restart, counts from
/// after it).
pub fn slopes(input: &Series, tail: usize, grows: impl Fn(&str) -> bool) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for (name, values) in input.iter().filter(|(n, _)| grows(n)) {
        let Some((&end, &last)) = values.iter().next_back() else {
            continue;
        };
        let window: Vec<(usize, f64)> = (values.range(end.saturating_sub(tail)..=end))
            .map(|(k, v)| (*k, *v))
            .collect();
        // From the last reset on.
        let from = (window.windows(2).rposition(|w| w[1].1 < w[0].1)).map_or(0, |i| i + 1);
        let (first, v0) = window[from];
        if end > first && last > v0 {
            out.insert(name.clone(), (last - v0) / (end - first) as f64);
        }
    }
    out
}

/// What promtool replays: the series, held to `until` after their last
/// scrape (or going on by their slope, per step).
pub struct Timeline<'a> {
    pub input: &'a Series,
    pub slopes: &'a BTreeMap<String, f64>,
    pub step: Duration,
    pub until: Duration,
}

/// A PromQL expression expected to give exactly `samples` (labels as
/// promtool writes them, `{a="b"}`, and value) at `at`.
#[derive(Debug, Clone)]
pub struct ExprExpect {
    pub at: Duration,
    pub expr: String,
    pub samples: Vec<(String, f64)>,
}

/// One alert expected at one evaluation time (no `exp`: none firing).
#[derive(Debug, Clone)]
pub struct Expect {
    pub at: Duration,
    pub alert: String,
    /// Each firing alert's labels and annotations.
    pub exp: Vec<(BTreeMap<String, String>, BTreeMap<String, String>)>,
}

/// `promtool test rules` on `spec` with `input` held to `until` (steps of
/// `step`) and the expectations; Err: promtool's words.
pub fn test(
    dir: &Path,
    spec: &Value,
    input: &BTreeMap<String, BTreeMap<usize, f64>>,
    step: Duration,
    until: Duration,
    expect: &[Expect],
) -> Result<()> {
    let held = BTreeMap::new();
    let t = Timeline {
        input,
        slopes: &held,
        step,
        until,
    };
    run(dir, spec, &t, expect, &[])
}

/// `promtool test rules` on `spec` replaying `t`, with the alerts and the
/// expressions expected; Err: promtool's words.
pub fn run(
    dir: &Path,
    spec: &Value,
    t: &Timeline,
    expect: &[Expect],
    exprs: &[ExprExpect],
) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("rules.json"), serde_json::to_string(spec)?)?;
    let last = (t.until.as_secs_f64() / t.step.as_secs_f64()).ceil() as usize;
    let input_series: Vec<Value> = (t.input.iter())
        .map(|(name, values)| {
            let slope = t.slopes.get(name).copied().unwrap_or(0.0);
            json!({"series": name, "values": values_text(values, last, slope)})
        })
        .collect();
    let secs = |d: Duration| format!("{}s", d.as_secs());
    let tests: Vec<Value> = (expect.iter())
        .map(|e| {
            let alerts: Vec<Value> = (e.exp.iter())
                .map(|(l, a)| json!({"exp_labels": l, "exp_annotations": a}))
                .collect();
            json!({"eval_time": secs(e.at), "alertname": e.alert, "exp_alerts": alerts})
        })
        .collect();
    let exprs: Vec<Value> = (exprs.iter())
        .map(|e| {
            let samples: Vec<Value> = (e.samples.iter())
                .map(|(labels, value)| json!({"labels": labels, "value": value}))
                .collect();
            json!({"expr": e.expr, "eval_time": secs(e.at), "exp_samples": samples})
        })
        .collect();
    let file = json!({
        "rule_files": ["rules.json"],
        "evaluation_interval": format!("{}s", EVALUATION_INTERVAL.as_secs()),
        "tests": [{
            "interval": format!("{}ms", t.step.as_millis()),
            "input_series": input_series,
            "alert_rule_test": tests,
            "promql_expr_test": exprs,
        }],
    });
    let path = dir.join("test.json");
    std::fs::write(&path, serde_json::to_string_pretty(&file)?)?;
    let out = Command::new("promtool")
        .args(["test", "rules"])
        .arg(&path)
        .output()
        .context("promtool (cargo xtask setup installs it)")?;
    if !out.status.success() {
        anyhow::bail!(
            "promtool test rules {}:\n{}{}",
            path.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// A series' values from step 0 to `last`: `_` where it was not scraped,
/// then its last value held to the end (growing by `slope` per step).
fn values_text(values: &BTreeMap<usize, f64>, last: usize, slope: f64) -> String {
    let end = values.keys().next_back().copied().unwrap_or(0);
    let mut out: Vec<String> = (0..=end)
        .map(|i| values.get(&i).map_or_else(|| "_".to_owned(), |v| num(*v)))
        .collect();
    if last > end {
        match values.get(&end) {
            Some(v) if v.is_finite() => out.push(format!(
                "{}+{}x{}",
                num(v + slope),
                num(slope),
                last - end - 1
            )),
            Some(v) => out.push(format!("{}+0x{}", num(*v), last - end - 1)),
            None => out.push(format!("_x{}", last - end)),
        }
    }
    out.join(" ")
}

fn num(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        format!("{v}")
    }
}

/// A directory of the test's own for promtool's files (kept on failure:
/// the path is in the error).
pub fn workdir(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("arp-guard-promtool-{}-{tag}", std::process::id()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_become_series_held_to_the_end() {
        let s = |at: u64, text: &str| Sample {
            at: Duration::from_millis(at),
            instance: "node-a".into(),
            text: text.into(),
        };
        let samples = [
            s(0, "# HELP x\nx_total{a=\"1\"} 1\ny 2\n"),
            s(2100, "x_total{a=\"1\"} 3\n"),
        ];
        let got = series(&samples, Duration::from_secs(1));
        let x = &got["x_total{a=\"1\",instance=\"node-a\",job=\"arp-guard\"}"];
        assert_eq!(
            x.iter().map(|(k, v)| (*k, *v)).collect::<Vec<_>>(),
            [(0, 1.0), (2, 3.0)]
        );
        assert_eq!(values_text(x, 5, 0.0), "1 _ 3 3+0x2");
        assert_eq!(values_text(x, 5, 0.5), "1 _ 3 3.5+0.5x2");
        let grown = slopes(&got, 10, counter_like);
        assert_eq!(grown.len(), 1, "{grown:?}");
        assert_eq!(grown.values().next(), Some(&1.0));
        assert!(got.contains_key("y{instance=\"node-a\",job=\"arp-guard\"}"));
    }
}
