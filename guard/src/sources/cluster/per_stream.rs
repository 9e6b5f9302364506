//! The feed's streams by number, typed: what is kept per stream (the
//! feed's state, the loop's running tasks, the hub's generations) is a
//! [`PerStream`], indexed only by a [`StreamId`].

/// One stream of the feed. Made only by [`PerStream`], whose tables (the
/// feed's state, the loop's running tasks, the hub's generations) are the
/// only things it indexes: a stream number cannot be confused with a
/// count, nor index a table of something else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StreamId(usize);

impl StreamId {
    /// The `i`th stream, as tests and the cost bench name them.
    #[cfg(any(test, feature = "testing"))]
    pub const fn nth(i: usize) -> Self {
        StreamId(i)
    }
}

/// Something kept per stream, in the feed's order of streams.
#[derive(Debug, Clone)]
pub struct PerStream<T>(Vec<T>);

impl<T> PerStream<T> {
    pub fn new(v: Vec<T>) -> Self {
        PerStream(v)
    }
    /// The same streams, with `f` of each.
    pub fn map<U>(&self, f: impl FnMut(StreamId) -> U) -> PerStream<U> {
        PerStream(self.ids().map(f).collect())
    }
    pub fn ids(&self) -> impl Iterator<Item = StreamId> + use<T> {
        (0..self.0.len()).map(StreamId)
    }
    pub fn get(&self, id: StreamId) -> Option<&T> {
        self.0.get(id.0)
    }
    pub fn get_mut(&mut self, id: StreamId) -> Option<&mut T> {
        self.0.get_mut(id.0)
    }
    /// Each stream's, with its id.
    pub fn enumerate(&self) -> impl Iterator<Item = (StreamId, &T)> {
        self.0.iter().enumerate().map(|(i, t)| (StreamId(i), t))
    }
    pub fn iter(&self) -> std::slice::Iter<'_, T> {
        self.0.iter()
    }
}

impl<T> std::ops::Index<StreamId> for PerStream<T> {
    type Output = T;
    fn index(&self, id: StreamId) -> &T {
        &self.0[id.0]
    }
}

impl<T> std::ops::IndexMut<StreamId> for PerStream<T> {
    fn index_mut(&mut self, id: StreamId) -> &mut T {
        &mut self.0[id.0]
    }
}
