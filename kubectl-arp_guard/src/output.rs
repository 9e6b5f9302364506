//! The plugin's output: aligned columns for people, JSON and YAML of the
//! same documents for programs.

use anyhow::Result;
use serde::Serialize;

use guard_wire::plugin_cli::Format;

/// `doc` as JSON or YAML (None for the table formats).
pub fn document<T: Serialize>(format: Format, doc: &T) -> Result<Option<String>> {
    Ok(match format {
        Format::Json => Some(serde_json::to_string_pretty(doc)? + "\n"),
        Format::Yaml => Some(serde_saphyr::to_string(doc)?),
        Format::Table | Format::Wide => None,
    })
}

/// Rows as aligned columns (the first row is the header); the last column
/// is not padded.
pub fn columns(rows: &[Vec<String>]) -> String {
    let n = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..n)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for r in rows {
        let mut line = String::new();
        for (c, cell) in r.iter().enumerate() {
            if c + 1 == r.len() {
                line.push_str(cell);
            } else {
                line.push_str(cell);
                let pad = widths[c] - cell.chars().count() + 2;
                line.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// Seconds as kubectl shows an age: `45s`, `3m`, `2h`, `4d`.
pub fn ago(s: u64) -> String {
    match s {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

/// Every line of `text` with `label` before it (a node's own output).
pub fn labelled(label: &str, text: &str) -> String {
    text.lines().map(|l| format!("{label:<14} {l}\n")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_and_ages_read_like_kubectl() {
        let rows = vec![
            vec!["IP".to_string(), "OWNER".into(), "NOTE".into()],
            vec!["198.51.100.100".into(), "node-a".into(), "x".into()],
        ];
        assert_eq!(
            columns(&rows),
            "IP              OWNER   NOTE\n198.51.100.100  node-a  x\n"
        );
        assert_eq!(
            (ago(5), ago(300), ago(7300), ago(200_000)),
            ("5s".into(), "5m".into(), "2h".into(), "2d".into())
        );
        assert_eq!(
            labelled("node-a", "one\ntwo"),
            "node-a         one\nnode-a         two\n"
        );
    }

    #[test]
    fn yaml_and_json_say_the_same() {
        #[derive(Serialize)]
        struct D {
            ip: &'static str,
            n: u32,
        }
        let d = D {
            ip: "198.51.100.100",
            n: 2,
        };
        let y = document(Format::Yaml, &d).unwrap().unwrap();
        let j = document(Format::Json, &d).unwrap().unwrap();
        let from_yaml: serde_json::Value = serde_saphyr::from_str(&y).unwrap();
        let from_json: serde_json::Value = serde_json::from_str(&j).unwrap();
        assert_eq!(from_yaml, from_json, "{y}");
        assert_eq!(from_json["n"], 2);
        assert!(document(Format::Table, &d).unwrap().is_none());
    }
}
