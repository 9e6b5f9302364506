//! The messages `docs/troubleshooting.md` quotes for a guard that does not
//! start or is not Ready, read out of the page itself, so that a test can
//! hold what the daemon prints to what the operator is told it prints.
//!
//! The form, on the page: each message is a fenced block whose info string
//! names it, ```` ```text startup:ID ````. Its lines are a run of
//! consecutive lines of what the daemon printed (its log, or `arp-guard
//! status`), indentation kept; `…` in a line stands for text the kernel or
//! a library adds (an errno's chain), and matches anything. Values the
//! page gives as the DaemonSet has them (the ownership file's path, the pin
//! directory) are read from `deploy/base/daemonset.yaml`, and a test puts
//! them in place of its own before comparing ([`assert_printed`]).
//!
//! The page is compiled in: the test binaries of the VM lane, which carry
//! no `docs/`, read it too (tests/privileges.rs, RLIMIT_MEMLOCK on 5.10).

/// The page, as built into the test.
pub const PAGE: &str = include_str!("../../docs/troubleshooting.md");
/// Where the page is, for messages.
const NAME: &str = "docs/troubleshooting.md";
/// The info string's prefix of a quoted message.
const TAG: &str = "```text startup:";

/// Every message id the page quotes, in page order.
pub fn ids() -> Vec<String> {
    (PAGE.lines())
        .filter_map(|l| l.trim_start().strip_prefix(TAG))
        .map(|id| id.trim().to_owned())
        .collect()
}

/// The lines the page quotes as `id` (the block's indentation removed).
#[track_caller]
pub fn quote(id: &str) -> Vec<String> {
    let mut lines = PAGE.lines();
    let fence = (lines.by_ref())
        .find(|l| l.trim_start().strip_prefix(TAG).map(str::trim) == Some(id))
        .unwrap_or_else(|| panic!("{NAME} quotes no message `{TAG}{id}`"));
    let indent = fence.len() - fence.trim_start().len();
    let body: Vec<String> = lines
        .take_while(|l| l.trim() != "```")
        .map(|l| l.get(indent..).unwrap_or(l.trim_start()).to_owned())
        .collect();
    assert!(!body.is_empty(), "{NAME}: `{TAG}{id}` is empty");
    body
}

/// Whether `line` is `pattern`, where each `…` of the pattern matches any text.
pub fn line_matches(pattern: &str, line: &str) -> bool {
    let parts: Vec<&str> = pattern.split('…').collect();
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if parts.len() == 1 {
        return line == pattern;
    }
    let Some(mut rest) = line.strip_prefix(first) else {
        return false;
    };
    for middle in &parts[1..parts.len() - 1] {
        match rest.find(middle) {
            Some(i) => rest = &rest[i + middle.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// Whether `text`, with each `(from, to)` of `subs` replaced, has the
/// quoted `lines` as a run of consecutive lines.
pub fn printed(lines: &[String], text: &str, subs: &[(&str, &str)]) -> bool {
    let got: Vec<String> = (text.lines())
        .map(|l| (subs.iter()).fold(l.to_owned(), |l, (from, to)| l.replace(from, to)))
        .collect();
    got.windows(lines.len())
        .any(|w| w.iter().zip(lines).all(|(g, q)| line_matches(q, g)))
}

/// The daemon printed the message the page quotes as `id`, word for word.
#[track_caller]
pub fn assert_printed(id: &str, text: &str, subs: &[(&str, &str)]) {
    let lines = quote(id);
    assert!(
        printed(&lines, text, subs),
        "{NAME} quotes `{id}` as\n{}\nbut the daemon printed (with {subs:?} replaced)\n{text}",
        lines.join("\n")
    );
}

/// A value the DaemonSet passes the daemon (`--flag=value` in its args).
#[track_caller]
pub fn daemonset_arg(flag: &str) -> String {
    let ds = crate::deploy::daemonset();
    let args = &ds["spec"]["template"]["spec"]["containers"][0]["args"];
    (args.as_array().into_iter().flatten())
        .filter_map(|a| a.as_str()?.strip_prefix(flag)?.strip_prefix('='))
        .map(str::to_owned)
        .next()
        .unwrap_or_else(|| panic!("deploy/base/daemonset.yaml passes no {flag}="))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quote_matches_its_run_of_lines_and_the_ellipsis_anything() {
        assert!(line_matches("a: …", "a: b: c"));
        assert!(line_matches("a … c", "a b c"));
        assert!(!line_matches("a … c", "a b"));
        assert!(!line_matches("a…a", "a"));
        let q = ["x /p".to_owned(), "  y".to_owned()];
        assert!(printed(&q, "w\nx /tmp/p\n  y\n", &[("/tmp/p", "/p")]));
        assert!(!printed(&q, "x /p\nw\n  y\n", &[]), "not consecutive");
    }
}
