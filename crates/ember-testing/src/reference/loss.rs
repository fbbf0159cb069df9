//! Cross-entropy and NLL loss, PyTorch's formulas in f64.

use ember_tensor::Reduction;

/// The options of [`cross_entropy`]: PyTorch's `weight`, `ignore_index`, `label_smoothing`
/// and `reduction`, and `log_input` for NLL loss (the input is already log-probabilities:
/// no log-softmax).
#[derive(Clone, Copy, Debug)]
pub struct CrossEntropy<'a> {
    /// Per-class weights (`[C]`).
    pub weight: Option<&'a [f64]>,
    /// The target value whose elements are left out.
    pub ignore_index: i64,
    /// ε of label smoothing, in `[0, 1]`.
    pub label_smoothing: f64,
    /// How the per-element losses are reduced.
    pub reduction: Reduction,
    /// `true`: NLL loss (the input holds log-probabilities).
    pub log_input: bool,
}

impl Default for CrossEntropy<'_> {
    fn default() -> Self {
        CrossEntropy {
            weight: None,
            ignore_index: -100,
            label_smoothing: 0.0,
            reduction: Reduction::Mean,
            log_input: false,
        }
    }
}

/// Cross-entropy of row-major logits `x` of shape `[N, C, L]` (`L` the product of the extra
/// dims; an unbatched `[C]` is `N = L = 1`) against class `targets` (`[N, L]`), PyTorch's
/// formula (`crates/ember-tensor/src/ops/loss.rs`): per element `(1 - ε)·(-w_t·logp_t) +
/// (ε/C)·Σ_c -w_c·logp_c` with `logp = x - logsumexp(x)` over C (`x` itself with
/// `log_input`), 0 where the target is `ignore_index`. `Mean` divides the sum by `Σ w_t`
/// over the elements not ignored (NaN when all are: 0/0, as PyTorch). Returns the
/// per-element losses (`Reduction::None`) or one value.
///
/// ```
/// use ember_testing::reference::{CrossEntropy, cross_entropy};
/// // logits [1, 2, 3], target 0: ln(e + e² + e³) - 1 = 2.4076059644...
/// let l = cross_entropy(&[1.0, 2.0, 3.0], (1, 3, 1), &[0], &CrossEntropy::default());
/// assert!((l[0] - 2.4076059644).abs() < 1e-9);
/// ```
///
/// # Panics
///
/// If a target outside `[0, C)` is not `ignore_index`, or a slice is too short.
pub fn cross_entropy(
    x: &[f64],
    (n, c, l): (usize, usize, usize),
    targets: &[i64],
    o: &CrossEntropy<'_>,
) -> Vec<f64> {
    let wc = |k: usize| o.weight.map_or(1.0, |w| w[k]);
    let eps = o.label_smoothing;
    let (mut per, mut total_w) = (Vec::with_capacity(n * l), 0.0);
    for s in 0..n {
        for p in 0..l {
            let at = |k: usize| x[(s * c + k) * l + p];
            let lse = if o.log_input {
                0.0
            } else {
                let m = (0..c).map(at).fold(f64::NEG_INFINITY, f64::max);
                m + (0..c).map(|k| (at(k) - m).exp()).sum::<f64>().ln()
            };
            let tgt = targets[s * l + p];
            if tgt == o.ignore_index {
                per.push(0.0);
                continue;
            }
            let tk = tgt as usize;
            let nll = -wc(tk) * (at(tk) - lse);
            let smooth: f64 = (0..c).map(|k| -wc(k) * (at(k) - lse)).sum();
            per.push((1.0 - eps) * nll + eps / c as f64 * smooth);
            total_w += wc(tk);
        }
    }
    match o.reduction {
        Reduction::None => per,
        Reduction::Sum => vec![per.iter().sum()],
        Reduction::Mean => vec![per.iter().sum::<f64>() / total_w],
    }
}

/// The gradient of [`cross_entropy`] (not `log_input`) with respect to the logits `x`
/// (`[N, C, L]` row-major) for the upstream gradient `grad` (one value per element for
/// `Reduction::None`, else one value): per element `i` with target `t` (not ignored),
/// `a_c = (1 - ε)·w_t·[c = t] + (ε/C)·w_c` and `∂L/∂x_c = g_i·(softmax(x)_c·Σ_k a_k - a_c)`,
/// `g_i` divided by `Σ w_t` for `Mean`; 0 on ignored elements. Derived directly from the
/// forward's formula (`∂(-logp_k)/∂x_c = p_c - [c = k]`).
///
/// ```
/// use ember_testing::reference::{CrossEntropy, cross_entropy_grad};
/// // Two equal logits, target 0: softmax = [1/2, 1/2], gradient [-1/2, 1/2].
/// let g = cross_entropy_grad(&[0.0, 0.0], (1, 2, 1), &[0], &CrossEntropy::default(), &[1.0]);
/// assert_eq!(g, vec![-0.5, 0.5]);
/// ```
///
/// # Panics
///
/// As [`cross_entropy`].
pub fn cross_entropy_grad(
    x: &[f64],
    (n, c, l): (usize, usize, usize),
    targets: &[i64],
    o: &CrossEntropy<'_>,
    grad: &[f64],
) -> Vec<f64> {
    let wc = |k: usize| o.weight.map_or(1.0, |w| w[k]);
    let eps = o.label_smoothing;
    let total: f64 = targets
        .iter()
        .filter(|&&t| t != o.ignore_index)
        .map(|&t| wc(t as usize))
        .sum();
    let mut out = vec![0.0; n * c * l];
    for s in 0..n {
        for p in 0..l {
            let i = s * l + p;
            let tgt = targets[i];
            if tgt == o.ignore_index {
                continue;
            }
            let g = match o.reduction {
                Reduction::None => grad[i],
                Reduction::Sum => grad[0],
                Reduction::Mean => grad[0] / total,
            };
            let at = |k: usize| x[(s * c + k) * l + p];
            let m = (0..c).map(at).fold(f64::NEG_INFINITY, f64::max);
            let lse = m + (0..c).map(|k| (at(k) - m).exp()).sum::<f64>().ln();
            let a = |k: usize| {
                let hit = if k == tgt as usize {
                    (1.0 - eps) * wc(k)
                } else {
                    0.0
                };
                hit + eps / c as f64 * wc(k)
            };
            let big_a: f64 = (0..c).map(a).sum();
            for k in 0..c {
                out[(s * c + k) * l + p] = g * ((at(k) - lse).exp() * big_a - a(k));
            }
        }
    }
    out
}

