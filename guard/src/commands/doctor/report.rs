//! What `arp-guard doctor` prints: one line per check (status, check, value,
//! why it matters, the fix), or one JSON document with a stable schema.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckStatus {
    Pass,
    Warn,
    Fail,
    /// Could not be checked (no such interface, no API, no permission).
    Skip,
}

impl CheckStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            CheckStatus::Pass => "pass",
            CheckStatus::Warn => "warn",
            CheckStatus::Fail => "fail",
            CheckStatus::Skip => "skip",
        }
    }
}

/// One check's verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Check {
    /// A stable identifier: `arp_ignore`, `rp_filter`, `kube_proxy`, ...
    pub check: String,
    /// What it was checked on (an interface), if anything in particular.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    pub status: CheckStatus,
    /// The value found.
    pub value: String,
    /// Why it matters (for a skip: why it could not be checked).
    pub why: String,
    /// What to do about it (warn and fail; sometimes skip).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Check {
    pub fn new(
        check: &str,
        subject: Option<&str>,
        status: CheckStatus,
        value: impl Into<String>,
        why: impl Into<String>,
    ) -> Self {
        Check {
            check: check.to_owned(),
            subject: subject.map(str::to_owned),
            status,
            value: value.into(),
            why: why.into(),
            fix: None,
        }
    }

    pub fn fix(mut self, fix: impl Into<String>) -> Self {
        self.fix = Some(fix.into());
        self
    }

    /// `check` or `check subject`.
    pub fn label(&self) -> String {
        match &self.subject {
            Some(s) => format!("{} {s}", self.check),
            None => self.check.clone(),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    pub pass: usize,
    pub warn: usize,
    pub fail: usize,
    pub skip: usize,
}

/// `arp-guard doctor -o json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// The schema's version; bumped when a field changes meaning.
    pub version: u32,
    pub proc_root: String,
    pub sys_root: String,
    /// The announcing interfaces checked, and how they were chosen.
    pub interfaces: Vec<String>,
    pub interfaces_from: String,
    pub summary: Summary,
    pub checks: Vec<Check>,
}

impl Report {
    pub const VERSION: u32 = 1;

    pub fn summarize(checks: &[Check]) -> Summary {
        let mut s = Summary::default();
        for c in checks {
            *match c.status {
                CheckStatus::Pass => &mut s.pass,
                CheckStatus::Warn => &mut s.warn,
                CheckStatus::Fail => &mut s.fail,
                CheckStatus::Skip => &mut s.skip,
            } += 1;
        }
        s
    }

    /// The failed checks' labels, for the exit message.
    pub fn failed(&self) -> Vec<String> {
        self.checks
            .iter()
            .filter(|c| c.status == CheckStatus::Fail)
            .map(Check::label)
            .collect()
    }

    /// One line per check: status, check, value, then why (and the fix):
    /// `FAIL  arp_ignore eth0  0 (all 0, eth0 0) — why. Fix: what to do`.
    pub fn to_table(&self) -> String {
        let width = self
            .checks
            .iter()
            .map(|c| c.label().len())
            .max()
            .unwrap_or(0);
        let mut out = String::new();
        for c in &self.checks {
            let fix = c
                .fix
                .as_deref()
                .map(|f| format!(" Fix: {f}"))
                .unwrap_or_default();
            out += &format!(
                "{:<4}  {:<width$}  {} — {}.{fix}\n",
                c.status.as_str().to_uppercase(),
                c.label(),
                c.value,
                c.why
            );
        }
        let s = &self.summary;
        out += &format!(
            "{} pass, {} warn, {} fail, {} skip (interfaces: {}, from {})\n",
            s.pass,
            s.warn,
            s.fail,
            s.skip,
            if self.interfaces.is_empty() {
                "none".to_owned()
            } else {
                self.interfaces.join(", ")
            },
            self.interfaces_from
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_and_json() {
        let checks = vec![
            Check::new("ip_forward", None, CheckStatus::Pass, "1", "forwards"),
            Check::new(
                "arp_ignore",
                Some("eth0"),
                CheckStatus::Fail,
                "0",
                "answers",
            )
            .fix("set 1"),
        ];
        let r = Report {
            version: Report::VERSION,
            proc_root: "/proc".into(),
            sys_root: "/sys".into(),
            interfaces: vec!["eth0".into()],
            interfaces_from: "--interface".into(),
            summary: Report::summarize(&checks),
            checks,
        };
        let t = r.to_table();
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "PASS  ip_forward       1 — forwards.");
        assert_eq!(lines[1], "FAIL  arp_ignore eth0  0 — answers. Fix: set 1");
        assert!(lines[2].starts_with("1 pass, 0 warn, 1 fail, 0 skip"));
        assert_eq!(r.failed(), ["arp_ignore eth0"]);
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["checks"][1]["status"], "fail");
        assert_eq!(v["checks"][1]["subject"], "eth0");
        assert!(v["checks"][0].get("subject").is_none());
        assert_eq!(v["summary"]["fail"], 1);
        let back: Report = serde_json::from_value(v).unwrap();
        assert_eq!(back, r);
    }
}
