#![allow(clippy::unwrap_used)]
//! `MultiheadAttention`, the transformer layers, `Transformer`, `RMSNorm` and `triu`/`tril`
//! against PyTorch
//! (`reference/transformer_reference.json`, made by `reference/transformer_layers.py` in
//! float64): each module is built in f32 on the device, PyTorch's weights are loaded by
//! PyTorch's `state_dict` names, and the outputs, attention weights and the input
//! gradients of `sum(output · cotangent)` are compared. Both of `MultiheadAttention`'s
//! paths (`need_weights` true: explicit softmax; false: `scaled_dot_product_attention`)
//! run against the same numbers. Then gradcheck (f64) of `MultiheadAttention`, `triu`/`tril`
//! against a naive loop (proptest over shapes and diagonals), and the errors in PyTorch's
//! words.

use std::sync::OnceLock;

use ember_autograd::{GradcheckOptions, gradcheck};
use ember_nn::layers::{
    Activation, DecoderMasks, EncoderMasks, LayerNorm, MhaForward, MultiheadAttention,
    MultiheadAttentionConfig, RMSNorm, Transformer, TransformerConfig, TransformerDecoderLayer,
    TransformerEncoder, TransformerEncoderLayer, TransformerLayerConfig, TransformerMasks,
    generate_square_subsequent_mask, is_causal_mask,
};
use ember_nn::{Module, StateDict, Tensor};
use ember_tensor::{DType, Device};
use ember_testing::{Close, rand_vec, test_device};
use proptest::prelude::*;
use serde_json::Value;

fn reference() -> &'static Value {
    static REF: OnceLock<Value> = OnceLock::new();
    REF.get_or_init(|| {
        serde_json::from_str(include_str!("reference/transformer_reference.json")).unwrap()
    })
}

fn cases(kind: &str) -> Vec<(&'static String, &'static Value)> {
    let all = reference()["cases"].as_object().unwrap();
    let out: Vec<_> = all.iter().filter(|(_, c)| c["kind"] == kind).collect();
    assert!(!out.is_empty(), "no reference cases of kind {kind}");
    out
}

fn dims(v: &Value) -> Vec<usize> {
    v["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap() as usize)
        .collect()
}

fn floats(v: &Value) -> Vec<f64> {
    v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| match x {
            Value::String(s) if s == "-inf" => f64::NEG_INFINITY,
            x => x.as_f64().unwrap(),
        })
        .collect()
}

/// A reference tensor on `device`: bool as bool, floats as `dtype`.
fn tensor(v: &Value, device: &Device, dtype: DType) -> Tensor {
    let t = Tensor::from_vec(floats(v), dims(v), device).unwrap();
    if v["dtype"] == "bool" {
        t.ne(0.0).unwrap()
    } else {
        t.to_dtype(dtype).unwrap()
    }
}

fn opt_tensor(v: &Value, device: &Device) -> Option<Tensor> {
    (!v.is_null()).then(|| tensor(v, device, DType::F32))
}

fn leaf(v: &Value, device: &Device) -> Tensor {
    tensor(v, device, DType::F32).requires_grad_(true).unwrap()
}

/// Loads PyTorch's weights by PyTorch's names (strict: every key on both sides), after
/// checking that the module has exactly PyTorch's keys.
fn load(module: &dyn Module, sd: &Value, device: &Device) {
    let sd = sd.as_object().unwrap();
    let mut ours: Vec<String> = module.state_dict().unwrap().keys().cloned().collect();
    ours.sort();
    let theirs: Vec<String> = sd.keys().cloned().collect();
    assert_eq!(ours, theirs, "state_dict keys");
    let dict: StateDict = sd
        .iter()
        .map(|(k, v)| (k.clone(), tensor(v, device, DType::F32)))
        .collect();
    module.load_state_dict(&dict).unwrap();
}

/// f32 against PyTorch's float64.
fn check(actual: &Tensor, expected: &Value, what: &str) {
    assert_eq!(actual.dims(), dims(expected), "{what}: shape");
    let a = actual.to_dtype(DType::F64).unwrap();
    Close::new()
        .rtol_atol(1e-4, 2e-5)
        .context(what)
        .assert(&a.to_vec::<f64>().unwrap(), &floats(expected));
}

