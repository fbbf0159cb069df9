//! Strided layouts as lists: row-major strides, the offset of an element, the span of a view.

/// Row-major (contiguous) strides of `shape`, in elements.
///
/// ```
/// assert_eq!(ember_testing::reference::contiguous_strides(&[2, 3, 4]), vec![12, 4, 1]);
/// ```
pub fn contiguous_strides(shape: &[usize]) -> Vec<isize> {
    let mut s = vec![0isize; shape.len()];
    let mut acc = 1isize;
    for d in (0..shape.len()).rev() {
        s[d] = acc;
        acc *= shape[d] as isize;
    }
    s
}

/// The element offset of row-major linear index `i` of `shape` under `strides` (which must
/// not make it negative).
///
/// ```
/// use ember_testing::reference::offset_of;
/// // Element 4 of a [2, 3] view transposed out of a [3, 2] buffer: (1, 1) -> 1·1 + 1·2.
/// assert_eq!(offset_of(4, &[2, 3], &[1, 2]), 3);
/// ```
pub fn offset_of(mut i: usize, shape: &[usize], strides: &[isize]) -> usize {
    let mut off = 0isize;
    for d in (0..shape.len()).rev() {
        off += (i % shape[d]) as isize * strides[d];
        i /= shape[d];
    }
    off as usize
}

/// How many elements a view with non-negative `strides` over `shape` spans (from its first
/// element to its last, inclusive; 1 for an empty shape's placeholder).
pub fn span(shape: &[usize], strides: &[isize]) -> usize {
    shape
        .iter()
        .zip(strides)
        .map(|(&s, &st)| s.saturating_sub(1) * st as usize)
        .sum::<usize>()
        + 1
}