/// Cross-entropy of row-major logits `x` (`[N, C, L]`) against class probabilities `probs`
/// of the same shape, PyTorch's `cross_entropy_loss_prob_target`: per element `-Σ_c w_c·y_c
/// ·logp_c` with `y = (1 - ε)·probs + ε/C` and `logp = x - logsumexp(x)` over C. `Mean`
/// divides the sum by `N·L` (the weights do not enter the divisor; NaN for no rows);
/// `ignore_index` and `log_input` are not used. Returns the per-element losses (`[N, L]`,
/// `Reduction::None`) or one value.
///
/// ```
/// use ember_testing::reference::{CrossEntropy, cross_entropy, cross_entropy_probs};
/// // A one-hot target is the class index.
/// let x = [1.0, 2.0, 3.0];
/// let o = CrossEntropy::default();
/// let p = cross_entropy_probs(&x, (1, 3, 1), &[0.0, 1.0, 0.0], &o);
/// assert!((p[0] - cross_entropy(&x, (1, 3, 1), &[1], &o)[0]).abs() < 1e-12);
/// ```
///
/// # Panics
///
/// If a slice is too short.
pub fn cross_entropy_probs(
    x: &[f64],
    (n, c, l): (usize, usize, usize),
    probs: &[f64],
    o: &CrossEntropy<'_>,
) -> Vec<f64> {
    let per: Vec<f64> = (0..n * l)
        .map(|i| {
            let a = prob_coefficients(probs, (n, c, l), i, o);
            let lp = log_probs(x, (n, c, l), i);
            -(0..c).map(|k| a[k] * lp[k]).sum::<f64>()
        })
        .collect();
    match o.reduction {
        Reduction::None => per,
        Reduction::Sum => vec![per.iter().sum()],
        Reduction::Mean => vec![per.iter().sum::<f64>() / (n * l) as f64],
    }
}

/// The gradient of [`cross_entropy_probs`] with respect to the logits `x`, for the
/// upstream gradient `grad` (one value per element for `Reduction::None`, else one):
/// with `a_c = w_c·y_c`, `∂L_i/∂x_c = g_i·(softmax(x)_c·Σ_k a_k - a_c)`, `g_i` divided by
/// `N·L` for `Mean`.
///
/// ```
/// use ember_testing::reference::{CrossEntropy, cross_entropy_probs_grad};
/// // Equal logits, target [1, 0]: softmax = [1/2, 1/2], gradient [-1/2, 1/2].
/// let g = cross_entropy_probs_grad(&[0.0, 0.0], (1, 2, 1), &[1.0, 0.0], &CrossEntropy::default(), &[1.0]);
/// assert_eq!(g, vec![-0.5, 0.5]);
/// ```
///
/// # Panics
///
/// If a slice is too short.
pub fn cross_entropy_probs_grad(
    x: &[f64],
    (n, c, l): (usize, usize, usize),
    probs: &[f64],
    o: &CrossEntropy<'_>,
    grad: &[f64],
) -> Vec<f64> {
    let mut out = vec![0.0; n * c * l];
    for i in 0..n * l {
        let g = match o.reduction {
            Reduction::None => grad[i],
            Reduction::Sum => grad[0],
            Reduction::Mean => grad[0] / (n * l) as f64,
        };
        let a = prob_coefficients(probs, (n, c, l), i, o);
        let lp = log_probs(x, (n, c, l), i);
        let big_a: f64 = a.iter().sum();
        let (s, p) = (i / l, i % l);
        for k in 0..c {
            out[(s * c + k) * l + p] = g * (lp[k].exp() * big_a - a[k]);
        }
    }
    out
}

/// `w_c·((1 - ε)·probs_c + ε/C)` over the classes of element `i` (`= s·L + p`).
fn prob_coefficients(
    probs: &[f64],
    (_, c, l): (usize, usize, usize),
    i: usize,
    o: &CrossEntropy<'_>,
) -> Vec<f64> {
    let (s, p) = (i / l, i % l);
    let eps = o.label_smoothing;
    (0..c)
        .map(|k| {
            let y = (1.0 - eps) * probs[(s * c + k) * l + p] + eps / c as f64;
            o.weight.map_or(1.0, |w| w[k]) * y
        })
        .collect()
}

/// `x - logsumexp(x)` over the classes of element `i` (`= s·L + p`).
fn log_probs(x: &[f64], (_, c, l): (usize, usize, usize), i: usize) -> Vec<f64> {
    let (s, p) = (i / l, i % l);
    let at = |k: usize| x[(s * c + k) * l + p];
    let m = (0..c).map(at).fold(f64::NEG_INFINITY, f64::max);
    let lse = m + (0..c).map(|k| (at(k) - m).exp()).sum::<f64>().ln();
    (0..c).map(|k| at(k) - lse).collect()
}
