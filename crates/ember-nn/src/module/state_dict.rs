//! [`StateDict`]: named tensors and plain values in insertion order, as PyTorch's
//! `OrderedDict` (and the `dict` given to `torch.save`), nested by dotted keys.

use std::collections::HashMap;

use super::value::{FromValue, Value, tensor_value, wrong};
use crate::{Result, Tensor};

/// Named tensors and plain values: what every `state_dict()` in Ember returns — a module's
/// (its parameters and buffers by dotted name, `0.weight`), an optimizer's, a learning-rate
/// scheduler's, a `GradScaler`'s — and what a checkpoint holds (`torch.save` of a dict).
///
/// - Tensor entries keep the order they were inserted in, as the `OrderedDict` PyTorch
///   returns: a module's dict lists its entries in PyTorch's order (`0.weight`, `0.bias`,
///   `1.weight`, ... — not sorted as text, where `10.weight` would come before
///   `2.weight`). Inserting an existing key replaces its value in place.
/// - Plain values ([`Value`]: integers, floats, bools, strings — the epoch, a scaler's
///   scale, a config) sit beside them ([`set`](StateDict::set),
///   [`item`](StateDict::item)).
/// - Nesting is by dotted keys, as PyTorch names them: [`with`](StateDict::with) puts a
///   whole dict under a prefix (`model.0.weight`, `optimizer.state.0.exp_avg`) and
///   [`sub`](StateDict::sub) takes it back out.
///
/// [`save`](crate::io::save) writes one to a safetensors file (the tensors as tensors, the
/// plain values in the metadata) and [`load`](crate::io::load) reads it back:
///
/// ```
/// use ember_nn::{Module, StateDict, io, layers::Linear};
/// use ember_nn::optim::{Optimizer, SGD, SgdOptions};
/// let model = Linear::new(3, 2, ())?;
/// let opt = SGD::new(model.parameters(), SgdOptions { lr: 0.1, ..Default::default() })?;
/// let state = StateDict::new()
///     .with("model", model.state_dict()?)
///     .with("optimizer", opt.state_dict()?)
///     .with("epoch", 3)
///     .with("note", "first run");
/// assert!(state.contains_key("model.weight"));
/// let path = std::env::temp_dir().join(format!("ember-sd-doc-{}.safetensors", std::process::id()));
/// io::save(&state, &path)?;
///
/// let back = io::load(&path, ember_tensor::Device::Cpu)?;
/// let copy = Linear::new(3, 2, ())?;
/// copy.load_state_dict(&back.sub("model"))?;
/// let epoch: usize = back.item("epoch")?;
/// assert_eq!((epoch, back.item::<String>("note")?.as_str()), (3, "first run"));
/// # std::fs::remove_file(&path).ok();
/// # Ok::<(), ember_nn::Error>(())
/// ```
#[derive(Clone, Default)]
pub struct StateDict {
    entries: Vec<(String, Tensor)>,
    index: HashMap<String, usize>,
    plain: Vec<(String, Value)>,
}

/// What [`StateDict::with`] puts under a key: a tensor, a plain value, or a whole dict
/// (nested under the key as a dotted prefix).
#[derive(Clone, Debug)]
pub enum StateItem {
    /// A tensor entry.
    Tensor(Tensor),
    /// A plain value.
    Value(Value),
    /// A dict, nested: its entry `k` lands under `key.k`.
    Dict(StateDict),
}

impl From<Tensor> for StateItem {
    fn from(t: Tensor) -> StateItem {
        StateItem::Tensor(t)
    }
}

impl From<&Tensor> for StateItem {
    fn from(t: &Tensor) -> StateItem {
        StateItem::Tensor(t.clone())
    }
}

impl From<StateDict> for StateItem {
    fn from(d: StateDict) -> StateItem {
        StateItem::Dict(d)
    }
}

macro_rules! item_from_value {
    ($($t:ty),*) => {$(
        impl From<$t> for StateItem {
            fn from(v: $t) -> StateItem {
                StateItem::Value(Value::from(v))
            }
        }
    )*};
}
item_from_value!(
    i8,
    i16,
    i32,
    i64,
    u8,
    u16,
    u32,
    u64,
    usize,
    isize,
    f32,
    f64,
    bool,
    &str,
    String,
    &String,
    Value,
    ember_tensor::Scalar
);

impl StateDict {
    /// An empty dict.
    pub fn new() -> Self {
        Self::default()
    }

    /// The number of entries, tensors and plain values.
    pub fn len(&self) -> usize {
        self.entries.len() + self.plain.len()
    }

