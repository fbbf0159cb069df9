"""Writes cross_entropy_reference.json: PyTorch's torch.nn.functional.cross_entropy in f64,
losses and gradients, the oracle of `pytorch_numbers` in crates/ember-tensor/tests/loss_probs.rs.

Run from the repository root (CPU is enough):

    python crates/ember-tensor/tests/reference/make_cross_entropy_reference.py

Each case lists the input shape ([C], [N, C] or [N, C, d1, ...]), the input, the target
(class indices, flattened, with target_kind "index"; or class probabilities of the input's
shape with target_kind "probs"), the weight or null, ignore_index or null (PyTorch's
default -100), label_smoothing, the reduction, the output gradient dout (of the loss's
shape: [] for mean and sum), and PyTorch's loss, its shape, the gradient to the input and,
for probability targets, the gradient to the target; all flattened row-major.
"""

import json
import os

import torch
import torch.nn.functional as F

# name, input shape, target kind, weighted, ignore_index, label_smoothing, reduction
CASES = [
    ("index_none", (4, 5), "index", False, None, 0.0, "none"),
    ("index_mean", (4, 5), "index", False, None, 0.0, "mean"),
    ("index_sum", (4, 5), "index", False, None, 0.0, "sum"),
    ("index_weight_mean", (4, 5), "index", True, None, 0.0, "mean"),
    ("index_smooth_none", (4, 5), "index", False, None, 0.2, "none"),
    ("index_smooth_mean", (4, 5), "index", False, None, 0.2, "mean"),
    ("index_smooth_sum", (4, 5), "index", False, None, 0.2, "sum"),
    ("index_weight_smooth_mean", (4, 5), "index", True, None, 0.1, "mean"),
    ("index_weight_smooth_none", (4, 5), "index", True, None, 0.1, "none"),
    ("index_ignore_smooth_mean", (6, 4), "index", False, 2, 0.3, "mean"),
    ("index_ignore_smooth_none", (6, 4), "index", False, 2, 0.3, "none"),
    ("index_weight_ignore_smooth_mean", (6, 4), "index", True, 1, 0.25, "mean"),
    ("index_weight_ignore_smooth_sum", (6, 4), "index", True, 1, 0.25, "sum"),
    ("index_unbatched_smooth", (5,), "index", True, None, 0.15, "mean"),
    ("index_kdim_smooth_none", (2, 3, 4), "index", False, None, 0.1, "none"),
    ("index_kdim_weight_smooth_mean", (2, 3, 4), "index", True, None, 0.1, "mean"),
    ("index_kdim_ignore_smooth_mean", (2, 3, 4), "index", True, 0, 0.2, "mean"),
    ("probs_none", (4, 5), "probs", False, None, 0.0, "none"),
    ("probs_mean", (4, 5), "probs", False, None, 0.0, "mean"),
    ("probs_sum", (4, 5), "probs", False, None, 0.0, "sum"),
    ("probs_weight_mean", (4, 5), "probs", True, None, 0.0, "mean"),
    ("probs_weight_none", (4, 5), "probs", True, None, 0.0, "none"),
    ("probs_smooth_mean", (4, 5), "probs", False, None, 0.2, "mean"),
    ("probs_weight_smooth_sum", (4, 5), "probs", True, None, 0.3, "sum"),
    ("probs_weight_smooth_mean", (4, 5), "probs", True, None, 0.1, "mean"),
    ("probs_unnormalised_smooth_none", (3, 4), "probs_raw", True, None, 0.4, "none"),
    ("probs_unbatched_smooth", (5,), "probs", True, None, 0.15, "mean"),
    ("probs_kdim_none", (2, 3, 4), "probs", False, None, 0.0, "none"),
    ("probs_kdim_weight_smooth_mean", (2, 3, 4), "probs", True, None, 0.1, "mean"),
    ("probs_kdim_smooth_sum", (2, 3, 2, 2), "probs", False, None, 0.5, "sum"),
    ("probs_full_smoothing", (3, 4), "probs", True, None, 1.0, "mean"),
]


def flat(t):
    return [float(x) for x in t.detach().reshape(-1).tolist()]


def main():
    g = torch.Generator().manual_seed(45)
    out = {"torch": torch.__version__, "cases": []}
    for name, shape, kind, weighted, ignore, eps, red in CASES:
        c = shape[0] if len(shape) == 1 else shape[1]
        x = (torch.randn(*shape, generator=g, dtype=torch.float64) * 2).requires_grad_(True)
        weight = torch.rand(c, generator=g, dtype=torch.float64) + 0.5 if weighted else None
        if kind == "index":
            tshape = () if len(shape) == 1 else (shape[0],) + tuple(shape[2:])
            target = torch.randint(0, c, tshape, generator=g)
            if ignore is not None:
                flat_t = target.reshape(-1)
                flat_t[::3] = ignore  # some rows ignored, whatever their class
            t_req = None
        else:
            raw = torch.rand(*shape, generator=g, dtype=torch.float64) + 0.1
            dim = 0 if len(shape) == 1 else 1
            target = raw if kind == "probs_raw" else raw / raw.sum(dim, keepdim=True)
            target = target.clone().requires_grad_(True)
            t_req = target
        kwargs = {"weight": weight, "reduction": red, "label_smoothing": eps}
        if ignore is not None:
            kwargs["ignore_index"] = ignore
        loss = F.cross_entropy(x, target, **kwargs)
        dout = torch.rand(loss.shape, generator=g, dtype=torch.float64) + 0.25
        loss.backward(dout)
        out["cases"].append({
            "name": name,
            "shape": list(shape),
            "target_kind": "index" if kind == "index" else "probs",
            "input": flat(x),
            "target": flat(target.to(torch.float64)),
            "weight": flat(weight) if weight is not None else None,
            "ignore_index": ignore,
            "label_smoothing": eps,
            "reduction": red,
            "loss_shape": list(loss.shape),
            "dout": flat(dout),
            "loss": flat(loss),
            "dinput": flat(x.grad),
            "dtarget": flat(t_req.grad) if t_req is not None else None,
        })
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cross_entropy_reference.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=None)
        f.write("\n")


if __name__ == "__main__":
    main()
