#![allow(clippy::unwrap_used)]
//! Property tests: strided views against index math, ops on non-contiguous views against
//! contiguous copies, broadcasting and reductions against naive f64 references, and random
//! ops that must never panic.

use ember_tensor::{ALL_DTYPES, DType, Device, Scalar, Tensor};
use proptest::prelude::*;

const CPU: Device = Device::Cpu;

/// A non-contiguous view: a base tensor (values = storage index) sliced with a step and an
/// offset on every dim, then permuted. Returns the view and, per element in row-major
/// order, its expected storage index, computed without the layout code.
#[derive(Debug, Clone)]
struct ViewCase {
    shape: Vec<usize>,
    steps: Vec<usize>,
    pads: Vec<usize>,
    perm: Vec<usize>,
}

/// A view of up to 4 dims of up to 5 elements, or (`wide`) with its last base dim 16 longer,
/// which the CPU kernels' row-at-a-time paths take (rows of 16 elements or more).
fn view_case() -> impl Strategy<Value = ViewCase> {
    (0usize..=4, any::<bool>())
        .prop_flat_map(|(r, wide)| {
            (
                prop::collection::vec(0usize..=5, r),
                prop::collection::vec(1usize..=3, r),
                prop::collection::vec(0usize..=2, r),
                Just((0..r).collect::<Vec<_>>()).prop_shuffle(),
                Just(wide),
            )
        })
        .prop_map(|(mut shape, steps, pads, perm, wide)| {
            if let (true, Some(last)) = (wide, shape.last_mut()) {
                *last += 16;
            }
            ViewCase {
                shape,
                steps,
                pads,
                perm,
            }
        })
}

impl ViewCase {
    fn base_dims(&self) -> Vec<usize> {
        self.shape
            .iter()
            .zip(&self.steps)
            .zip(&self.pads)
            .map(|((&s, &st), &p)| s * st + p)
            .collect()
    }

    /// The view over a base of `dtype` holding its storage indices.
    fn build(&self, dtype: DType) -> Tensor {
        let dims = self.base_dims();
        let n: usize = dims.iter().product();
        let mut t = Tensor::arange(0, n as i64, dtype)
            .unwrap()
            .reshape(dims)
            .unwrap();
        for d in 0..self.shape.len() {
            let pad = self.pads[d] as isize;
            t = t.slice_with(d, Some(pad), None, self.steps[d]).unwrap();
            t = t.narrow(d, 0, self.shape[d]).unwrap();
        }
        t.permute(&self.perm).unwrap()
    }

    fn expected_indices(&self) -> Vec<usize> {
        let base = self.base_dims();
        let mut bstride = vec![1usize; base.len()];
        for i in (0..base.len().saturating_sub(1)).rev() {
            bstride[i] = bstride[i + 1] * base[i + 1];
        }
        let vshape: Vec<usize> = self.perm.iter().map(|&p| self.shape[p]).collect();
        let n: usize = vshape.iter().product();
        (0..n)
            .map(|mut lin| {
                let mut idx = vec![0; vshape.len()];
                for k in (0..vshape.len()).rev() {
                    idx[k] = lin % vshape[k];
                    lin /= vshape[k];
                }
                (0..vshape.len())
                    .map(|k| {
                        let d = self.perm[k];
                        (self.pads[d] + idx[k] * self.steps[d]) * bstride[d]
                    })
                    .sum()
            })
            .collect()
    }
}

fn as_f64(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap()
}

fn same(a: &[f64], b: &[f64]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x == y || (x.is_nan() && y.is_nan()))
}

/// Broadcast-compatible shapes: an output shape (its last dim sometimes 16 longer, for the
/// row-at-a-time paths), and for each operand a copy with random dims set to 1 and random
/// leading dims dropped.
fn broadcast_pair() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
    (prop::collection::vec(0usize..=4, 0..=4), any::<bool>()).prop_flat_map(|(mut out, wide)| {
        if let (true, Some(last)) = (wide, out.last_mut()) {
            *last += 16;
        }
        let r = out.len();
        (
            Just(out),
            prop::collection::vec(any::<bool>(), r),
            prop::collection::vec(any::<bool>(), r),
            0..=r,
            0..=r,
        )
            .prop_map(|(out, ma, mb, da, db)| {
                let mk = |m: &[bool], drop: usize| -> Vec<usize> {
                    out.iter()
                        .zip(m)
                        .skip(drop)
                        .map(|(&d, &one)| if one { 1 } else { d })
                        .collect()
                };
                (mk(&ma, da), mk(&mb, db))
            })
    })
}

