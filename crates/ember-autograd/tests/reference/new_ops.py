"""PyTorch's values for the ops added through the op table (hardswish, logaddexp): outputs
and input gradients in f64, written to new_ops.json beside this script, which
tests/new_ops.rs compares against. Run: python3 new_ops.py (needs torch)."""
import json
import math
import os

import torch

torch.set_default_dtype(torch.float64)
inf = math.inf

x = torch.tensor([-5.0, -3.0, -2.5, -1.0, -0.25, 0.0, 0.5, 1.75, 2.9, 3.0, 4.5, 9.0],
                 requires_grad=True)
y = torch.nn.functional.hardswish(x)
(gx,) = torch.autograd.grad(y, x, torch.linspace(0.5, 2.0, x.numel()))

a = torch.tensor([[-40.0, -1.5, 0.0, 2.0, 30.0, 700.0],
                  [-2.0, 0.25, 1.0, -700.0, 5.0, -0.5]], requires_grad=True)
b = torch.tensor([-1.0, 0.5, 0.0, 2.0, -30.0, 699.0], requires_grad=True)  # broadcast rows
z = torch.logaddexp(a, b)
ga, gb = torch.autograd.grad(z, [a, b], torch.linspace(-1.0, 1.0, z.numel()).reshape(z.shape))

# Infinities: PyTorch's answers, for the test's hard-coded table (JSON has no infinity).
special = torch.tensor([-inf, inf, -inf, inf, -inf, 1.0, math.nan])
special_b = torch.tensor([-inf, inf, inf, -inf, 3.0, inf, 0.0])
print("logaddexp of", special.tolist(), "and", special_b.tolist(), "=",
      torch.logaddexp(special, special_b).tolist())


def out(t):
    return t.detach().flatten().tolist()


ref = {
    "torch": torch.__version__,
    "hardswish": {"x": out(x), "y": out(y), "grad_out": torch.linspace(0.5, 2.0, x.numel()).tolist(),
                  "grad_x": out(gx)},
    "logaddexp": {"a": out(a), "a_shape": list(a.shape), "b": out(b), "y": out(z),
                  "grad_out": torch.linspace(-1.0, 1.0, z.numel()).tolist(),
                  "grad_a": out(ga), "grad_b": out(gb)},
}
for name, fn, arg in [("hardswish_long", lambda: torch.nn.functional.hardswish(torch.tensor([1, 2])), None),
                      ("logaddexp_long", lambda: torch.logaddexp(torch.tensor([1]), torch.tensor([2])), None)]:
    try:
        fn()
        ref[name] = None
    except Exception as e:  # PyTorch's message, for the test to check Ember names the same
        ref[name] = str(e).splitlines()[0]

here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "new_ops.json"), "w") as f:
    json.dump(ref, f, indent=1)
    f.write("\n")
