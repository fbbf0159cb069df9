//! Softmax and log-softmax, PyTorch's stable formulas in f64.

/// Softmax (or log-softmax with `log`) of one row, as the CPU backend computes it
/// (`crates/ember-tensor/src/cpu/softmax.rs`): `m = max` (a NaN is skipped by the max, so a
/// row with a NaN gives NaN through `x - m`; a `+inf` gives `inf - inf`, NaN), `s = Σ exp(x -
/// m)`, then `exp(x - m) · (1/s)` or `(x - m) - ln s`. A row of `-inf` is NaN; a `-inf`
/// element of a finite row gives 0 (log: `-inf`).
///
/// ```
/// use ember_testing::reference::softmax_row;
/// let p = softmax_row(&[0.0, 0.0, f64::NEG_INFINITY], false);
/// assert_eq!(p, vec![0.5, 0.5, 0.0]);
/// ```
pub fn softmax_row(row: &[f64], log: bool) -> Vec<f64> {
    let m = row
        .iter()
        .fold(f64::NEG_INFINITY, |a, &v| if v > a { v } else { a });
    let s: f64 = row.iter().map(|&v| (v - m).exp()).sum();
    row.iter()
        .map(|&v| {
            if log {
                (v - m) - s.ln()
            } else {
                (v - m).exp() * (1.0 / s)
            }
        })
        .collect()
}

/// Softmax (or log-softmax with `log`) of row-major `x` of shape `dims` along `dim`: each
/// line along `dim` through [`softmax_row`].
pub fn softmax(x: &[f64], dims: &[usize], dim: usize, log: bool) -> Vec<f64> {
    let size = dims[dim];
    let inner: usize = dims[dim + 1..].iter().product();
    let outer: usize = dims[..dim].iter().product();
    let mut y = vec![0.0; x.len()];
    for o in 0..outer {
        for j in 0..inner {
            let at = |k: usize| o * size * inner + k * inner + j;
            let row: Vec<f64> = (0..size).map(|k| x[at(k)]).collect();
            for (k, v) in softmax_row(&row, log).into_iter().enumerate() {
                y[at(k)] = v;
            }
        }
    }
    y
}
