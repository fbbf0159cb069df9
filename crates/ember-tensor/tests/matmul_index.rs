#![allow(clippy::unwrap_used)]
//! matmul (PyTorch's rules, against a naive f64 reference) and the indexing ops; the shape
//! rules and the indexing ops' edge cases on every device (`ember_testing::test_device!`:
//! `cpu` and the emulated or real `cuda:0`). Integer matmul is the CPU's alone (cuBLAS has
//! none; `cuda_ops.rs` checks CUDA's error), so `matmul_dtypes_and_addmm` stays on the CPU.

use ember_tensor::{DType, Device, Tensor, TensorError};
use ember_testing::test_device;
use proptest::prelude::*;

const CPU: Device = Device::Cpu;

/// `a @ b` of `[m, k]` and `[k, n]` row-major matrices (`reference::matmul`).
fn naive(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    ember_testing::reference::matmul(a, &[m, k], b, &[k, n]).1
}

fn data(n: usize, seed: usize) -> Vec<f64> {
    (0..n)
        .map(|i| ((i * 31 + seed * 7) % 19) as f64 - 9.0)
        .collect()
}

fn matmul_shapes_follow_pytorch(device: &Device) {
    let v = |s: &[usize]| Tensor::ones(s, device).unwrap();
    let mm = |a: &[usize], b: &[usize]| v(a).matmul(&v(b)).map(|t| t.dims().to_vec());
    assert_eq!(mm(&[3], &[3]).unwrap(), Vec::<usize>::new());
    assert_eq!(mm(&[2, 3], &[3]).unwrap(), vec![2]);
    assert_eq!(mm(&[3], &[3, 4]).unwrap(), vec![4]);
    assert_eq!(mm(&[2, 3], &[3, 4]).unwrap(), vec![2, 4]);
    assert_eq!(mm(&[5, 2, 3], &[3, 4]).unwrap(), vec![5, 2, 4]);
    assert_eq!(mm(&[3], &[5, 3, 4]).unwrap(), vec![5, 4]);
    assert_eq!(mm(&[5, 1, 2, 3], &[7, 3, 4]).unwrap(), vec![5, 7, 2, 4]);
    assert_eq!(mm(&[0, 3], &[3, 4]).unwrap(), vec![0, 4]);
    assert_eq!(mm(&[2, 0], &[0, 4]).unwrap(), vec![2, 4]);
    assert_eq!(
        mm(&[2, 3], &[4, 5]).unwrap_err().to_string(),
        "matmul: cannot multiply [2, 3] by [4, 5]"
    );
    assert!(mm(&[2, 2, 3], &[3, 3, 4]).is_err());
    assert!(
        v(&[2, 2])
            .matmul(&Tensor::ones([2, 2], (device, DType::F64)).unwrap())
            .is_err()
    );
    assert!(
        Tensor::scalar(1f32, device)
            .unwrap()
            .matmul(&v(&[1]))
            .is_err()
    );
    assert!(v(&[2, 3]).bmm(&v(&[3, 4])).is_err());
    assert_eq!(
        v(&[2, 2, 3]).bmm(&v(&[2, 3, 4])).unwrap().dims(),
        &[2, 2, 4]
    );
    // values: zero-sized inner dim gives zeros
    assert_eq!(
        v(&[2, 0])
            .matmul(&v(&[0, 2]))
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        vec![0.; 4]
    );
}
test_device!(matmul_shapes_follow_pytorch, matmul_shapes_follow_pytorch);

