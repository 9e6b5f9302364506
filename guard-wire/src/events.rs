//! The Event reasons whose end is told by another: a Warning that a later
//! Normal Event of its pair on the same Service ended is history, not a
//! finding. The daemon posts both (its `Reason`, checked against this
//! table by its tests); `kubectl arp-guard status` reads them.

/// (the Warning's reason, the reason of the Normal Event that ends it).
pub const ENDED_BY: &[(&str, &str)] = &[
    ("ResponderConflict", "ResponderConflictResolved"),
    ("SplitElection", "SplitElectionResolved"),
    ("OwnerLinkDown", "OwnerLinkRestored"),
];

/// The reason of the Normal Event that ends a Warning of `warning`.
pub fn ended_by(warning: &str) -> Option<&'static str> {
    (ENDED_BY.iter())
        .find(|(w, _)| *w == warning)
        .map(|(_, end)| *end)
}

/// Whether a Warning of `reason`, last seen `age_s` seconds ago, was ended
/// by one of `normals` (reason and seconds since last seen, for the same
/// Service) posted after it. The same second counts as after: the daemon
/// posts an end only once its Warning was posted.
pub fn is_ended<'a>(
    reason: &str,
    age_s: i64,
    mut normals: impl Iterator<Item = (&'a str, i64)>,
) -> bool {
    let Some(end) = ended_by(reason) else {
        return false;
    };
    normals.any(|(r, age)| r == end && age <= age_s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_warning_is_ended_only_by_its_own_end_posted_after_it() {
        let normals = || [("OwnerLinkRestored", 20), ("SplitElectionResolved", 5)].into_iter();
        assert!(is_ended("OwnerLinkDown", 30, normals()));
        assert!(is_ended("OwnerLinkDown", 20, normals()), "same second");
        // Down again after it was restored: a finding.
        assert!(!is_ended("OwnerLinkDown", 10, normals()));
        assert!(!is_ended("ResponderConflict", 30, normals()));
        // Warnings without an end stay findings for as long as they are read.
        assert!(!is_ended("NodesAnswerARP", 30, normals()));
    }
}
