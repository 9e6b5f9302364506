//! The operator's pages as a reader meets them (issue 42): no page over
//! 2,500 words, and every term of the glossary linked to its entry where a
//! page first uses it. The operator's pages are docs/*.md but the
//! contributors' (design.md, testing.md); the glossary itself defines the
//! terms and is only held to the length. A term is a `### ` heading of
//! docs/glossary.md without a code span (those, `would_drop` say, are
//! code, which a page shows in code spans, not prose). Its first use is
//! its first occurrence, in any case, `-` read as a space, with an `s` or
//! none after it, in a page's prose: outside fenced blocks, code spans,
//! headings, HTML tags and link targets. It must sit in the text of a link
//! to the term's entry, or to the entry of a longer term containing it
//! ("[active census](glossary.md#active-census)" is a first use of
//! "census" too).

use std::path::{Path, PathBuf};

const MAX_WORDS: usize = 2500;
/// The contributors' pages under docs/.
const CONTRIBUTORS: [&str; 2] = ["design.md", "testing.md"];
const GLOSSARY: &str = "glossary.md";

fn docs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs")
}

/// (file name, text) of every operator page, the glossary included.
fn operator_pages() -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = (std::fs::read_dir(docs()).unwrap().flatten())
        .map(|e| e.path())
        .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "md"))
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read_to_string(&p).unwrap())
        })
        .filter(|(name, _)| !CONTRIBUTORS.contains(&name.as_str()))
        .collect();
    out.sort();
    out
}