/// `sum(out · cotangent)` backward, then each input's gradient against the reference.
fn check_grads(out: &Tensor, case: &Value, inputs: &[(&str, &Tensor)], name: &str) {
    let cot = tensor(&case["cotangent"], &out.device(), DType::F32);
    out.mul(&cot)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    for (input, t) in inputs {
        let g = t.grad().unwrap();
        check(
            &g,
            &case["grads"][*input],
            &format!("{name}: grad of {input}"),
        );
    }
}

fn mha_matches_pytorch(device: &Device) {
    for (name, case) in cases("mha") {
        let c = &case["config"];
        let size = |k: &str| c[k].as_u64().map(|v| v as usize);
        let config = MultiheadAttentionConfig {
            bias: c["bias"].as_bool().unwrap(),
            kdim: size("kdim"),
            vdim: size("vdim"),
            batch_first: c["batch_first"].as_bool().unwrap(),
            ..Default::default()
        };
        let (e, h) = (size("embed_dim").unwrap(), size("num_heads").unwrap());
        let mha = MultiheadAttention::with_config(e, h, config, device).unwrap();
        mha.eval();
        load(&mha, &case["state_dict"], device);
        for need_weights in [true, false] {
            let what = format!("{name} (need_weights={need_weights})");
            let inputs = &case["inputs"];
            let (q, k, v) = (
                leaf(&inputs["query"], device),
                leaf(&inputs["key"], device),
                leaf(&inputs["value"], device),
            );
            let opts = MhaForward {
                key_padding_mask: opt_tensor(&case["key_padding_mask"], device),
                need_weights,
                attn_mask: opt_tensor(&case["attn_mask"], device),
                average_attn_weights: c["average_attn_weights"].as_bool().unwrap(),
                is_causal: c["is_causal"].as_bool().unwrap(),
            };
            let (out, w) = mha.forward_qkv(&q, &k, &v, &opts).unwrap();
            check(&out, &case["output"], &format!("{what}: output"));
            match w {
                Some(w) => check(&w, &case["weights"], &format!("{what}: weights")),
                None => assert!(!need_weights, "{what}: weights missing"),
            }
            check_grads(
                &out,
                case,
                &[("query", &q), ("key", &k), ("value", &v)],
                &what,
            );
        }
    }
}
test_device!(mha_matches_pytorch, mha_matches_pytorch);

fn layer_config(c: &Value) -> TransformerLayerConfig {
    TransformerLayerConfig {
        dim_feedforward: c["dim_feedforward"].as_u64().unwrap() as usize,
        dropout: 0.0,
        activation: match c["activation"].as_str().unwrap() {
            "relu" => Activation::Relu,
            _ => Activation::Gelu,
        },
        layer_norm_eps: c["layer_norm_eps"].as_f64().unwrap(),
        batch_first: c["batch_first"].as_bool().unwrap(),
        norm_first: c["norm_first"].as_bool().unwrap(),
        bias: c["bias"].as_bool().unwrap(),
    }
}

fn d_model_nhead(c: &Value) -> (usize, usize) {
    (
        c["d_model"].as_u64().unwrap() as usize,
        c["nhead"].as_u64().unwrap() as usize,
    )
}

fn encoder_layers_match_pytorch(device: &Device) {
    let stacks = cases("encoder_stack");
    for (name, case) in cases("encoder").into_iter().chain(stacks) {
        let c = &case["config"];
        let (d, h) = d_model_nhead(c);
        let layer = TransformerEncoderLayer::with_config(d, h, layer_config(c), device).unwrap();
        let masks = EncoderMasks {
            src_key_padding_mask: opt_tensor(&case["key_padding_mask"], device),
            ..Default::default()
        };
        let src = leaf(&case["inputs"]["src"], device);
        let out = match c["num_layers"].as_u64() {
            None => {
                layer.eval();
                load(&layer, &case["state_dict"], device);
                layer.forward_masked(&src, &masks).unwrap()
            }
            Some(n) => {
                let norm = LayerNorm::new(&[d], device).unwrap();
                let enc = TransformerEncoder::new(&layer, n as usize, Some(norm)).unwrap();
                enc.eval();
                load(&enc, &case["state_dict"], device);
                enc.forward_masked(&src, &masks).unwrap()
            }
        };
        check(&out, &case["output"], &format!("{name}: output"));
        check_grads(&out, case, &[("src", &src)], name);
    }
}
test_device!(encoder_layers_match_pytorch, encoder_layers_match_pytorch);