#[test]
fn matmul_dtypes_and_addmm() {
    let a = Tensor::arange(0, 6, ()).unwrap().reshape([2, 3]).unwrap();
    let b = Tensor::arange(0, 6, ()).unwrap().reshape([3, 2]).unwrap();
    assert_eq!(
        a.matmul(&b).unwrap().to_vec2::<i64>().unwrap(),
        vec![vec![10, 13], vec![28, 40]]
    );
    let h = a
        .to_dtype(DType::Bf16)
        .unwrap()
        .matmul(&b.to_dtype(DType::Bf16).unwrap())
        .unwrap();
    assert_eq!(h.dtype(), DType::Bf16);
    assert_eq!(
        h.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap(),
        vec![10., 13., 28., 40.]
    );
    assert!(
        Tensor::ones([2, 2], DType::Bool)
            .unwrap()
            .matmul(&Tensor::ones([2, 2], DType::Bool).unwrap())
            .is_err()
    );
    let bias = Tensor::new(&[1i64, 2], CPU).unwrap();
    let r = bias.addmm_scaled(&a, &b, 1, 2).unwrap();
    assert_eq!(r.to_vec::<i64>().unwrap(), vec![21, 28, 57, 82]);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn matmul_matches_naive(m in 0usize..6, k in 0usize..6, n in 0usize..6, batch in 0usize..3, ta in any::<bool>(), tb in any::<bool>(), dt in 0usize..3) {
        let dtype = [DType::F32, DType::F64, DType::I64][dt];
        let (av, bv) = (data(batch.max(1) * m * k, 1), data(k * n, 2));
        // build possibly transposed (non-contiguous) operands with the same values
        let a = if ta {
            Tensor::from_slice(&av, [batch.max(1), m, k], CPU).unwrap().transpose(1, 2).unwrap().contiguous().unwrap().transpose(1, 2).unwrap()
        } else {
            Tensor::from_slice(&av, [batch.max(1), m, k], CPU).unwrap()
        };
        let a = if batch == 0 { a.squeeze_dim(0).unwrap() } else { a };
        let b = Tensor::from_slice(&bv, [k, n], CPU).unwrap();
        let b = if tb { b.t().unwrap().contiguous().unwrap().t().unwrap() } else { b };
        let c = a.to_dtype(dtype).unwrap().matmul(&b.to_dtype(dtype).unwrap()).unwrap();
        let got = c.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
        let mut want = Vec::new();
        for bi in 0..batch.max(1) {
            want.extend(naive(&av[bi * m * k..(bi + 1) * m * k], &bv, m, k, n));
        }
        prop_assert_eq!(got, want);
    }
}

#[test]
fn large_matmul_runs_in_parallel() {
    let n = 96;
    let a = Tensor::arange(0, (n * n) as i64, DType::F64)
        .unwrap()
        .reshape([n, n])
        .unwrap()
        .div(1000.0)
        .unwrap();
    let b = a.t().unwrap();
    let av = a.to_vec::<f64>().unwrap();
    let bv = b.contiguous().unwrap().to_vec::<f64>().unwrap();
    let c = a.matmul(&b).unwrap().to_vec::<f64>().unwrap();
    let r = naive(&av, &bv, n, n, n);
    assert!(
        c.iter()
            .zip(&r)
            .all(|(x, y)| (x - y).abs() < 1e-9 * y.abs().max(1.0))
    );
}

fn index_select_gather_scatter(device: &Device) {
    let t = Tensor::arange(0, 12, device)
        .unwrap()
        .reshape([3, 4])
        .unwrap();
    let i = Tensor::new(&[2i32, 0, 2], device).unwrap();
    assert_eq!(t.index_select(0, &i).unwrap().dims(), &[3, 4]);
    assert_eq!(
        t.index_select(1, &i).unwrap().to_vec2::<i64>().unwrap()[1],
        vec![6, 4, 6]
    );
    assert_eq!(
        t.t()
            .unwrap()
            .index_select(-1, &i)
            .unwrap()
            .to_vec2::<i64>()
            .unwrap()[0],
        vec![8, 0, 8]
    );
    let bad = Tensor::new(&[3i64], device).unwrap();
    assert_eq!(
        t.index_select(0, &bad).unwrap_err().to_string(),
        "index_select: index 3 is out of bounds for dimension 0 with size 3"
    );
    let f = Tensor::new(&[0f32], device).unwrap();
    assert_eq!(
        t.index_select(0, &f).unwrap_err().to_string(),
        "index_select: expected indices of dtype torch.int64 or torch.int32, but found torch.float32"
    );
    assert!(
        t.index_select(0, &Tensor::new(&[-1i64], device).unwrap())
            .is_err()
    );
    assert_eq!(
        t.index_select(0, &Tensor::zeros([0], (device, DType::I64)).unwrap())
            .unwrap()
            .dims(),
        &[0, 4]
    );

    let g = Tensor::from_slice(&[0i64, 0, 1, 0], [2, 2], device).unwrap();
    let m = Tensor::from_slice(&[1f32, 2., 3., 4.], [2, 2], device).unwrap();
    assert_eq!(
        m.gather(1, &g).unwrap().to_vec::<f32>().unwrap(),
        vec![1., 1., 4., 3.]
    );
    assert_eq!(
        m.gather(0, &g).unwrap().to_vec::<f32>().unwrap(),
        vec![1., 2., 3., 2.]
    );
    assert!(m.gather(1, &Tensor::new(&[0i64], device).unwrap()).is_err());
    assert!(matches!(
        m.gather(1, &Tensor::from_slice(&[2i64], [1, 1], device).unwrap())
            .unwrap_err()
            .downcast_ref::<TensorError>(),
        Some(TensorError::IndexOutOfRange { index: 2, .. })
    ));

    let z = Tensor::zeros([3], device).unwrap();
    let idx = Tensor::new(&[0i64, 2, 0, 1], device).unwrap();
    let src = Tensor::new(&[1f32, 2., 3., 4.], device).unwrap();
    assert_eq!(
        z.scatter_add(0, &idx, &src)
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        vec![4., 4., 2.]
    );
    assert_eq!(z.to_vec::<f32>().unwrap(), vec![0.; 3], "out of place");
    let zi = Tensor::zeros([2, 2], (device, DType::I64)).unwrap();
    let ix = Tensor::from_slice(&[1i64, 1], [1, 2], device).unwrap();
    let sv = Tensor::from_slice(&[5i64, 6, 7, 8], [2, 2], device).unwrap();
    assert_eq!(
        zi.scatter_add(0, &ix, &sv)
            .unwrap()
            .to_vec::<i64>()
            .unwrap(),
        vec![0, 0, 5, 6]
    );
}
test_device!(index_select_gather_scatter, index_select_gather_scatter);

