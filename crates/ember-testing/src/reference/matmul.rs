//! Matrix products.

/// `a @ b` in f64 by `torch.matmul`'s rules, from row-major values and shapes: 1-D operands
/// are a row (`a`) or a column (`b`) whose dim is dropped from the result; batch dims
/// broadcast. Returns the output shape, the values and, per element, `Σ|a·b|` (the scale of
/// its rounding error).
///
/// ```
/// use ember_testing::reference::matmul;
/// let (shape, c, _) = matmul(&[1., 2., 3., 4.], &[2, 2], &[5., 6.], &[2]);
/// assert_eq!((shape, c), (vec![2], vec![17., 39.]));
/// ```
#[allow(clippy::type_complexity)]
pub fn matmul(
    a: &[f64],
    sa: &[usize],
    b: &[f64],
    sb: &[usize],
) -> (Vec<usize>, Vec<f64>, Vec<f64>) {
    let (a2, b2) = (sa.len() == 1, sb.len() == 1);
    let sa: Vec<usize> = if a2 { vec![1, sa[0]] } else { sa.to_vec() };
    let sb: Vec<usize> = if b2 { vec![sb[0], 1] } else { sb.to_vec() };
    let (ra, rb) = (sa.len(), sb.len());
    let (m, k, n) = (sa[ra - 2], sa[ra - 1], sb[rb - 1]);
    let (ba, bb) = (&sa[..ra - 2], &sb[..rb - 2]);
    let r = ba.len().max(bb.len());
    let pad = |s: &[usize]| [vec![1; r - s.len()], s.to_vec()].concat();
    let (ba, bb) = (pad(ba), pad(bb));
    let batch: Vec<usize> = ba
        .iter()
        .zip(&bb)
        .map(|(&x, &y)| if x == 1 { y } else { x })
        .collect();
    let nbatch: usize = batch.iter().product();
    let (mut out, mut scale) = (Vec::new(), Vec::new());
    for bi in 0..nbatch {
        // Output batch index -> each operand's matrix index (size-1 dims broadcast).
        let (mut rest, mut ia, mut ib, mut sta, mut stb) = (bi, 0, 0, 1, 1);
        for d in (0..r).rev() {
            let x = rest % batch[d];
            rest /= batch[d];
            ia += if ba[d] == 1 { 0 } else { x * sta };
            ib += if bb[d] == 1 { 0 } else { x * stb };
            sta *= ba[d];
            stb *= bb[d];
        }
        let (am, bm) = (&a[ia * m * k..], &b[ib * k * n..]);
        for i in 0..m {
            for j in 0..n {
                let terms = (0..k).map(|p| am[i * k + p] * bm[p * n + j]);
                out.push(terms.clone().sum());
                scale.push(terms.map(f64::abs).sum());
            }
        }
    }
    let mut shape = batch;
    if !a2 {
        shape.push(m);
    }
    if !b2 {
        shape.push(n);
    }
    (shape, out, scale)
}