fn decoder_layers_match_pytorch(device: &Device) {
    for (name, case) in cases("decoder") {
        let c = &case["config"];
        let (d, h) = d_model_nhead(c);
        let layer = TransformerDecoderLayer::with_config(d, h, layer_config(c), device).unwrap();
        layer.eval();
        load(&layer, &case["state_dict"], device);
        let tgt = leaf(&case["inputs"]["tgt"], device);
        let memory = leaf(&case["inputs"]["memory"], device);
        let masks = DecoderMasks {
            tgt_mask: opt_tensor(&case["tgt_mask"], device),
            memory_key_padding_mask: opt_tensor(&case["memory_key_padding_mask"], device),
            tgt_is_causal: true,
            ..Default::default()
        };
        let out = layer.forward_with(&tgt, &memory, &masks).unwrap();
        check(&out, &case["output"], &format!("{name}: output"));
        check_grads(&out, case, &[("tgt", &tgt), ("memory", &memory)], name);
    }
}
test_device!(decoder_layers_match_pytorch, decoder_layers_match_pytorch);

/// `nn.Transformer` with PyTorch's weights: the causal `tgt_mask` is given without the
/// hint, so the decoder's detection ([`is_causal_mask`]) turns it into `is_causal`.
fn transformer_matches_pytorch(device: &Device) {
    for (name, case) in cases("transformer") {
        let c = &case["config"];
        let (d_model, nhead) = d_model_nhead(c);
        let n = |k: &str| c[k].as_u64().unwrap() as usize;
        let cfg = TransformerConfig {
            d_model,
            nhead,
            num_encoder_layers: n("num_encoder_layers"),
            num_decoder_layers: n("num_decoder_layers"),
            layer: layer_config(c),
        };
        let model = Transformer::with_config(cfg, device).unwrap();
        model.eval();
        load(&model, &case["state_dict"], device);
        let src = leaf(&case["inputs"]["src"], device);
        let tgt = leaf(&case["inputs"]["tgt"], device);
        let kpm = opt_tensor(&case["key_padding_mask"], device);
        let masks = TransformerMasks {
            tgt_mask: opt_tensor(&case["tgt_mask"], device),
            src_key_padding_mask: kpm.clone(),
            memory_key_padding_mask: kpm,
            ..Default::default()
        };
        let out = model.forward_with(&src, &tgt, &masks).unwrap();
        check(&out, &case["output"], &format!("{name}: output"));
        check_grads(&out, case, &[("src", &src), ("tgt", &tgt)], name);
    }
}
test_device!(transformer_matches_pytorch, transformer_matches_pytorch);

/// PyTorch's `_detect_is_causal_mask`: the float and bool causal masks of the right size
/// are found; another size, a transposed mask, one changed entry and integer masks are not.
fn causal_masks_are_detected(device: &Device) {
    let float = generate_square_subsequent_mask(5, device).unwrap();
    assert!(is_causal_mask(&float, 5).unwrap());
    assert!(!is_causal_mask(&float, 4).unwrap());
    assert!(!is_causal_mask(&float.transpose(0, 1).unwrap(), 5).unwrap());
    let f64_mask = generate_square_subsequent_mask(5, (*device, DType::F64)).unwrap();
    assert!(is_causal_mask(&f64_mask, 5).unwrap());
    let bool_mask = float.ne(0.0).unwrap();
    assert!(is_causal_mask(&bool_mask, 5).unwrap());
    let mut v = float.to_vec::<f32>().unwrap();
    v[1] = 0.0;
    let changed = Tensor::from_vec(v, [5, 5], device).unwrap();
    assert!(!is_causal_mask(&changed, 5).unwrap());
    assert!(!is_causal_mask(&bool_mask.to_dtype(DType::I64).unwrap(), 5).unwrap());
}
test_device!(causal_masks_are_detected, causal_masks_are_detected);