    /// Whether there are no entries, tensor or plain.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.plain.is_empty()
    }

    /// Inserts the tensor `value` under `key`: at the end for a new key, in place for an
    /// existing one (returning the tensor it replaces). A plain value under `key` is
    /// dropped.
    pub fn insert(&mut self, key: String, value: Tensor) -> Option<Tensor> {
        self.plain.retain(|(k, _)| *k != key);
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

    /// Whether `key` is present, as a tensor or a plain value.
    pub fn contains_key(&self, key: &str) -> bool {
        self.index.contains_key(key) || self.value(key).is_some()
    }

    /// Sets the plain value under `key` (PyTorch's `d["epoch"] = 3`), returning the value
    /// it replaces. A tensor under `key` is dropped.
    pub fn set(&mut self, key: impl Into<String>, value: impl Into<Value>) -> Option<Value> {
        let key = key.into();
        let value = value.into();
        self.remove(&key);
        match self.plain.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => Some(std::mem::replace(v, value)),
            None => {
                self.plain.push((key, value));
                None
            }
        }
    }

    /// The plain value under `key`.
    pub fn value(&self, key: &str) -> Option<&Value> {
        self.plain.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// Removes the plain value under `key`.
    pub fn remove_value(&mut self, key: &str) -> Option<Value> {
        let i = self.plain.iter().position(|(k, _)| k == key)?;
        Some(self.plain.remove(i).1)
    }

    /// The plain values, in the order they were set.
    pub fn plain(&self) -> impl DoubleEndedIterator<Item = (&String, &Value)> + ExactSizeIterator {
        self.plain.iter().map(|(k, v)| (k, v))
    }

    /// The entry under `key` read as `T` (PyTorch's `ckpt["epoch"]`, or `.item()` of a
    /// 0-dim tensor): a plain value, or a one-element tensor. An error names the key and
    /// says what it found when the key is absent or holds something else.
    ///
    /// ```
    /// use ember_nn::StateDict;
    /// let d = StateDict::new().with("epoch", 3).with("lr", 0.1).with("arch", "cnn");
    /// assert_eq!(d.item::<usize>("epoch")?, 3);
    /// assert_eq!(d.item::<f64>("lr")?, 0.1);
    /// assert_eq!(d.item::<String>("arch")?, "cnn");
    /// let e = d.item::<usize>("arch").unwrap_err().to_string();
    /// assert!(e.contains("\"arch\": expected an integer of type usize, found a string"), "{e}");
    /// assert!(d.item::<usize>("step").is_err());
    /// # Ok::<(), ember_nn::Error>(())
    /// ```
    pub fn item<T: FromValue>(&self, key: &str) -> Result<T> {
        let value = match (self.value(key), self.get(key)) {
            (Some(v), _) => v.clone(),
            (None, Some(t)) => tensor_value(key, t)?,
            (None, None) => return Err(wrong(key, T::EXPECTED, "no such key")),
        };
        T::from_value(&value).ok_or_else(|| {
            let found = match &value {
                Value::Int(_) => format!("{} ({value})", value.kind()),
                _ => value.kind().to_string(),
            };
            wrong(key, T::EXPECTED, &found)
        })
    }

    /// `self` with `item` under `key`: a tensor, a plain value (a number, a bool, a
    /// string), or a whole dict nested under `key.` — the dict literal of `torch.save`:
    /// `{"model": model.state_dict(), "epoch": 3}`.
    pub fn with(mut self, key: impl Into<String>, item: impl Into<StateItem>) -> StateDict {
        self.put(key, item);
        self
    }

    /// [`with`](StateDict::with) in place.
    pub fn put(&mut self, key: impl Into<String>, item: impl Into<StateItem>) {
        let key = key.into();
        match item.into() {
            StateItem::Tensor(t) => {
                self.insert(key, t);
            }
            StateItem::Value(v) => {
                self.set(key, v);
            }
            StateItem::Dict(d) => {
                for (k, t) in d.entries {
                    self.insert(format!("{key}.{k}"), t);
                }
                for (k, v) in d.plain {
                    self.set(format!("{key}.{k}"), v);
                }
            }
        }
    }

    /// The entries under `prefix.`, with the prefix taken off (PyTorch's `ckpt["model"]`
    /// of a nested dict): tensors (shared, not copied) and plain values. Empty when no key
    /// has the prefix.
    pub fn sub(&self, prefix: &str) -> StateDict {
        let strip = |k: &str| {
            k.strip_prefix(prefix)
                .and_then(|r| r.strip_prefix('.'))
                .map(str::to_string)
        };
        let mut out = StateDict::new();
        for (k, t) in &self.entries {
            if let Some(rest) = strip(k) {
                out.insert(rest, t.clone());
            }
        }
        for (k, v) in &self.plain {
            if let Some(rest) = strip(k) {
                out.set(rest, v.clone());
            }
        }
        out
    }

    /// Removes the tensor under `key`, keeping the others in order.
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

    /// The keys of the tensors, in order (the plain values' are [`plain`](StateDict::plain)).
    pub fn keys(&self) -> Keys<'_> {
        Keys(self.entries.iter())
    }

    /// The tensors, in key order.
    pub fn values(&self) -> impl DoubleEndedIterator<Item = &Tensor> + ExactSizeIterator {
        self.entries.iter().map(|(_, v)| v)
    }

    /// The tensor entries, in order.
    pub fn iter(&self) -> Iter<'_> {
        Iter(self.entries.iter())
    }

    /// Sorts the tensor entries by key (as text).
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
        let mut m = f.debug_map();
        m.entries(self.entries.iter().map(|(k, v)| (k, v.shape())));
        m.entries(self.plain.iter().map(|(k, v)| (k, v)));
        m.finish()
    }
}
