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