/// `Transformer`'s checks, in PyTorch's words, and its forward without a target.
#[test]
fn transformer_rejects_mismatched_inputs() {
    let layer = TransformerLayerConfig {
        dim_feedforward: 8,
        batch_first: true,
        ..Default::default()
    };
    let cfg = TransformerConfig {
        d_model: 4,
        nhead: 2,
        num_encoder_layers: 1,
        num_decoder_layers: 1,
        layer,
    };
    let model = Transformer::with_config(cfg, ()).unwrap();
    let x = |d: [usize; 3]| Tensor::randn(d, ()).unwrap();
    let none = TransformerMasks::default();
    let e = model
        .forward_with(&x([2, 3, 4]), &x([3, 3, 4]), &none)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("the batch number of src and tgt must be equal"),
        "{e}"
    );
    let e = model
        .forward_with(&x([2, 3, 4]), &x([2, 3, 5]), &none)
        .unwrap_err()
        .to_string();
    assert!(e.contains("must be equal to d_model 4"), "{e}");
    let e = model.forward(&x([2, 3, 4])).unwrap_err().to_string();
    assert!(e.contains("forward_with"), "{e}");
    // PyTorch's default size: 6 + 6 layers, 512 wide; every matrix Xavier-uniform.
    let big = Transformer::new(()).unwrap();
    assert_eq!(big.encoder.layers.len(), 6);
    assert_eq!(big.decoder.layers.len(), 6);
    let w = big.encoder.layers[0]
        .linear1
        .weight
        .to_vec::<f32>()
        .unwrap();
    let bound = (6.0f32 / (512.0 + 2048.0)).sqrt();
    assert!(w.iter().all(|x| x.abs() <= bound));
    // Above Linear's own bound (1 / sqrt(fan_in)): the Xavier re-initialisation ran.
    assert!(w.iter().any(|x| x.abs() > 1.0 / 512f32.sqrt()));
}

