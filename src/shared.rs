//! [`SharedList`]: a list whose items are held by reference count, for lists that are copied
//! whole and changed little (a recording's events, which sessions, views and messages built
//! from them share; a replay's calls).

use std::sync::Arc;

use serde::{Serialize, Serializer};

/// `a == b` for shared values, the same allocation seen without a look (`Arc`'s `==` compares
/// contents; its pointer shortcut is for `Eq` sized types only): for inputs a session gathers
/// at every request from lists and texts it keeps.
pub fn same<T: ?Sized + PartialEq>(a: &Arc<T>, b: &Arc<T>) -> bool {
    Arc::ptr_eq(a, b) || a == b
}

/// A list of `T`, each item behind an `Arc`: cloning the list, or taking items of one into
/// another ([`SharedList::shared`], [`SharedList::push_shared`]), copies pointers, not items.
/// Read as a list of `T` (`iter`, `get`, indexing); changing an item ([`SharedList::get_mut`],
/// `IndexMut`, [`SharedList::iter_mut`]) copies it first when another list still holds it
/// (copy on write), so a change never reaches another list. Serializes as the list it holds.
#[derive(Debug, Clone, PartialEq)]
pub struct SharedList<T>(Vec<Arc<T>>);

/// [`SharedList::iter`].
pub type SharedIter<'a, T> = std::iter::Map<std::slice::Iter<'a, Arc<T>>, fn(&'a Arc<T>) -> &'a T>;

fn item<T>(item: &Arc<T>) -> &T {
    item
}

impl<T> Default for SharedList<T> {
    fn default() -> Self {
        SharedList(Vec::new())
    }
}

impl<T> SharedList<T> {
    pub fn new() -> Self {
        SharedList(Vec::new())
    }

    pub fn with_capacity(capacity: usize) -> Self {
        SharedList(Vec::with_capacity(capacity))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn get(&self, index: usize) -> Option<&T> {
        self.0.get(index).map(|e| &**e)
    }

    pub fn first(&self) -> Option<&T> {
        self.get(0)
    }

    pub fn last(&self) -> Option<&T> {
        self.0.last().map(|e| &**e)
    }

    pub fn iter(&self) -> SharedIter<'_, T> {
        self.0.iter().map(item as fn(&Arc<T>) -> &T)
    }

    pub fn push(&mut self, value: T) {
        self.0.push(Arc::new(value));
    }

    /// The shared item at `index`, to put in another list without a copy.
    pub fn shared(&self, index: usize) -> &Arc<T> {
        &self.0[index]
    }

    pub fn push_shared(&mut self, value: Arc<T>) {
        self.0.push(value);
    }

    pub fn truncate(&mut self, len: usize) {
        self.0.truncate(len);
    }
}

impl<T: Clone> SharedList<T> {
    /// The item at `index` to change (copied first when another list holds it).
    pub fn get_mut(&mut self, index: usize) -> Option<&mut T> {
        self.0.get_mut(index).map(Arc::make_mut)
    }

    /// The last item to change (copied first when another list holds it).
    pub fn last_mut(&mut self) -> Option<&mut T> {
        self.0.last_mut().map(Arc::make_mut)
    }

    /// Every item to change (each copied first when another list holds it).
    pub fn iter_mut(&mut self) -> impl DoubleEndedIterator<Item = &mut T> {
        self.0.iter_mut().map(Arc::make_mut)
    }

    /// The items, each taken without a copy when no other list holds it.
    pub fn into_vec(self) -> Vec<T> {
        self.0.into_iter().map(|e| Arc::try_unwrap(e).unwrap_or_else(|shared| (*shared).clone())).collect()
    }
}

impl<T> std::ops::Index<usize> for SharedList<T> {
    type Output = T;
    fn index(&self, index: usize) -> &T {
        &self.0[index]
    }
}

impl<T: Clone> std::ops::IndexMut<usize> for SharedList<T> {
    fn index_mut(&mut self, index: usize) -> &mut T {
        Arc::make_mut(&mut self.0[index])
    }
}

impl<T> From<Vec<T>> for SharedList<T> {
    fn from(items: Vec<T>) -> Self {
        items.into_iter().collect()
    }
}

impl<T> FromIterator<T> for SharedList<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        SharedList(iter.into_iter().map(Arc::new).collect())
    }
}

