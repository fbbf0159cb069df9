"""PyTorch reference for crates/ember-nn/tests/transformer.rs.

Builds MultiheadAttention, TransformerEncoderLayer, TransformerDecoderLayer,
TransformerEncoder, Transformer and RMSNorm in float64 with deterministic weights (a seeded
torch.Generator, written into the JSON by PyTorch's state_dict names), runs them in eval
mode on fixed inputs, and saves outputs, attention weights and the gradients of
sum(output * cotangent) with respect to the inputs. Also triu/tril of a fixed tensor.

Run from the repository root (CPU only):
    /work/venv-torch/bin/python crates/ember-nn/tests/reference/transformer_layers.py
It writes crates/ember-nn/tests/reference/transformer_reference.json.
"""

import json
import os

import torch
from torch import nn

torch.set_default_dtype(torch.float64)
SEED = [1000]


def randn(*shape, scale=1.0):
    SEED[0] += 1
    g = torch.Generator().manual_seed(SEED[0])
    return torch.randn(*shape, generator=g, dtype=torch.float64) * scale


def enc(t):
    t = t.detach()
    if t.dtype == torch.bool:
        return {"shape": list(t.shape), "dtype": "bool", "data": [int(v) for v in t.flatten().tolist()]}
    # 12 significant digits: far below the f32 tolerance the Rust test compares with.
    data = [float(f"{v:.12g}") if v != float("-inf") else "-inf" for v in t.flatten().tolist()]
    return {"shape": list(t.shape), "dtype": "float", "data": data}


def set_weights(module):
    """Every parameter from the seeded generator; norms' weights near 1."""
    sd = {}
    with torch.no_grad():
        for name, p in module.named_parameters():
            v = randn(*p.shape, scale=0.3)
            if name.split(".")[-2:-1] and name.split(".")[-2].startswith("norm") and name.endswith("weight"):
                v = 1.0 + v
            p.copy_(v)
    for name, t in module.state_dict().items():
        sd[name] = enc(t)
    return sd


def leaf(*shape):
    return randn(*shape).requires_grad_(True)


def run(fn, inputs):
    """Outputs of fn(*inputs) and grads of sum(out[0] * cot) w.r.t. the inputs."""
    outs = fn(*inputs)
    out = outs[0]
    cot = randn(*out.shape)
    grads = torch.autograd.grad((out * cot).sum(), inputs)
    return outs, cot, grads


def mha_case(name, E, H, L, S, N, batch_first, kdim=None, vdim=None, unbatched=False,
             key_padding_mask=None, attn_mask=None, is_causal=False, need_weights=True,
             average=True, bias=True):
    m = nn.MultiheadAttention(E, H, bias=bias, kdim=kdim, vdim=vdim, batch_first=batch_first)
    m.eval()
    sd = set_weights(m)
    kd, vd = kdim or E, vdim or E
    if unbatched:
        q, k, v = leaf(L, E), leaf(S, kd), leaf(S, vd)
    elif batch_first:
        q, k, v = leaf(N, L, E), leaf(N, S, kd), leaf(N, S, vd)
    else:
        q, k, v = leaf(L, N, E), leaf(S, N, kd), leaf(S, N, vd)

    def f(q, k, v):
        return m(q, k, v, key_padding_mask=key_padding_mask, need_weights=need_weights,
                 attn_mask=attn_mask, average_attn_weights=average, is_causal=is_causal)

    (out, w), cot, grads = run(f, [q, k, v])
    case = {
        "kind": "mha",
        "config": {"embed_dim": E, "num_heads": H, "kdim": kdim, "vdim": vdim,
                   "batch_first": batch_first, "bias": bias, "is_causal": is_causal,
                   "need_weights": need_weights, "average_attn_weights": average},
        "state_dict": sd,
        "inputs": {"query": enc(q), "key": enc(k), "value": enc(v)},
        "cotangent": enc(cot),
        "output": enc(out),
        "grads": {"query": enc(grads[0]), "key": enc(grads[1]), "value": enc(grads[2])},
    }
    if key_padding_mask is not None:
        case["key_padding_mask"] = enc(key_padding_mask)
    if attn_mask is not None:
        case["attn_mask"] = enc(attn_mask)
    if w is not None:
        case["weights"] = enc(w)
    return name, case


