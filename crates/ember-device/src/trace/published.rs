//! A value replaced rarely and read on every traced range or launch, with a per-thread copy
//! checked against a generation count (Note [Per-thread trace state]): the subscriber list
//! and the device sink.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

/// A thread's copy of a [`Published`] value, current while its generation is.
pub(crate) struct Cached<T: ?Sized> {
    generation: u64,
    value: Option<Arc<T>>,
}

impl<T: ?Sized> Cached<T> {
    /// Nothing yet (generation 0: what a [`Published`] holds before its first replacement).
    pub(crate) const fn empty() -> Cached<T> {
        Cached {
            generation: 0,
            value: None,
        }
    }
}

/// The global value and its generation, moved on under the write lock at each replacement.
pub(crate) struct Published<T: ?Sized> {
    slot: RwLock<Cached<T>>,
    generation: AtomicU64,
}

impl<T: ?Sized> Published<T> {
    pub(crate) const fn new() -> Published<T> {
        Published {
            slot: RwLock::new(Cached::empty()),
            generation: AtomicU64::new(0),
        }
    }

    /// Replace the value with `edit`'s result (given the current one); returns the old one.
    pub(crate) fn replace(
        &self,
        edit: impl FnOnce(Option<&Arc<T>>) -> Option<Arc<T>>,
    ) -> Option<Arc<T>> {
        let mut slot = self.slot.write().unwrap_or_else(|e| e.into_inner());
        let new = edit(slot.value.as_ref());
        slot.generation += 1;
        self.generation.store(slot.generation, Ordering::Release);
        std::mem::replace(&mut slot.value, new)
    }

    /// The value and its generation, from the global slot.
    fn fetch(&self) -> Cached<T> {
        let slot = self.slot.read().unwrap_or_else(|e| e.into_inner());
        Cached {
            generation: slot.generation,
            value: slot.value.clone(),
        }
    }

    /// Calls `f` with the current value: the thread's copy in `cell`, fetched again only
    /// when the generation moved, lent to `f`. A nested call (from inside `f`) that finds the
    /// copy lent reads it shared, or the global slot if the value changed meanwhile.
    pub(crate) fn with_current<R>(
        &self,
        cell: &RefCell<Cached<T>>,
        f: impl FnOnce(Option<&Arc<T>>) -> R,
    ) -> R {
        let current = self.generation.load(Ordering::Acquire);
        if let Ok(mut cached) = cell.try_borrow_mut()
            && cached.generation != current
        {
            *cached = self.fetch();
        }
        match cell.try_borrow() {
            Ok(cached) if cached.generation == current => f(cached.value.as_ref()),
            _ => f(self.fetch().value.as_ref()),
        }
    }

    /// The current value from the global slot (for a thread without its copy: exiting).
    pub(crate) fn current(&self) -> Option<Arc<T>> {
        self.fetch().value
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_thread_copy_follows_every_replacement_and_nests() {
        let p: Published<u32> = Published::new();
        let cell = RefCell::new(Cached::empty());
        assert_eq!(p.with_current(&cell, |v| v.map(|v| **v)), None);
        let old = p.replace(|_| Some(Arc::new(1)));
        assert!(old.is_none());
        assert_eq!(p.with_current(&cell, |v| v.map(|v| **v)), Some(1));
        // Replaced while the copy is lent: the nested read sees the new value.
        let (outer, inner) = p.with_current(&cell, |v| {
            let outer = v.map(|v| **v);
            p.replace(|old| old.map(|o| Arc::new(**o + 1)));
            (outer, p.with_current(&cell, |v| v.map(|v| **v)))
        });
        assert_eq!((outer, inner), (Some(1), Some(2)));
        assert_eq!(p.with_current(&cell, |v| v.map(|v| **v)), Some(2));
        assert_eq!(p.current().map(|v| *v), Some(2));
    }
}
