//! Completion of `kubectl arp-guard`: kubectl (1.26+) runs
//! `kubectl_complete-arp_guard` from PATH with the words typed so far, the
//! one being completed last (empty for a new word), and reads one
//! candidate per line, then `:4` (cobra's "no file completion"). The
//! candidates are the plugin's own subcommands and flags, from its clap
//! definition (one place).

use clap::CommandFactory as _;

use guard_wire::plugin_cli::PluginCli;

/// The candidates for `words` (the last is being completed).
pub fn complete(words: &[String]) -> String {
    let cmd = PluginCli::command();
    let current = words.last().map(String::as_str).unwrap_or("");
    let before = &words[..words.len().saturating_sub(1)];
    let previous = before.last().map(String::as_str);
    let mut out: Vec<String> = Vec::new();
    // A flag's value.
    if matches!(previous, Some("-o" | "--output")) {
        out.extend(["table", "wide", "json", "yaml"].map(String::from));
    } else {
        let sub = (before.iter()).find_map(|w| cmd.get_subcommands().find(|s| s.get_name() == w));
        if current.starts_with('-') {
            let args = (cmd.get_arguments()).chain(sub.into_iter().flat_map(|s| s.get_arguments()));
            for a in args {
                if let Some(l) = a.get_long() {
                    out.push(format!("--{l}"));
                }
            }
        } else if sub.is_none() {
            out.extend(cmd.get_subcommands().map(|s| s.get_name().to_owned()));
        }
    }
    let mut text: String = (out.into_iter())
        .filter(|c| c.starts_with(current))
        .map(|c| c + "\n")
        .collect();
    text.push_str(":4\n");
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(words: &[&str]) -> Vec<String> {
        words.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn subcommands_then_flags_then_formats() {
        let c = complete(&w(&["st"]));
        assert_eq!(c, "status\n:4\n");
        let c = complete(&w(&[""]));
        for s in [
            "status",
            "clients",
            "responders",
            "explain",
            "events",
            "doctor",
        ] {
            assert!(c.contains(&format!("{s}\n")), "{c}");
        }
        let c = complete(&w(&["doctor", "--a"]));
        assert_eq!(c, "--all-nodes\n:4\n");
        let c = complete(&w(&["status", "--con"]));
        assert!(c.contains("--context\n"), "{c}");
        assert_eq!(complete(&w(&["status", "-o", "y"])), "yaml\n:4\n");
    }
}
