#![allow(clippy::unwrap_used)]
//! `F::scaled_dot_product_attention` against finite differences (`gradcheck`, f64): the
//! fused CPU kernel's backward and the math path (CUDA has no f64 kernel, so on `cuda:0`
//! only the math path is checked), with a bool mask, causal with `L != S`, grouped-query
//! attention, and a float mask that requires grad (math path, its gradient included).

use ember_autograd::{GradcheckOptions, gradcheck};
use ember_nn::Tensor;
use ember_nn::functional::{self as F, SdpaOptions};
use ember_tensor::backends::sdpa::{self, SdpaKernel};
use ember_tensor::{DType, Device};
use ember_testing::{rand_vec, test_device};

fn leaf(dims: &[usize], seed: u64, device: &Device) -> Tensor {
    let n = dims.iter().product();
    Tensor::from_vec(rand_vec(n, seed), dims, device)
        .unwrap()
        .to_dtype(DType::F64)
        .unwrap()
        .requires_grad_(true)
        .unwrap()
}

fn sdpa_passes_gradcheck(device: &Device) {
    let kernels: &[SdpaKernel] = if device.is_cuda() {
        &[SdpaKernel::Math]
    } else {
        &[SdpaKernel::Flash, SdpaKernel::Math]
    };
    let q = leaf(&[1, 4, 3, 5], 1, device);
    let k = leaf(&[1, 2, 4, 5], 2, device);
    let v = leaf(&[1, 2, 4, 3], 3, device);
    let keep: Vec<u8> = (0..12).map(|x| u8::from(x % 5 != 1)).collect();
    let mask = Tensor::from_vec(keep, [3, 4], device)
        .unwrap()
        .to_dtype(DType::Bool)
        .unwrap();
    let options = [
        SdpaOptions {
            attn_mask: Some(mask),
            enable_gqa: true,
            ..Default::default()
        },
        SdpaOptions {
            is_causal: true,
            scale: Some(0.7),
            enable_gqa: true,
            ..Default::default()
        },
    ];
    for &kernel in kernels {
        let _k = sdpa::scoped(kernel);
        for o in &options {
            let f = |x: &[Tensor]| F::scaled_dot_product_attention(&x[0], &x[1], &x[2], o);
            let inputs = [q.clone(), k.clone(), v.clone()];
            gradcheck(f, &inputs, GradcheckOptions::default()).unwrap();
        }
    }
    // A float mask that requires grad: the math path differentiates through it.
    let m = leaf(&[4, 3, 4], 4, device);
    let kv = [
        leaf(&[1, 4, 4, 5], 5, device),
        leaf(&[1, 4, 4, 3], 6, device),
    ];
    let f = |x: &[Tensor]| {
        let o = SdpaOptions {
            attn_mask: Some(x[3].clone()),
            ..Default::default()
        };
        F::scaled_dot_product_attention(&x[0], &x[1], &x[2], &o)
    };
    let inputs = [q.clone(), kv[0].clone(), kv[1].clone(), m];
    gradcheck(f, &inputs, GradcheckOptions::default()).unwrap();
}
test_device!(sdpa_passes_gradcheck, sdpa_passes_gradcheck);