def layer_config(d_model, nhead, ff, activation, norm_first, batch_first, bias=True):
    return {"d_model": d_model, "nhead": nhead, "dim_feedforward": ff, "activation": activation,
            "norm_first": norm_first, "batch_first": batch_first, "bias": bias,
            "layer_norm_eps": 1e-5}


def encoder_case(name, norm_first, activation, num_layers=None):
    d, h, ff, S, N = 8, 2, 16, 5, 2
    cfg = layer_config(d, h, ff, activation, norm_first, False)
    layer = nn.TransformerEncoderLayer(d, h, dim_feedforward=ff, dropout=0.0, activation=activation,
                                       norm_first=norm_first)
    if num_layers is None:
        m = layer
    else:
        m = nn.TransformerEncoder(layer, num_layers, norm=nn.LayerNorm(d), enable_nested_tensor=False)
        cfg["num_layers"] = num_layers
    m.eval()
    sd = set_weights(m)
    src = leaf(S, N, d)
    kpm = torch.tensor([[False, False, False, True, True], [False, False, False, False, False]])

    def f(src):
        if num_layers is None:
            return (m(src, src_key_padding_mask=kpm),)
        return (m(src, src_key_padding_mask=kpm),)

    (out,), cot, grads = run(f, [src])
    return name, {
        "kind": "encoder" if num_layers is None else "encoder_stack",
        "config": cfg, "state_dict": sd,
        "inputs": {"src": enc(src)}, "key_padding_mask": enc(kpm),
        "cotangent": enc(cot), "output": enc(out), "grads": {"src": enc(grads[0])},
    }


def decoder_case(name, norm_first, activation):
    d, h, ff, T, S, N = 8, 2, 16, 4, 5, 2
    cfg = layer_config(d, h, ff, activation, norm_first, True)
    m = nn.TransformerDecoderLayer(d, h, dim_feedforward=ff, dropout=0.0, activation=activation,
                                   norm_first=norm_first, batch_first=True)
    m.eval()
    sd = set_weights(m)
    tgt, memory = leaf(N, T, d), leaf(N, S, d)
    tgt_mask = nn.Transformer.generate_square_subsequent_mask(T)
    mkpm = torch.tensor([[False, False, True, False, True], [False, False, False, False, False]])

    def f(tgt, memory):
        return (m(tgt, memory, tgt_mask=tgt_mask, memory_key_padding_mask=mkpm, tgt_is_causal=True),)

    (out,), cot, grads = run(f, [tgt, memory])
    return name, {
        "kind": "decoder", "config": cfg, "state_dict": sd,
        "inputs": {"tgt": enc(tgt), "memory": enc(memory)},
        "tgt_mask": enc(tgt_mask), "memory_key_padding_mask": enc(mkpm),
        "cotangent": enc(cot), "output": enc(out),
        "grads": {"tgt": enc(grads[0]), "memory": enc(grads[1])},
    }


def rms_case(name, shape, normalized, eps):
    m = nn.RMSNorm(normalized, eps=eps)
    sd = set_weights(m)
    x = leaf(*shape)
    xs = [x, m.weight]
    out = m(x)
    cot = randn(*out.shape)
    gx, gw = torch.autograd.grad((out * cot).sum(), xs)
    return name, {
        "kind": "rms_norm", "config": {"normalized_shape": normalized, "eps": eps},
        "state_dict": sd, "inputs": {"x": enc(x)}, "cotangent": enc(cot),
        "output": enc(out), "grads": {"x": enc(gx), "weight": enc(gw)},
    }


