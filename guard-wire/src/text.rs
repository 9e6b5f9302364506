//! Text from outside (a file, the cluster, `/proc`, a guard's answer) as it
//! is shown to humans and logged: never in full when huge. One rule for the
//! daemon and the plugin.

/// At most `max` characters of `s`, marked when cut (with the full length,
/// so that a reader knows how much was left out).
pub fn clip(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        None => s.to_owned(),
        Some((i, _)) => format!("{}...({} bytes)", &s[..i], s.len()),
    }
}

#[cfg(test)]
mod tests {
    use super::clip;

    #[test]
    fn clips_by_characters_and_says_how_long_it_was() {
        assert_eq!(clip("short", 10), "short");
        assert_eq!(clip("abcdef", 3), "abc...(6 bytes)");
        // Never inside a character.
        assert_eq!(clip("ééé", 1), "é...(6 bytes)");
    }
}
