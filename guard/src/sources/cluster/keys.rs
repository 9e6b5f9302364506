//! An object's key, and the set an index maps one key to. Almost always it holds one key (an
//! IP carried by one Service, a Lease deciding one Service, one Lease per
//! deadline): kept inline then, not in a set of its own, so that an index
//! costs a few dozen bytes per entry rather than a tree node each.

use std::{collections::BTreeSet, sync::Arc};

/// namespace/name of a namespaced object. Shared, not copied, by the
/// indexes that refer to it (a clone is two reference counts).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    pub ns: Arc<str>,
    pub name: Arc<str>,
}

impl Key {
    pub fn new(ns: impl Into<Arc<str>>, name: impl Into<Arc<str>>) -> Self {
        Key {
            ns: ns.into(),
            name: name.into(),
        }
    }
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.ns, self.name)
    }
}

/// A sorted set of keys, inline while it holds at most one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Keys {
    #[default]
    Empty,
    One(Key),
    Many(BTreeSet<Key>),
}

impl Keys {
    /// Add `k`; whether it was not there.
    pub fn insert(&mut self, k: Key) -> bool {
        let (next, added) = match std::mem::take(self) {
            Keys::Empty => (Keys::One(k), true),
            Keys::One(o) if o == k => (Keys::One(o), false),
            Keys::One(o) => (Keys::Many(BTreeSet::from([o, k])), true),
            Keys::Many(mut s) => {
                let added = s.insert(k);
                (Keys::Many(s), added)
            }
        };
        *self = next;
        added
    }

    /// Take `k` away; whether it was there.
    pub fn remove(&mut self, k: &Key) -> bool {
        let (next, removed) = match std::mem::take(self) {
            Keys::One(o) if &o == k => (Keys::Empty, true),
            Keys::Many(mut s) => {
                let removed = s.remove(k);
                let next = match s.len() {
                    0 => Keys::Empty,
                    1 => s.pop_first().map_or(Keys::Empty, Keys::One),
                    _ => Keys::Many(s),
                };
                (next, removed)
            }
            other => (other, false),
        };
        *self = next;
        removed
    }

    pub fn is_empty(&self) -> bool {
        matches!(self, Keys::Empty)
    }

    pub fn len(&self) -> usize {
        match self {
            Keys::Empty => 0,
            Keys::One(_) => 1,
            Keys::Many(s) => s.len(),
        }
    }

    pub fn contains(&self, k: &Key) -> bool {
        match self {
            Keys::Empty => false,
            Keys::One(o) => o == k,
            Keys::Many(s) => s.contains(k),
        }
    }

    /// In order.
    pub fn iter(&self) -> Iter<'_> {
        let (one, many) = match self {
            Keys::Empty => (None, None),
            Keys::One(k) => (Some(k), None),
            Keys::Many(s) => (None, Some(s.iter())),
        };
        one.into_iter().chain(many.into_iter().flatten())
    }
}

/// [`Keys::iter`].
pub type Iter<'a> = std::iter::Chain<
    std::option::IntoIter<&'a Key>,
    std::iter::Flatten<std::option::IntoIter<std::collections::btree_set::Iter<'a, Key>>>,
>;

impl<'a> IntoIterator for &'a Keys {
    type Item = &'a Key;
    type IntoIter = Iter<'a>;
    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn behaves_as_a_sorted_set() {
        let k = |n: &str| Key::new("ns", n);
        let mut s = Keys::default();
        let mut reference = BTreeSet::new();
        for (add, n) in [
            (true, "b"),
            (true, "b"),
            (true, "a"),
            (true, "c"),
            (false, "a"),
            (false, "x"),
            (false, "c"),
            (false, "b"),
            (true, "d"),
        ] {
            let (got, want) = if add {
                (s.insert(k(n)), reference.insert(k(n)))
            } else {
                (s.remove(&k(n)), reference.remove(&k(n)))
            };
            assert_eq!(got, want, "{add} {n}");
            assert_eq!(
                s.iter().collect::<Vec<_>>(),
                reference.iter().collect::<Vec<_>>()
            );
            assert_eq!(
                (s.len(), s.is_empty()),
                (reference.len(), reference.is_empty())
            );
            assert_eq!(s.contains(&k("d")), reference.contains(&k("d")));
        }
        assert!(matches!(s, Keys::One(_)), "back inline with one key");
    }
}
