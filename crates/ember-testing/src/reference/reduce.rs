//! Reductions whose result is an element: max/min with the index it came from.

/// The maximum (`max`) or minimum of a non-empty `values` and its index, by the CPU
/// backend's fold (PyTorch's rules): start from the first element; a NaN wins and then
/// sticks (the first NaN's index); otherwise only a strictly greater (smaller) element
/// replaces the best, so ties give the first index and `-0.0`/`0.0` keep whichever came
/// first. A value is NaN when it does not equal itself, so integers work the same (without
/// NaN). `None` for an empty slice.
///
/// ```
/// use ember_testing::reference::extreme;
/// assert_eq!(extreme(&[1.0, 3.0, 3.0, 2.0], true), Some((3.0, 1)));
/// let (v, i) = extreme(&[1.0, f64::NAN, 5.0, f64::NAN], true).unwrap();
/// assert!(v.is_nan() && i == 1);
/// assert_eq!(extreme(&[4i64, -2, 7, -2], false), Some((-2, 1)));
/// ```
pub fn extreme<T: PartialOrd + Copy>(values: &[T], max: bool) -> Option<(T, usize)> {
    #[allow(clippy::eq_op)]
    let is_nan = |v: T| v != v;
    let (&first, rest) = values.split_first()?;
    let mut best = (first, 0usize);
    for (i, &x) in rest.iter().enumerate() {
        if is_nan(best.0) {
            break;
        }
        let better = is_nan(x) || if max { x > best.0 } else { x < best.0 };
        if better {
            best = (x, i + 1);
        }
    }
    Some(best)
}