fn masked_fill_one_hot_embedding(device: &Device) {
    let t = Tensor::arange(0, 4, device).unwrap();
    let m = t.gt(1).unwrap();
    assert_eq!(
        t.masked_fill(&m, 9.7).unwrap().to_vec::<i64>().unwrap(),
        vec![0, 1, 9, 9]
    );
    assert!(t.masked_fill(&t, 0).is_err());
    let oh = Tensor::new(&[0i64, 2], device)
        .unwrap()
        .one_hot(Some(3))
        .unwrap();
    assert_eq!(
        oh.to_vec2::<i64>().unwrap(),
        vec![vec![1, 0, 0], vec![0, 0, 1]]
    );
    assert_eq!(
        Tensor::new(&[1i64, 3], device)
            .unwrap()
            .one_hot(None)
            .unwrap()
            .dims(),
        &[2, 4]
    );
    assert!(
        Tensor::new(&[3i64], device)
            .unwrap()
            .one_hot(Some(3))
            .is_err()
    );
    assert!(
        Tensor::new(&[-1i64], device)
            .unwrap()
            .one_hot(None)
            .is_err()
    );
    let w = Tensor::arange(0, 6, (device, DType::F32))
        .unwrap()
        .reshape([3, 2])
        .unwrap();
    let ids = Tensor::from_slice(&[2i64, 0, 1, 2], [2, 2], device).unwrap();
    let e = w.embedding(&ids).unwrap();
    assert_eq!(e.dims(), &[2, 2, 2]);
    assert_eq!(
        e.to_vec3::<f32>().unwrap()[0],
        vec![vec![4., 5.], vec![0., 1.]]
    );
    assert!(w.embedding(&Tensor::new(&[3i64], device).unwrap()).is_err());
}
test_device!(masked_fill_one_hot_embedding, masked_fill_one_hot_embedding);

/// Multi-index of flat position `i` in `dims` (row-major).
fn unflatten(mut i: usize, dims: &[usize]) -> Vec<usize> {
    let mut at = vec![0; dims.len()];
    for d in (0..dims.len()).rev() {
        at[d] = i % dims[d];
        i /= dims[d];
    }
    at
}

fn flatten(at: &[usize], dims: &[usize]) -> usize {
    at.iter().zip(dims).fold(0, |acc, (&a, &d)| acc * d + a)
}