impl<T> Extend<T> for SharedList<T> {
    fn extend<I: IntoIterator<Item = T>>(&mut self, iter: I) {
        self.0.extend(iter.into_iter().map(Arc::new));
    }
}

impl<'a, T> IntoIterator for &'a SharedList<T> {
    type Item = &'a T;
    type IntoIter = SharedIter<'a, T>;
    fn into_iter(self) -> SharedIter<'a, T> {
        self.iter()
    }
}

impl<'a, T: Clone> IntoIterator for &'a mut SharedList<T> {
    type Item = &'a mut T;
    type IntoIter = std::iter::Map<std::slice::IterMut<'a, Arc<T>>, fn(&'a mut Arc<T>) -> &'a mut T>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter_mut().map(Arc::make_mut as fn(&mut Arc<T>) -> &mut T)
    }
}

impl<T: Clone> IntoIterator for SharedList<T> {
    type Item = T;
    type IntoIter = std::vec::IntoIter<T>;
    fn into_iter(self) -> Self::IntoIter {
        self.into_vec().into_iter()
    }
}

impl<T: Serialize> Serialize for SharedList<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter())
    }
}

/// A list that mostly grows at its end, copied whole often and changed in place by one
/// holder: the items before the last [`Chunked::freeze`] in shared chunks that every copy
/// holds by pointer, and those added since. (A run is copied every few dozen steps to go on
/// from later, and most copies are dropped unused: each would otherwise copy, then drop, its
/// whole conversation.) A chunk is never changed: cut short, the list keeps a leading part of
/// it. Read in order from a position ([`Chunked::iter_from`]); shown as the list it is,
/// wherever its chunks end.
#[derive(Clone)]
pub struct Chunked<T> {
    /// Each chunk with how many of its leading items are the list's.
    frozen: Vec<(Arc<Vec<T>>, usize)>,
    frozen_len: usize,
    tail: Vec<T>,
}

impl<T> Default for Chunked<T> {
    fn default() -> Self {
        Chunked { frozen: Vec::new(), frozen_len: 0, tail: Vec::new() }
    }
}

impl<T> Chunked<T> {
    pub fn len(&self) -> usize {
        self.frozen_len + self.tail.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn extend(&mut self, more: impl IntoIterator<Item = T>) {
        self.tail.extend(more);
    }

    pub fn clear(&mut self) {
        *self = Chunked::default();
    }

    /// Moves the items added since the last freeze into a shared chunk.
    pub fn freeze(&mut self) {
        if !self.tail.is_empty() {
            let tail = std::mem::take(&mut self.tail);
            self.frozen_len += tail.len();
            let len = tail.len();
            self.frozen.push((Arc::new(tail), len));
        }
    }

    /// Keeps the first `len` items: the chunks past them are let go, and of a chunk they end
    /// in, only its leading items count.
    pub fn truncate(&mut self, len: usize) {
        if len >= self.frozen_len {
            self.tail.truncate(len - self.frozen_len);
            return;
        }
        self.tail.clear();
        while let Some((_, used)) = self.frozen.last_mut() {
            let start = self.frozen_len - *used;
            if start >= len {
                self.frozen_len = start;
                self.frozen.pop();
            } else {
                *used = len - start;
                self.frozen_len = len;
                break;
            }
        }
    }

    /// The item at `index`. (Those from the tail on pass over no chunk; a chunk is found from
    /// the last one back.)
    pub fn get(&self, index: usize) -> Option<&T> {
        if index >= self.frozen_len {
            return self.tail.get(index - self.frozen_len);
        }
        let mut start = self.frozen_len;
        for (chunk, used) in self.frozen.iter().rev() {
            start -= used;
            if index >= start {
                return chunk.get(index - start);
            }
        }
        None
    }

    /// The items from `from` on, in order. (Those from the tail on pass over no chunk.)
    pub fn iter_from(&self, from: usize) -> impl Iterator<Item = &T> {
        let chunks = if from >= self.frozen_len { &[][..] } else { &self.frozen[..] };
        let mut start = 0;
        let frozen = chunks.iter().flat_map(move |(chunk, used)| {
            let first = start;
            start += used;
            chunk[..*used].get(from.saturating_sub(first)..).unwrap_or_default()
        });
        frozen.chain(self.tail.get(from.saturating_sub(self.frozen_len)..).unwrap_or_default())
    }
}

impl<T: Clone> Chunked<T> {
    pub fn extend_from_slice(&mut self, more: &[T]) {
        self.tail.extend_from_slice(more);
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for Chunked<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter_from(0)).finish()
    }
}