fn rms_norm_matches_pytorch(device: &Device) {
    for (name, case) in cases("rms_norm") {
        let c = &case["config"];
        let shape: Vec<usize> = c["normalized_shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap() as usize)
            .collect();
        let norm = RMSNorm::with_options(&shape, c["eps"].as_f64(), true, device).unwrap();
        load(&norm, &case["state_dict"], device);
        let x = leaf(&case["inputs"]["x"], device);
        let out = norm.call(&x).unwrap();
        check(&out, &case["output"], &format!("{name}: output"));
        let cot = tensor(&case["cotangent"], device, DType::F32);
        out.mul(&cot)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        check(
            &x.grad().unwrap(),
            &case["grads"]["x"],
            &format!("{name}: grad x"),
        );
        let w = norm.weight.as_ref().unwrap();
        check(
            &w.grad().unwrap(),
            &case["grads"]["weight"],
            &format!("{name}: grad weight"),
        );
    }
}
test_device!(rms_norm_matches_pytorch, rms_norm_matches_pytorch);

fn triangles_match_pytorch(device: &Device) {
    let tri = &reference()["triangle"];
    let x = tensor(&tri["x"], device, DType::F32);
    for d in [-2i64, -1, 0, 1, 3] {
        check(
            &x.triu(d).unwrap(),
            &tri[format!("triu_{d}")],
            &format!("triu({d})"),
        );
        check(
            &x.tril(d).unwrap(),
            &tri[format!("tril_{d}")],
            &format!("tril({d})"),
        );
    }
    // The gradient of sum(triu(x) · c) is triu(c): the same entries kept.
    let x = x.requires_grad_(true).unwrap();
    let c = Tensor::from_vec(rand_vec(24, 7), [2, 3, 4], device).unwrap();
    x.triu(1)
        .unwrap()
        .mul(&c)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    let g = x.grad().unwrap().to_vec::<f32>().unwrap();
    assert_eq!(g, c.triu(1).unwrap().to_vec::<f32>().unwrap());
    // Square causal mask: -inf above the diagonal, 0 on and below.
    let m = generate_square_subsequent_mask(4, device).unwrap();
    let m = m.to_vec::<f32>().unwrap();
    for i in 0..4 {
        for j in 0..4 {
            let want = if j > i { f32::NEG_INFINITY } else { 0.0 };
            assert_eq!(m[i * 4 + j], want, "mask[{i}][{j}]");
        }
    }
}
test_device!(triangles_match_pytorch, triangles_match_pytorch);

/// `triu`/`tril` of `dims` by direct loops over the last two dims.
fn naive_triangle(values: &[f64], dims: &[usize], diagonal: i64, upper: bool) -> Vec<f64> {
    let (r, c) = (dims[dims.len() - 2], dims[dims.len() - 1]);
    values
        .iter()
        .enumerate()
        .map(|(idx, &v)| {
            let (i, j) = (((idx / c) % r.max(1)) as i64, (idx % c) as i64);
            let keep = if upper {
                j - i >= diagonal
            } else {
                j - i <= diagonal
            };
            if keep { v } else { 0.0 }
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn triangles_match_naive_loops(
        dims in proptest::collection::vec(0usize..5, 2..5),
        diagonal in -6i64..6,
        dtype in prop_oneof![Just(DType::F32), Just(DType::I64), Just(DType::Bool), Just(DType::F64)],
    ) {
        let n: usize = dims.iter().product();
        let values: Vec<f64> = (0..n).map(|i| ((i * 7 + 3) % 11) as f64 - 4.0).collect();
        let x = Tensor::from_vec(values.clone(), dims.clone(), Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let as_typed = x.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
        for upper in [true, false] {
            let y = if upper { x.triu(diagonal) } else { x.tril(diagonal) }.unwrap();
            prop_assert_eq!(y.dtype(), dtype);
            prop_assert_eq!(y.dims(), dims.clone());
            let got = y.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
            prop_assert_eq!(got, naive_triangle(&as_typed, &dims, diagonal, upper));
        }
    }
}

#[test]
fn triangles_need_two_dims() {
    let x = Tensor::ones([3], ()).unwrap();
    let e = x.triu(0).unwrap_err().to_string();
    assert!(
        e.contains("triu: input tensor must have at least 2 dimensions"),
        "{e}"
    );
    let e = x.tril(0).unwrap_err().to_string();
    assert!(
        e.contains("tril: input tensor must have at least 2 dimensions"),
        "{e}"
    );
}

fn f64_leaf(dims: &[usize], seed: u64, device: &Device) -> Tensor {
    let n = dims.iter().product();
    Tensor::from_vec(rand_vec(n, seed), dims, device)
        .unwrap()
        .to_dtype(DType::F64)
        .unwrap()
        .requires_grad_(true)
        .unwrap()
}

/// Finite differences (f64) through both paths: explicit weights with a key padding mask
/// and a float mask, the fused op with a bool mask, separate k/v projections.
fn mha_passes_gradcheck(device: &Device) {
    let opts = (device, DType::F64);
    let packed = MultiheadAttention::new(4, 2, opts).unwrap();
    let separate = MultiheadAttention::with_config(
        4,
        2,
        MultiheadAttentionConfig {
            kdim: Some(3),
            vdim: Some(5),
            batch_first: true,
            ..Default::default()
        },
        opts,
    )
    .unwrap();
    let kpm = Tensor::from_vec(vec![0u8, 0, 1, 0, 0, 0], [2, 3], device)
        .unwrap()
        .ne(0.0)
        .unwrap();
    let float_mask = f64_leaf(&[2, 3], 9, device).detach();
    let bool_mask = Tensor::from_vec(vec![0u8, 1, 0, 0, 0, 1], [2, 3], device)
        .unwrap()
        .ne(0.0)
        .unwrap();
    let q = f64_leaf(&[2, 2, 4], 1, device);
    let k = f64_leaf(&[3, 2, 4], 2, device);
    let v = f64_leaf(&[3, 2, 4], 3, device);
    for need_weights in [true, false] {
        let o = MhaForward {
            key_padding_mask: Some(kpm.clone()),
            attn_mask: Some(if need_weights {
                float_mask.clone()
            } else {
                bool_mask.clone()
            }),
            need_weights,
            ..Default::default()
        };
        let f = |x: &[Tensor]| Ok(packed.forward_qkv(&x[0], &x[1], &x[2], &o)?.0);
        let inputs = [q.clone(), k.clone(), v.clone()];
        gradcheck(f, &inputs, GradcheckOptions::default()).unwrap();
    }
    let qs = f64_leaf(&[2, 2, 4], 4, device);
    let ks = f64_leaf(&[2, 3, 3], 5, device);
    let vs = f64_leaf(&[2, 3, 5], 6, device);
    let o = MhaForward::default();
    let f = |x: &[Tensor]| {
        let (out, w) = separate.forward_qkv(&x[0], &x[1], &x[2], &o)?;
        // The weights too: sum both into one output.
        let w = w.ok_or_else(|| ember_nn::NnError::invalid("test", "no weights"))?;
        out.sum_all()?.add(&w.mul(&w)?.sum_all()?)
    };
    gradcheck(f, &[qs, ks, vs], GradcheckOptions::default()).unwrap();
}
test_device!(mha_passes_gradcheck, mha_passes_gradcheck);

fn errors_use_pytorchs_words(device: &Device) {
    let err = |r: ember_nn::Result<(Tensor, Option<Tensor>)>| r.unwrap_err().to_string();
    let e = MultiheadAttention::new(6, 4, device)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("embed_dim must be divisible by num_heads"),
        "{e}"
    );
    let cfg = MultiheadAttentionConfig {
        add_bias_kv: true,
        ..Default::default()
    };
    let e = MultiheadAttention::with_config(8, 2, cfg, device)
        .unwrap_err()
        .to_string();
    assert!(e.contains("add_bias_kv"), "{e}");

    let mha = MultiheadAttention::new(8, 2, device).unwrap();
    let q = Tensor::zeros([3, 2, 8], device).unwrap();
    let kv = Tensor::zeros([4, 2, 8], device).unwrap();
    let with = |o: MhaForward| err(mha.forward_qkv(&q, &kv, &kv, &o));

    let e = with(MhaForward {
        attn_mask: Some(Tensor::zeros([3, 3], device).unwrap()),
        ..Default::default()
    });
    assert!(
        e.contains("The shape of the 2D attn_mask is torch.Size([3, 3]), but should be (3, 4)."),
        "{e}"
    );
    let e = with(MhaForward {
        attn_mask: Some(Tensor::zeros([2, 3, 4], device).unwrap()),
        ..Default::default()
    });
    assert!(
        e.contains(
            "The shape of the 3D attn_mask is torch.Size([2, 3, 4]), but should be (4, 3, 4)."
        ),
        "{e}"
    );
    let e = with(MhaForward {
        attn_mask: Some(Tensor::zeros([1, 1, 3, 4], device).unwrap()),
        ..Default::default()
    });
    assert!(
        e.contains("expected `attn_mask` to be `None`, 2-D or 3-D but found 4-D"),
        "{e}"
    );
    let e = with(MhaForward {
        key_padding_mask: Some(Tensor::zeros([2, 3], device).unwrap()),
        ..Default::default()
    });
    assert!(
        e.contains("expecting key_padding_mask shape of (2, 4), but got torch.Size([2, 3])"),
        "{e}"
    );
    let e = with(MhaForward {
        key_padding_mask: Some(Tensor::zeros([2, 4], (device, DType::I64)).unwrap()),
        ..Default::default()
    });
    assert!(
        e.contains("only bool and floating types of key_padding_mask are supported"),
        "{e}"
    );
    let e = with(MhaForward {
        is_causal: true,
        ..Default::default()
    });
    assert!(
        e.contains("Need attn_mask if specifying the is_causal hint"),
        "{e}"
    );

    let e = err(mha.forward_qkv(
        &q,
        &kv.narrow(2, 0, 6).unwrap(),
        &kv,
        &MhaForward::default(),
    ));
    assert!(e.contains("kdim"), "{e}");
    let q4 = Tensor::zeros([1, 3, 2, 8], device).unwrap();
    let e = err(mha.forward_qkv(&q4, &q4, &q4, &MhaForward::default()));
    assert!(
        e.contains(
            "query should be unbatched 2D or batched 3D tensor but received 4-D query tensor"
        ),
        "{e}"
    );
    let e = err(mha.forward_qkv(
        &q,
        &kv.narrow(1, 0, 1).unwrap().squeeze_dim(1).unwrap(),
        &kv,
        &MhaForward::default(),
    ));
    assert!(
        e.contains("expected `key` and `value` to be 3-D but found 2-D and 3-D"),
        "{e}"
    );
    let q7 = Tensor::zeros([3, 2, 7], device).unwrap();
    let e = err(mha.forward_qkv(&q7, &kv, &kv, &MhaForward::default()));
    assert!(
        e.contains("was expecting embedding dimension of 8, but got 7"),
        "{e}"
    );

    // Unbatched: a 3-D mask must be [num_heads, L, S].
    let (q2, kv2) = (
        q.narrow(1, 0, 1).unwrap().squeeze_dim(1).unwrap(),
        kv.narrow(1, 0, 1).unwrap().squeeze_dim(1).unwrap(),
    );
    let o = MhaForward {
        attn_mask: Some(Tensor::zeros([4, 3, 4], device).unwrap()),
        ..Default::default()
    };
    let e = err(mha.forward_qkv(&q2, &kv2, &kv2, &o));
    assert!(
        e.contains("Expected `attn_mask` shape to be (2, 3, 4) but got torch.Size([4, 3, 4])"),
        "{e}"
    );

    // The decoder layer needs a memory; the encoder layer names the attention that failed.
    let cfg = TransformerLayerConfig {
        dim_feedforward: 16,
        ..Default::default()
    };
    let dec = TransformerDecoderLayer::with_config(8, 2, cfg, device).unwrap();
    let e = dec.call(&q).unwrap_err().to_string();
    assert!(e.contains("forward_with"), "{e}");
    let e = TransformerEncoderLayer::with_config(8, 3, cfg, device)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("embed_dim must be divisible by num_heads"),
        "{e}"
    );
}
test_device!(errors_use_pytorchs_words, errors_use_pytorchs_words);

/// Layers built as PyTorch builds them: the encoder's layers are separate copies with
/// the same values, and `bias=False` drops every bias as PyTorch's does.
#[test]
fn construction_matches_pytorchs_names() {
    let cfg = TransformerLayerConfig {
        dim_feedforward: 16,
        bias: false,
        ..Default::default()
    };
    let layer = TransformerEncoderLayer::with_config(8, 2, cfg, ()).unwrap();
    let keys: Vec<String> = layer.state_dict().unwrap().keys().cloned().collect();
    assert_eq!(
        keys,
        [
            "self_attn.in_proj_weight",
            "self_attn.out_proj.weight",
            "linear1.weight",
            "linear2.weight",
            "norm1.weight",
            "norm2.weight",
        ]
    );
    let enc = TransformerEncoder::new(&layer, 2, None).unwrap();
    let (a, b) = (&enc.layers[0].linear1.weight, &enc.layers[1].linear1.weight);
    assert!(!a.same(b), "the layers share a parameter");
    assert_eq!(a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
    assert_eq!(enc.named_parameters().len(), 12);
    let mha = MultiheadAttention::new(8, 2, ()).unwrap();
    let bias = mha.in_proj_bias.as_ref().unwrap().to_vec::<f32>().unwrap();
    assert!(bias.iter().all(|&b| b == 0.0));
    let out_bias = mha.out_proj.bias.as_ref().unwrap().to_vec::<f32>().unwrap();
    assert!(out_bias.iter().all(|&b| b == 0.0));
    // Xavier-uniform on [24, 8]: |w| <= sqrt(6 / 32).
    let bound = (6.0f32 / 32.0).sqrt();
    let w = mha
        .in_proj_weight
        .as_ref()
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert!(w.iter().all(|v| v.abs() <= bound));
}