/// scatter_add against a naive loop: ranks 1 to 3, every dim, an index tensor smaller than
/// `dst` and `src` (and transposed), in f64 and i64; one case above the CPU kernel's
/// parallel threshold (rows of dim 0 in parallel).
fn scatter_add_matches_a_naive_loop(device: &Device) {
    let check =
        |dst_dims: &[usize], idx_dims: &[usize], dim: usize, seed: u64, transposed: bool| {
            let r = dst_dims.len();
            let n_dst: usize = dst_dims.iter().product();
            let n_idx: usize = idx_dims.iter().product();
            // src has one more element than idx along every axis.
            let src_dims: Vec<usize> = idx_dims.iter().map(|d| d + 1).collect();
            let n_src: usize = src_dims.iter().product();
            let dst_v: Vec<f64> = (0..n_dst)
                .map(|i| ((i * 13 + seed as usize) % 11) as f64 - 5.0)
                .collect();
            let src_v: Vec<f64> = (0..n_src)
                .map(|i| ((i * 7 + seed as usize) % 17) as f64 - 8.0)
                .collect();
            let idx_v: Vec<i64> = (0..n_idx)
                .map(|i| ((i as u64 * 2654435761 + seed) % dst_dims[dim] as u64) as i64)
                .collect();
            let mut want = dst_v.clone();
            for (i, &p) in idx_v.iter().enumerate() {
                let at = unflatten(i, idx_dims);
                let mut to = at.clone();
                to[dim] = p as usize;
                want[flatten(&to, dst_dims)] += src_v[flatten(&at, &src_dims)];
            }
            let idx = if transposed && r >= 2 {
                // The same indices, held transposed in memory.
                let mut tdims = idx_dims.to_vec();
                tdims.swap(0, r - 1);
                let mut held = vec![0i64; n_idx];
                for (i, &v) in idx_v.iter().enumerate() {
                    let mut at = unflatten(i, idx_dims);
                    at.swap(0, r - 1);
                    held[flatten(&at, &tdims)] = v;
                }
                Tensor::from_vec(held, tdims, *device)
                    .unwrap()
                    .transpose(0, r - 1)
                    .unwrap()
            } else {
                Tensor::from_vec(idx_v.clone(), idx_dims.to_vec(), *device).unwrap()
            };
            // src narrowed to idx's shape (a strided view).
            let narrowed = |t: Tensor| (0..r).fold(t, |t, d| t.narrow(d, 0, idx_dims[d]).unwrap());
            let src = narrowed(Tensor::from_vec(src_v.clone(), src_dims.clone(), *device).unwrap());
            let dst = Tensor::from_vec(dst_v.clone(), dst_dims.to_vec(), *device).unwrap();
            let got = dst
                .scatter_add(dim, &idx, &src)
                .unwrap()
                .to_vec::<f64>()
                .unwrap();
            assert_eq!(
                got, want,
                "f64 {dst_dims:?} {idx_dims:?} dim {dim} transposed {transposed}"
            );
            let as_i64 = |v: &[f64]| v.iter().map(|&x| x as i64).collect::<Vec<i64>>();
            let dsti = Tensor::from_vec(as_i64(&dst_v), dst_dims.to_vec(), *device).unwrap();
            let srci =
                narrowed(Tensor::from_vec(as_i64(&src_v), src_dims.clone(), *device).unwrap());
            let goti = dsti
                .scatter_add(dim, &idx, &srci)
                .unwrap()
                .to_vec::<i64>()
                .unwrap();
            assert_eq!(
                goti,
                as_i64(&want),
                "i64 {dst_dims:?} {idx_dims:?} dim {dim}"
            );
        };
    proptest!(ProptestConfig::with_cases(64), |(
        dims in prop::collection::vec(1usize..=5, 1..=3),
        cut in prop::collection::vec(0usize..=2, 3),
        dim_pick in 0usize..3,
        seed in 0u64..1000,
        transposed in any::<bool>(),
    )| {
        let dim = dim_pick % dims.len();
        let idx_dims: Vec<usize> = dims
            .iter()
            .zip(&cut)
            .enumerate()
            .map(|(d, (&n, &c))| if d == dim { n + c } else { n.saturating_sub(c).max(1) })
            .collect();
        check(&dims, &idx_dims, dim, seed, transposed);
    });
    // Above the threshold: 64 rows of dim 0, scattered along dim 1 (max-pool backward's).
    check(&[64, 900], &[64, 700], 1, 3, false);
    check(&[64, 30, 30], &[64, 30, 20], 2, 5, true);
}
test_device!(
    scatter_add_matches_a_naive_loop,
    scatter_add_matches_a_naive_loop
);
