"""Writes attention_reference.json: torch.nn.functional.scaled_dot_product_attention on its
math backend in f64, outputs and gradients, the oracle of the f64 reference
(ember_testing::reference::attention) and of the fused kernels in
crates/ember-kernels/tests/attention.rs.

Run from the repository root (PyTorch 2.5 or later, whose math path gives fully masked rows
0 through _safe_softmax; CPU is enough):

    python crates/ember-kernels/tests/reference/make_attention_reference.py

Each case lists its shape (B, H, G, L, S, E, Ev), options, the inputs q [B, H, L, E],
k [B, G, S, E], v [B, G, S, Ev], the output gradient dout [B, H, L, Ev], the mask (stored
shape [B|1, H|1, L|1, S], bool or float; "-inf" for minus infinity) and PyTorch's out, dq,
dk and dv, all flattened row-major.
"""

import json
import math
import os

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

CASES = [
    # name, (B, H, G, L, S, E, Ev), causal, mask kind, mask shape, scale
    ("gqa_bool_mask_fully_masked_row", (1, 4, 2, 3, 5, 4, 3), False, "bool", (1, 1, 3, 5), 0.7),
    ("causal_l_longer_than_s", (1, 2, 2, 4, 2, 3, 3), True, None, None, None),
    ("causal_l_shorter_than_s", (2, 1, 1, 2, 4, 3, 2), True, None, None, None),
    ("float_mask_broadcast_over_heads", (2, 2, 2, 3, 6, 5, 5), False, "float", (2, 1, 3, 6), None),
    ("one_query", (1, 3, 1, 1, 7, 8, 8), False, None, None, 0.25),
]


def number(x):
    if math.isinf(x):
        return "-inf" if x < 0 else "inf"
    return x


def flat(t):
    return [number(float(x)) for x in t.detach().reshape(-1).tolist()]


def main():
    g = torch.Generator().manual_seed(44)
    out = {"torch": torch.__version__, "cases": []}
    for name, (b, h, kvh, l, s, e, ev), causal, kind, mshape, scale in CASES:
        q = torch.randn(b, h, l, e, generator=g, dtype=torch.float64, requires_grad=True)
        k = torch.randn(b, kvh, s, e, generator=g, dtype=torch.float64, requires_grad=True)
        v = torch.randn(b, kvh, s, ev, generator=g, dtype=torch.float64, requires_grad=True)
        dout = torch.randn(b, h, l, ev, generator=g, dtype=torch.float64)
        mask = None
        if kind == "bool":
            mask = torch.rand(*mshape, generator=g) > 0.3
            mask[..., 1, :] = False  # a fully masked row
        elif kind == "float":
            mask = torch.randn(*mshape, generator=g, dtype=torch.float64)
            mask[torch.rand(*mshape, generator=g) < 0.2] = -math.inf
            mask[..., 2, :] = -math.inf
        with sdpa_kernel(SDPBackend.MATH):
            o = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=h != kvh
            )
        o.backward(dout)
        out["cases"].append({
            "name": name,
            "shape": [b, h, kvh, l, s, e, ev],
            "causal": causal,
            "scale": scale if scale is not None else 1.0 / math.sqrt(e),
            "mask_kind": kind,
            "mask_shape": list(mshape) if mshape else None,
            "mask": flat(mask.to(torch.float64)) if mask is not None else None,
            "q": flat(q), "k": flat(k), "v": flat(v), "dout": flat(dout),
            "out": flat(o), "dq": flat(q.grad), "dk": flat(k.grad), "dv": flat(v.grad),
        })
    path = os.path.join(os.path.dirname(__file__), "attention_reference.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=None)
        f.write("\n")


if __name__ == "__main__":
    main()
