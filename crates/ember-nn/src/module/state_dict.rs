//! [`StateDict`]: named tensors in insertion order, as PyTorch's `OrderedDict`.

use std::collections::HashMap;

use crate::Tensor;

/// Named tensors, as `state_dict()` returns them: the parameters and buffers of a module by
/// their dotted names (`0.weight`), or an optimizer's or a scheduler's state. Keys keep the
/// order they were inserted in, as the `OrderedDict` PyTorch returns: a module's dict lists
/// its entries in PyTorch's order (`0.weight`, `0.bias`, `1.weight`, ... — not sorted as
/// text, where `10.weight` would come before `2.weight`). Inserting an existing key
/// replaces its value in place. Saveable with safetensors as is.
#[derive(Clone, Default)]
pub struct StateDict {
    entries: Vec<(String, Tensor)>,
    index: HashMap<String, usize>,
}

impl StateDict {
    /// An empty dict.
    pub fn new() -> Self {
        Self::default()
    }

    /// The number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Inserts `value` under `key`: at the end for a new key, in place for an existing one
    /// (returning the value it replaces).
    pub fn insert(&mut self, key: String, value: Tensor) -> Option<Tensor> {
        match self.index.get(&key) {
            Some(&i) => Some(std::mem::replace(&mut self.entries[i].1, value)),
            None => {
                self.index.insert(key.clone(), self.entries.len());
                self.entries.push((key, value));
                None
            }
        }
    }

    /// The tensor under `key`.
    pub fn get(&self, key: &str) -> Option<&Tensor> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }

    /// The stored key and its tensor.
    pub fn get_key_value(&self, key: &str) -> Option<(&String, &Tensor)> {
        self.index.get(key).map(|&i| {
            let (k, v) = &self.entries[i];
            (k, v)
        })
    }

    /// Whether `key` is present.
    pub fn contains_key(&self, key: &str) -> bool {
        self.index.contains_key(key)
    }

    /// Removes `key`, keeping the others in order.
    pub fn remove(&mut self, key: &str) -> Option<Tensor> {
        let i = self.index.remove(key)?;
        let (_, v) = self.entries.remove(i);
        for (k, _) in &self.entries[i..] {
            if let Some(j) = self.index.get_mut(k) {
                *j -= 1;
            }
        }
        Some(v)
    }

    /// The keys, in order.
    pub fn keys(&self) -> Keys<'_> {
        Keys(self.entries.iter())
    }

    /// The tensors, in key order.
    pub fn values(&self) -> impl DoubleEndedIterator<Item = &Tensor> + ExactSizeIterator {
        self.entries.iter().map(|(_, v)| v)
    }

    /// The entries, in order.
    pub fn iter(&self) -> Iter<'_> {
        Iter(self.entries.iter())
    }

    /// Sorts the entries by key (as text).
    pub fn sort_keys(&mut self) {
        self.entries.sort_by(|a, b| a.0.cmp(&b.0));
        for (i, (k, _)) in self.entries.iter().enumerate() {
            if let Some(j) = self.index.get_mut(k) {
                *j = i;
            }
        }
    }
}

/// The keys of a [`StateDict`], in order.
#[derive(Clone)]
pub struct Keys<'a>(std::slice::Iter<'a, (String, Tensor)>);

impl<'a> Iterator for Keys<'a> {
    type Item = &'a String;
    fn next(&mut self) -> Option<&'a String> {
        self.0.next().map(|(k, _)| k)
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        self.0.size_hint()
    }
}

impl DoubleEndedIterator for Keys<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        self.0.next_back().map(|(k, _)| k)
    }
}

impl ExactSizeIterator for Keys<'_> {}

impl std::fmt::Debug for Keys<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.clone()).finish()
    }
}

/// The entries of a [`StateDict`], in order.
#[derive(Clone, Debug)]
pub struct Iter<'a>(std::slice::Iter<'a, (String, Tensor)>);

impl<'a> Iterator for Iter<'a> {
    type Item = (&'a String, &'a Tensor);
    fn next(&mut self) -> Option<Self::Item> {
        self.0.next().map(|(k, v)| (k, v))
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        self.0.size_hint()
    }
}

impl DoubleEndedIterator for Iter<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        self.0.next_back().map(|(k, v)| (k, v))
    }
}

impl ExactSizeIterator for Iter<'_> {}

impl<'a> IntoIterator for &'a StateDict {
    type Item = (&'a String, &'a Tensor);
    type IntoIter = Iter<'a>;
    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

impl IntoIterator for StateDict {
    type Item = (String, Tensor);
    type IntoIter = std::vec::IntoIter<(String, Tensor)>;
    fn into_iter(self) -> Self::IntoIter {
        self.entries.into_iter()
    }
}

impl FromIterator<(String, Tensor)> for StateDict {
    fn from_iter<I: IntoIterator<Item = (String, Tensor)>>(iter: I) -> Self {
        let mut d = StateDict::new();
        d.extend(iter);
        d
    }
}

impl Extend<(String, Tensor)> for StateDict {
    fn extend<I: IntoIterator<Item = (String, Tensor)>>(&mut self, iter: I) {
        for (k, v) in iter {
            self.insert(k, v);
        }
    }
}

impl std::ops::Index<&str> for StateDict {
    type Output = Tensor;
    /// The tensor under `key`; panics when it is absent, as indexing a map does (use
    /// [`get`](StateDict::get) for an `Option`).
    fn index(&self, key: &str) -> &Tensor {
        match self.get(key) {
            Some(t) => t,
            None => panic!("no key {key:?} in the state dict"),
        }
    }
}

impl std::fmt::Debug for StateDict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.entries.iter().map(|(k, v)| (k, v.shape())))
            .finish()
    }
}