def transformer_case(name):
    """nn.Transformer (2 encoder and 2 decoder layers, batch_first, pre-norm GELU), its own
    xavier init overwritten by the seeded weights; the tgt mask is the causal mask, given
    without the is_causal hint (so Transformer's detection decides)."""
    d, h, ff, S, T, N = 8, 2, 16, 5, 4, 2
    cfg = layer_config(d, h, ff, "gelu", True, True)
    cfg["num_encoder_layers"], cfg["num_decoder_layers"] = 2, 2
    m = nn.Transformer(d, h, num_encoder_layers=2, num_decoder_layers=2, dim_feedforward=ff,
                       dropout=0.0, activation="gelu", batch_first=True, norm_first=True)
    m.eval()
    sd = set_weights(m)
    src, tgt = leaf(N, S, d), leaf(N, T, d)
    tgt_mask = nn.Transformer.generate_square_subsequent_mask(T)
    skpm = torch.tensor([[False, False, False, True, True], [False, False, False, False, False]])

    def f(src, tgt):
        return (m(src, tgt, tgt_mask=tgt_mask, src_key_padding_mask=skpm,
                  memory_key_padding_mask=skpm),)

    (out,), cot, grads = run(f, [src, tgt])
    return name, {
        "kind": "transformer", "config": cfg, "state_dict": sd,
        "inputs": {"src": enc(src), "tgt": enc(tgt)},
        "tgt_mask": enc(tgt_mask), "key_padding_mask": enc(skpm),
        "cotangent": enc(cot), "output": enc(out),
        "grads": {"src": enc(grads[0]), "tgt": enc(grads[1])},
    }


def main():
    cases = {}
    N, L, S = 2, 3, 4
    kpm = torch.tensor([[False, False, True, True], [False, True, False, False]])
    causal = nn.Transformer.generate_square_subsequent_mask(4)
    bool_mask = torch.tensor([[False, True, False, False], [False, False, True, False],
                              [True, False, False, False]])
    for name, case in [
        mha_case("mha_key_padding", 8, 2, L, S, N, batch_first=False, key_padding_mask=kpm),
        mha_case("mha_causal_float_batch_first", 8, 2, 4, 4, N, batch_first=True,
                 attn_mask=causal, is_causal=True, need_weights=True, average=False),
        mha_case("mha_kdim_vdim_bool_mask", 8, 4, L, S, N, batch_first=False, kdim=5, vdim=3,
                 attn_mask=bool_mask, key_padding_mask=kpm),
        mha_case("mha_unbatched_no_bias", 6, 3, L, S, N, batch_first=False, unbatched=True,
                 attn_mask=randn(3, L, S), bias=False),
        encoder_case("encoder_post_norm_relu", norm_first=False, activation="relu"),
        encoder_case("encoder_pre_norm_gelu", norm_first=True, activation="gelu"),
        encoder_case("encoder_stack_2", norm_first=False, activation="relu", num_layers=2),
        decoder_case("decoder_post_norm_relu", norm_first=False, activation="relu"),
        decoder_case("decoder_pre_norm_gelu", norm_first=True, activation="gelu"),
        rms_case("rms_norm_eps_none", [2, 3, 4], [3, 4], None),
        rms_case("rms_norm_eps", [5, 6], [6], 1e-3),
    ]:
        cases[name] = case
    x = randn(2, 3, 4)
    tri = {"x": enc(x)}
    for d in (-2, -1, 0, 1, 3):
        tri[f"triu_{d}"] = enc(torch.triu(x, d))
        tri[f"tril_{d}"] = enc(torch.tril(x, d))
    # Last, so that the seeds of the cases above are unchanged.
    name, case = transformer_case("transformer_pre_norm_gelu")
    cases[name] = case
    out = {"torch_version": torch.__version__, "cases": cases, "triangle": tri}
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "transformer_reference.json")
    with open(path, "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