fn broadcast_ref(
    a: &[f64],
    sa: &[usize],
    b: &[f64],
    sb: &[usize],
    f: impl Fn(f64, f64) -> f64,
) -> (Vec<usize>, Vec<f64>) {
    let r = sa.len().max(sb.len());
    let pad = |s: &[usize]| -> Vec<usize> {
        std::iter::repeat_n(1, r - s.len())
            .chain(s.iter().copied())
            .collect()
    };
    let (pa, pb) = (pad(sa), pad(sb));
    let out: Vec<usize> = pa
        .iter()
        .zip(&pb)
        .map(|(&x, &y)| if x == 1 { y } else { x })
        .collect();
    let n: usize = out.iter().product();
    let flat = |s: &[usize], idx: &[usize]| -> usize {
        idx.iter()
            .zip(s)
            .fold(0, |acc, (&i, &d)| acc * d + if d == 1 { 0 } else { i })
    };
    let vals = (0..n)
        .map(|mut lin| {
            let mut idx = vec![0; r];
            for k in (0..r).rev() {
                idx[k] = lin % out[k];
                lin /= out[k];
            }
            f(a[flat(&pa, &idx)], b[flat(&pb, &idx)])
        })
        .collect();
    (out, vals)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn strided_views_address_the_right_elements(case in view_case(), dt in 0usize..4) {
        let dtype = [DType::I64, DType::F64, DType::I32, DType::F32][dt];
        let v = case.build(dtype);
        let expect: Vec<f64> = case.expected_indices().iter().map(|&i| i as f64).collect();
        prop_assert_eq!(as_f64(&v), expect.clone());
        prop_assert_eq!(as_f64(&v.contiguous().unwrap()), expect);
    }

    #[test]
    fn ops_on_views_match_contiguous_copies(case in view_case(), dt in 0usize..8, k in 0usize..8) {
        let dtype = ALL_DTYPES[dt];
        let v = case.build(DType::F64).sub(7).unwrap().to_dtype(dtype).unwrap();
        let c = v.copy().unwrap();
        prop_assert!(c.is_contiguous());
        let pairs: Vec<(Tensor, Tensor)> = vec![
            (v.add(&v).unwrap(), c.add(&c).unwrap()),
            (v.mul(3).unwrap(), c.mul(3).unwrap()),
            (v.maximum(&c).unwrap(), c.maximum(&v).unwrap()),
            (v.gt(1).unwrap(), c.gt(1).unwrap()),
            (v.sum_all().unwrap(), c.sum_all().unwrap()),
            (v.exp().unwrap(), c.exp().unwrap()),
            (v.to_dtype(DType::F16).unwrap(), c.to_dtype(DType::F16).unwrap()),
            (ember_tensor::r#where(&v.gt(0).unwrap(), &v, 0).unwrap(), ember_tensor::r#where(&c.gt(0).unwrap(), &c, 0).unwrap()),
        ];
        for (a, b) in &pairs {
            prop_assert_eq!(a.dims(), b.dims());
            prop_assert!(same(&as_f64(a), &as_f64(b)));
        }
        if v.rank() > 0 {
            let d = (k % v.rank()) as isize;
            let (a, b) = (v.sum((d, k % 2 == 0)).unwrap(), c.sum((d, k % 2 == 0)).unwrap());
            prop_assert!(same(&as_f64(&a), &as_f64(&b)));
            if v.size(d).unwrap() > 0 {
                let (va, ia) = v.max_dim(d).unwrap();
                let (vb, ib) = c.max_dim(d).unwrap();
                prop_assert!(same(&as_f64(&va), &as_f64(&vb)));
                prop_assert!(same(&as_f64(&ia), &as_f64(&ib)));
            }
        }
        // in-place through a view equals in-place on the copy
        if !v.layout().has_internal_overlap() && dtype != DType::Bool {
            v.add_(&c).unwrap();
            c.add_(&c.copy().unwrap()).unwrap();
            prop_assert!(same(&as_f64(&v), &as_f64(&c)));
        }
    }

    #[test]
    fn broadcasting_matches_reference((sa, sb) in broadcast_pair(), seed in 0i64..100) {
        let na: usize = sa.iter().product();
        let nb: usize = sb.iter().product();
        let a: Vec<f64> = (0..na as i64).map(|i| ((i * 7 + seed) % 11 - 5) as f64).collect();
        let b: Vec<f64> = (0..nb as i64).map(|i| ((i * 3 + seed) % 13 - 6) as f64).collect();
        let ta = Tensor::from_slice(&a, sa.as_slice(), CPU).unwrap();
        let tb = Tensor::from_slice(&b, sb.as_slice(), CPU).unwrap();
        for (name, f) in [("add", (|x, y| x + y) as fn(f64, f64) -> f64), ("mul", |x, y| x * y), ("sub", |x, y| x - y)] {
            let got = match name { "add" => ta.add(&tb), "mul" => ta.mul(&tb), _ => ta.sub(&tb) }.unwrap();
            let (shape, want) = broadcast_ref(&a, &sa, &b, &sb, f);
            prop_assert_eq!(got.dims(), shape.as_slice());
            prop_assert_eq!(got.to_vec::<f64>().unwrap(), want);
        }
    }

    #[test]
    fn sum_and_max_match_reference(dims in prop::collection::vec(0usize..=4, 1..=4), mask in prop::collection::vec(any::<bool>(), 4), keep in any::<bool>()) {
        let n: usize = dims.iter().product();
        let data: Vec<f64> = (0..n).map(|i| ((i * 37) % 17) as f64 - 8.0).collect();
        let t = Tensor::from_slice(&data, dims.as_slice(), CPU).unwrap();
        let red: Vec<usize> = (0..dims.len()).filter(|&i| mask[i]).collect();
        // not a skip: a case with no reduced dimension has nothing to compare.
        if red.is_empty() { return Ok(()); }
        let got = t.sum((red.clone(), keep)).unwrap();
        // reference: accumulate every element into its output slot
        let out_dims: Vec<usize> = (0..dims.len()).filter(|i| !red.contains(i)).map(|i| dims[i]).collect();
        let mut want = vec![0f64; out_dims.iter().product()];
        for (lin, &x) in data.iter().enumerate() {
            let mut rem = lin;
            let mut idx = vec![0; dims.len()];
            for k in (0..dims.len()).rev() { idx[k] = rem % dims[k]; rem /= dims[k]; }
            let o = (0..dims.len()).filter(|i| !red.contains(i)).fold(0, |acc, i| acc * dims[i] + idx[i]);
            want[o] += x;
        }
        prop_assert_eq!(got.to_vec::<f64>().unwrap(), want);
        let expect_dims: Vec<usize> = if keep {
            dims.iter().enumerate().map(|(i, &d)| if red.contains(&i) { 1 } else { d }).collect()
        } else { out_dims };
        prop_assert_eq!(got.dims(), expect_dims.as_slice());
    }

    #[test]
    fn random_ops_never_panic(
        shape in prop::collection::vec(0usize..=5, 0..=4),
        dt in 0usize..8,
        op in 0usize..40,
        a in -6isize..6,
        b in -6isize..6,
        c in 0usize..7,
        other in prop::collection::vec(0usize..=5, 0..=4),
    ) {
        let dtype = ALL_DTYPES[dt];
        let n: usize = shape.iter().product();
        let t = Tensor::arange(0, n as i64, dtype).unwrap().reshape(shape.clone()).unwrap();
        let o = Tensor::ones(other.clone(), dtype).unwrap();
        let _ = match op {
            0 => t.reshape([a, b]).map(|_| ()),
            1 => t.view([a]).map(|_| ()),
            2 => t.permute([a, b]).map(|_| ()),
            3 => t.transpose(a, b).map(|_| ()),
            4 => t.narrow(a, c, c).map(|_| ()),
            5 => t.slice_with(a, Some(b), Some(a), c).map(|_| ()),
            6 => t.select(a, b).map(|_| ()),
            7 => t.squeeze_dim(a).map(|_| ()),
            8 => t.unsqueeze(a).map(|_| ()),
            9 => t.expand([a, b, a]).map(|_| ()),
            10 => t.flatten(a, b).map(|_| ()),
            11 => t.chunk(c, a).map(|_| ()),
            12 => t.split(c, a).map(|_| ()),
            13 => Tensor::cat(&[&t, &o], a).map(|_| ()),
            14 => Tensor::stack(&[&t, &o], a).map(|_| ()),
            15 => t.add(&o).map(|_| ()),
            16 => t.sub(&o).map(|_| ()),
            17 => t.div(&o).map(|_| ()),
            18 => t.pow(&o).map(|_| ()),
            19 => t.lt(&o).map(|_| ()),
            20 => t.logical_xor(&o).map(|_| ()),
            21 => ember_tensor::r#where(&t, &o, 1).map(|_| ()),
            22 => t.sum((a, c % 2 == 0)).map(|_| ()),
            23 => t.mean(([a, b], true)).map(|_| ()),
            24 => t.max_dim(a).map(|_| ()),
            25 => t.argmin_all().map(|_| ()),
            26 => t.var_correction(a, c as f64).map(|_| ()),
            27 => t.logsumexp(a).map(|_| ()),
            28 => t.norm(b as f64, a).map(|_| ()),
            29 => t.softmax(a).map(|_| ()),
            30 => t.add_(&o).map(|_| ()),
            31 => t.copy_(&o).map(|_| ()),
            32 => t.expand(other.iter().map(|&d| d as isize).collect::<Vec<_>>()).and_then(|e| e.fill_(1).map(|_| ())),
            33 => t.clamp(Some(Scalar::Int(a as i64)), Some(Scalar::Float(b as f64))).map(|_| ()),
            34 => t.gelu(()).map(|_| ()),
            35 => t.item::<f32>().map(|_| ()),
            36 => t.to_vec2::<i64>().map(|_| ()),
            37 => t.split_sizes(&[c, c], a).map(|_| ()),
            38 => Tensor::arange_step(a, b, c as i64 - 3, dtype).map(|_| ()),
            _ => t.mul_(b).and_then(|_| t.div_(&o)).map(|_| ()),
        };
        let _ = t.to_string();
    }
}