impl<T> From<Vec<T>> for Chunked<T> {
    fn from(tail: Vec<T>) -> Self {
        Chunked { frozen: Vec::new(), frozen_len: 0, tail }
    }
}

/// A number no other call in this process returns (from 1 up): names a value's state (a scan,
/// a flattened request, a tree's lineage) so that work kept for it is matched by equality only.
/// Which number a value gets depends on the schedule, so it is never output.
pub fn fresh_stamp() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// `{head}{counted}{relation}{limit})`, as `format!` writes it, made at its size without the
/// formatting machinery: a chain stage's reason names its count and limit on every request
/// (`below threshold (n < t)`), and a branch writes it again for each row it takes over.
pub fn counted_against(head: &str, counted: u64, relation: &str, limit: u64) -> String {
    let (mut a, mut b) = (itoa::Buffer::new(), itoa::Buffer::new());
    [head, a.format(counted), relation, b.format(limit), ")"].concat()
}

#[cfg(test)]
mod tests {
    use super::Chunked;
    use proptest::prelude::*;

    /// What a list undergoes: items pushed, a cut of up to three items, a freeze that keeps a
    /// copy, and going on from one of the copies kept.
    #[derive(Clone, Debug)]
    enum Op {
        Push(u8),
        Cut(usize),
        FreezeAndCopy,
        GoOnFrom(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![4 => (1u8..4).prop_map(Op::Push), 1 => (0usize..4).prop_map(Op::Cut), 1 => Just(Op::FreezeAndCopy), 1 => any::<usize>().prop_map(Op::GoOnFrom)]
    }

    proptest! {
        /// A chunked list and its copies read as plain lists under the same pushes, cuts and
        /// freezes, whichever copy goes on, from every position.
        #[test]
        fn chunked_lists_read_as_plain_lists(ops in prop::collection::vec(op(), 0..200)) {
            let mut list: Chunked<u32> = Chunked::default();
            let mut plain: Vec<u32> = Vec::new();
            let mut copies: Vec<(Chunked<u32>, Vec<u32>)> = Vec::new();
            for (step, op) in ops.into_iter().enumerate() {
                match op {
                    Op::Push(n) => {
                        let items: Vec<u32> = (0..u32::from(n)).map(|k| step as u32 * 4 + k).collect();
                        list.extend_from_slice(&items);
                        plain.extend_from_slice(&items);
                    }
                    Op::Cut(by) => {
                        let len = plain.len().saturating_sub(by);
                        list.truncate(len);
                        plain.truncate(len);
                    }
                    Op::FreezeAndCopy => {
                        list.freeze();
                        copies.push((list.clone(), plain.clone()));
                    }
                    Op::GoOnFrom(at) if !copies.is_empty() => {
                        let at = at % copies.len();
                        (list, plain) = copies.swap_remove(at);
                    }
                    Op::GoOnFrom(_) => {}
                }
                prop_assert_eq!(list.len(), plain.len());
                for from in 0..plain.len() + 2 {
                    prop_assert_eq!(list.iter_from(from).copied().collect::<Vec<_>>(), plain.get(from..).unwrap_or_default());
                    prop_assert_eq!(list.get(from), plain.get(from));
                }
            }
            for (copy, plain) in &copies {
                prop_assert_eq!(copy.iter_from(0).copied().collect::<Vec<_>>(), plain.clone());
            }
        }
    }
}
