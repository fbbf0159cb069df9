//! [`StridedIndex`]: the storage indices of a layout's elements in row-major order.

use crate::layout::Layout;

/// Iterator over the storage index of every element of a [`Layout`], in row-major order.
///
/// Adjacent dims that are contiguous with each other are merged first, so a contiguous
/// layout iterates as one run and a transposed matrix as two nested loops.
#[derive(Debug, Clone)]
pub struct StridedIndex<'a> {
    _layout: std::marker::PhantomData<&'a Layout>,
    dims: Vec<usize>,
    strides: Vec<usize>,
    index: Vec<usize>,
    next: Option<usize>,
    remaining: usize,
}

/// Merges adjacent dims `(d0, s0), (d1, s1)` where `s0 == d1 * s1`, and drops size-1 dims.
/// Returns `(dims, strides)`, possibly empty (a single element).
pub(crate) fn coalesce(dims: &[usize], strides: &[usize]) -> (Vec<usize>, Vec<usize>) {
    let mut d: Vec<usize> = Vec::with_capacity(dims.len());
    let mut s: Vec<usize> = Vec::with_capacity(dims.len());
    for (&size, &stride) in dims.iter().zip(strides) {
        if size == 1 {
            continue;
        }
        match (d.last_mut(), s.last_mut()) {
            (Some(ld), Some(ls)) if *ls == size * stride => {
                *ld *= size;
                *ls = stride;
            }
            _ => {
                d.push(size);
                s.push(stride);
            }
        }
    }
    (d, s)
}

impl<'a> StridedIndex<'a> {
    /// Iterates `layout`.
    pub fn new(layout: &'a Layout) -> Self {
        let numel = layout.numel();
        let (dims, strides) = coalesce(layout.dims(), layout.strides());
        StridedIndex {
            _layout: std::marker::PhantomData,
            index: vec![0; dims.len()],
            dims,
            strides,
            next: (numel > 0).then_some(layout.offset()),
            remaining: numel,
        }
    }
}

impl StridedIndex<'_> {
    /// Iterates `layout` from row-major element number `start` on (for parallel chunks).
    pub fn from_position(layout: &Layout, start: usize) -> StridedIndex<'_> {
        let mut it = StridedIndex::new(layout);
        if start == 0 {
            return it;
        }
        if start >= it.remaining {
            it.next = None;
            it.remaining = 0;
            return it;
        }
        let mut linear = start;
        let mut pos = layout.offset();
        for i in (0..it.dims.len()).rev() {
            let idx = linear % it.dims[i];
            linear /= it.dims[i];
            it.index[i] = idx;
            pos += idx * it.strides[i];
        }
        it.next = Some(pos);
        it.remaining -= start;
        it
    }
}

impl Iterator for StridedIndex<'_> {
    type Item = usize;

    #[inline]
    fn next(&mut self) -> Option<usize> {
        let cur = self.next?;
        self.remaining -= 1;
        if self.remaining == 0 {
            self.next = None;
            return Some(cur);
        }
        let mut pos = cur;
        for i in (0..self.dims.len()).rev() {
            self.index[i] += 1;
            pos += self.strides[i];
            if self.index[i] < self.dims[i] {
                self.next = Some(pos);
                return Some(cur);
            }
            pos -= self.strides[i] * self.dims[i];
            self.index[i] = 0;
        }
        self.next = None;
        Some(cur)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining, Some(self.remaining))
    }
}

impl ExactSizeIterator for StridedIndex<'_> {}

/// Storage index of row-major element number `linear` of `layout` (the reference that
/// `from_position` is tested against; the CPU kernels' row walks use it once per row).
pub(crate) fn offset_of(layout: &Layout, mut linear: usize) -> usize {
    let mut off = layout.offset();
    for (&d, &s) in layout.dims().iter().zip(layout.strides()).rev() {
        if d > 0 {
            off += (linear % d) * s;
            linear /= d;
        }
    }
    off
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transposed_order() {
        let l = Layout::contiguous([2, 3]).transpose(0, 1);
        let v: Vec<_> = l.strided_index().collect();
        assert_eq!(v, vec![0, 3, 1, 4, 2, 5]);
        for (k, &o) in v.iter().enumerate() {
            assert_eq!(offset_of(&l, k), o);
            let rest: Vec<_> = StridedIndex::from_position(&l, k).collect();
            assert_eq!(rest, v[k..].to_vec());
        }
        assert_eq!(StridedIndex::from_position(&l, 6).count(), 0);
    }

    #[test]
    fn scalar_empty_and_broadcast() {
        assert_eq!(
            Layout::contiguous([]).strided_index().collect::<Vec<_>>(),
            vec![0]
        );
        assert_eq!(Layout::contiguous([2, 0]).strided_index().count(), 0);
        let b = Layout::contiguous([3])
            .broadcast_as("t", &[2, 3].into())
            .unwrap();
        assert_eq!(
            b.strided_index().collect::<Vec<_>>(),
            vec![0, 1, 2, 0, 1, 2]
        );
    }
}