/// A heading's anchor, as GitHub makes it.
fn slug(heading: &str) -> String {
    (heading.trim().to_lowercase().chars())
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// (anchor, name) of every heading of the glossary, and which of them are
/// terms (no code span in the heading).
fn entries(glossary: &str) -> Vec<(String, String, bool)> {
    (glossary.lines())
        .filter_map(|l| {
            let h = l.trim_start_matches('#');
            (l.starts_with('#') && h.starts_with(' ')).then(|| {
                let term = l.starts_with("### ") && !h.contains('`');
                (slug(h), normal(h.trim()), term)
            })
        })
        .collect()
}

/// Lower case, `-` as a space.
fn normal(s: &str) -> String {
    s.to_lowercase().replace('-', " ")
}

/// A page's prose: each visible character, lower case with `-` as a
/// space, and the target of the link whose text it is in.
fn prose(page: &str) -> Vec<(char, Option<String>)> {
    let mut text = String::new();
    let mut fenced = false;
    for line in page.lines() {
        let t = line.trim_start();
        if t.starts_with("```") {
            fenced = !fenced;
        } else if !fenced && !t.starts_with('#') {
            text.push_str(line);
            text.push(' ');
        }
    }
    let mut out = Vec::new();
    visible(&text.chars().collect::<Vec<_>>(), None, &mut out);
    out
}

/// The visible characters of `s` into `out`, each with `link`; code spans,
/// HTML tags and link targets left out, links' texts read with their
/// targets.
fn visible(s: &[char], link: Option<&str>, out: &mut Vec<(char, Option<String>)>) {
    let mut i = 0;
    while i < s.len() {
        match s[i] {
            '`' => {
                let run = s[i..].iter().take_while(|c| **c == '`').count();
                let close = (i + run..s.len()).find(|&j| {
                    s[j..].iter().take_while(|c| **c == '`').count() == run && s[j - 1] != '`'
                });
                // An unmatched backtick is a backtick.
                let Some(close) = close else {
                    out.push(('`', link.map(str::to_owned)));
                    i += 1;
                    continue;
                };
                out.push((' ', link.map(str::to_owned)));
                i = close + run;
            }
            '<' if s
                .get(i + 1)
                .is_some_and(|c| c.is_ascii_alphabetic() || *c == '/') =>
            {
                i = (i..s.len().min(i + 300))
                    .find(|&j| s[j] == '>')
                    .map_or(i + 1, |j| j + 1)
            }
            '[' => match link_at(s, i) {
                Some((text_end, target, end)) => {
                    visible(&s[i + 1..text_end], Some(&target), out);
                    i = end;
                }
                None => {
                    out.push(('[', link.map(str::to_owned)));
                    i += 1;
                }
            },
            c => {
                let c = if c == '-' {
                    ' '
                } else {
                    c.to_ascii_lowercase()
                };
                out.push((c, link.map(str::to_owned)));
                i += 1;
            }
        }
    }
}

/// A link `[text](target)` starting at `s[i]`: where its text ends, its
/// target, and where the link ends.
fn link_at(s: &[char], i: usize) -> Option<(usize, String, usize)> {
    let mut depth = 0;
    let mut j = i;
    let text_end = loop {
        match s.get(j)? {
            '[' => depth += 1,
            ']' if depth == 1 => break j,
            ']' => depth -= 1,
            '`' => j += 1 + s[j..].iter().skip(1).position(|c| *c == '`')?,
            _ => {}
        }
        j += 1;
    };
    if s.get(text_end + 1) != Some(&'(') {
        return None;
    }
    let close = (text_end + 2..s.len()).find(|&k| s[k] == ')')?;
    let target: String = s[text_end + 2..close].iter().collect();
    Some((text_end, target, close + 1))
}

/// Where `term` (normal form) first occurs as a word in `prose`, with an
/// `s` or nothing after it.
fn first_use(prose: &[(char, Option<String>)], term: &str) -> Option<usize> {
    let t: Vec<char> = term.chars().collect();
    let word = |k: usize| {
        prose
            .get(k)
            .is_some_and(|(c, _)| c.is_alphanumeric() || *c == '_')
    };
    (0..prose.len()).find(|&i| {
        let end = i + t.len();
        end <= prose.len()
            && prose[i..end].iter().map(|(c, _)| *c).eq(t.iter().copied())
            && !(i > 0 && word(i - 1))
            && (!word(end) || prose[end].0 == 's' && !word(end + 1))
    })
}

/// The anchor of a link to the glossary, from a page beside it.
fn glossary_anchor(target: &str) -> Option<&str> {
    target.strip_prefix("glossary.md#")
}

/// What is wrong with `page`'s first uses of the glossary's terms.
fn unlinked_first_uses(name: &str, page: &str, glossary: &str) -> Vec<String> {
    let entries = entries(glossary);
    let text = prose(page);
    let mut wrong = Vec::new();
    for (anchor, term, _) in entries.iter().filter(|e| e.2) {
        let Some(at) = first_use(&text, term) else {
            continue;
        };
        // The entries whose link counts: the term's own, a longer term's
        // that contains it.
        let good = |a: &str| {
            a == anchor
                || (entries.iter()).any(|(x, t, is)| *is && x == a && t.contains(term.as_str()))
        };
        if !text[at]
            .1
            .as_deref()
            .and_then(glossary_anchor)
            .is_some_and(good)
        {
            let around: String = (text
                [at.saturating_sub(30)..(at + term.len() + 30).min(text.len())])
                .iter()
                .map(|(c, _)| *c)
                .collect();
            wrong.push(format!("docs/{name}: the first \"{term}\" is not linked to glossary.md#{anchor}: ...{around}..."));
        }
    }
    wrong
}

/// Links to the glossary that land on no entry.
fn dangling(name: &str, page: &str, glossary: &str) -> Vec<String> {
    let anchors: Vec<String> = entries(glossary).into_iter().map(|e| e.0).collect();
    (prose(page).into_iter())
        .filter_map(|(_, l)| l)
        .filter_map(|l| glossary_anchor(&l).map(str::to_owned))
        .filter(|a| !anchors.contains(a))
        .map(|a| format!("docs/{name}: glossary.md#{a} is no entry"))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect()
}

#[test]
fn no_operator_page_is_over_2500_words() {
    let pages = operator_pages();
    assert!(
        pages.len() >= 10,
        "{} operator pages: is the reader broken?",
        pages.len()
    );
    let long: Vec<String> = (pages.iter())
        .map(|(name, text)| (name, text.split_whitespace().count()))
        .filter(|(_, words)| *words > MAX_WORDS)
        .map(|(name, words)| format!("docs/{name}: {words} words (at most {MAX_WORDS})"))
        .collect();
    assert!(long.is_empty(), "{}", long.join("\n"));
}

#[test]
fn every_glossary_term_is_linked_where_a_page_first_uses_it() {
    let glossary = std::fs::read_to_string(docs().join(GLOSSARY)).unwrap();
    let terms = entries(&glossary).iter().filter(|e| e.2).count();
    assert!(
        terms >= 15,
        "{terms} terms in the glossary: is the reader broken?"
    );
    let mut wrong = Vec::new();
    for (name, text) in operator_pages() {
        wrong.extend(dangling(&name, &text, &glossary));
        if name != GLOSSARY {
            wrong.extend(unlinked_first_uses(&name, &text, &glossary));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn a_first_use_is_read_as_a_reader_meets_it() {
    let g = "## Terms\n### census\n### active census\n### LB IP\n### `would_drop`\n";
    let check = |page: &str| unlinked_first_uses("p.md", page, g);
    assert!(check("The [census](glossary.md#census) and the census.").is_empty());
    assert!(check("An [active census](glossary.md#active-census), then census.").is_empty());
    assert_eq!(
        check("The census, then [census](glossary.md#census).").len(),
        1
    );
    assert!(check("`census` and\n```\ncensus\n```\n# census\n<a id=\"census\"></a>").is_empty());
    assert!(
        check("[`--no-census`](x.md#census) only").is_empty(),
        "a code span"
    );
    assert_eq!(
        check("[the census](cluster-view.md#census)").len(),
        1,
        "another page's link"
    );
    assert_eq!(
        check("two [LB IPs](glossary.md#census)").len(),
        1,
        "the wrong entry"
    );
    assert!(check("two [LB\nIPs](glossary.md#lb-ip), censuses, would_drop").is_empty());
    assert_eq!(dangling("p.md", "[x](glossary.md#nothing)", g).len(), 1);
    assert_eq!(
        slug("Blind, degraded, stale, not Ready: told apart"),
        "blind-degraded-stale-not-ready-told-apart"
    );
    assert_eq!(
        slug("`owned`, `foreign`, `unknown`"),
        "owned-foreign-unknown"
    );
}
