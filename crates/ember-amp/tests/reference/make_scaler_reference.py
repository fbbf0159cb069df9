"""Writes scaler_reference.json: PyTorch's torch.amp.GradScaler("cpu") through a fixed
sequence of steps, the oracle of crates/ember-amp/tests/scaler.rs.

Run from the repository root (PyTorch 2.x, CPU is enough):

    python crates/ember-amp/tests/reference/make_scaler_reference.py

Two f32 parameters (shapes [3, 4] and [4]) and SGD with momentum (foreach=False). The
scaler starts at scale 256 with growth_interval 3, so the sequence grows the scale, backs it
off on injected infinities and NaNs (skipped steps), clips after unscale_, and sets the scale
with update(new_scale). At step k the test sets every parameter's gradient to
`steps[k].grads[i]` (already multiplied by the scale of that step, in f32, with the injected
inf/NaN; written as explicit numbers, non-finite ones as the strings "inf", "-inf", "nan"),
then runs `steps[k].mode`:
  - "step":  scaler.step(opt)
  - "clip":  scaler.unscale_(opt); clip_grad_norm_(params, max_norm); scaler.step(opt)
then `update()` or, where `new_scale` is set, `update(new_scale)`. It records whether the
optimizer stepped, the scale and growth tracker after the update, and the parameters.
"""

import json
import math
import os

import torch

SHAPES = [[3, 4], [4]]
INIT_SCALE = 256.0
GROWTH_INTERVAL = 3
MAX_NORM = 0.5
LR = 0.1
MOMENTUM = 0.9

# (injection, mode, new_scale): injection is None or (param, flat index, value).
PLAN = [
    (None, "step", None),
    (None, "step", None),
    (None, "step", None),  # third clean step: the scale grows to 512
    (None, "clip", None),
    ((0, 5, math.inf), "step", None),  # skipped, backoff to 256
    (None, "step", None),
    ((1, 2, math.nan), "clip", None),  # skipped after unscale_ + clip, backoff
    (None, "step", None),
    (None, "clip", None),
    (None, "step", None),  # grows again
    (None, "step", 1000.0),  # update(new_scale): tracker kept
    ((0, 0, -math.inf), "step", None),  # skipped, backoff from 1000
    (None, "step", None),
    (None, "step", None),
    (None, "clip", None),  # grows
    (None, "step", None),
]


def num(x):
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def main():
    torch.manual_seed(0)
    params = [torch.randn(s, dtype=torch.float32).requires_grad_(True) for s in SHAPES]
    init = [p.detach().clone() for p in params]
    opt = torch.optim.SGD(params, lr=LR, momentum=MOMENTUM, foreach=False)
    scaler = torch.amp.GradScaler(
        "cpu", init_scale=INIT_SCALE, growth_factor=2.0, backoff_factor=0.5,
        growth_interval=GROWTH_INTERVAL,
    )
    g = torch.Generator().manual_seed(1)
    steps = []
    for injection, mode, new_scale in PLAN:
        # The loss's scale: also makes the scale tensor on the first step.
        scaled_one = scaler.scale(torch.ones((), dtype=torch.float32))
        scale = scaled_one.item()
        grads = []
        for i, s in enumerate(SHAPES):
            true_grad = torch.randn(s, generator=g, dtype=torch.float32) * 0.3
            scaled = (true_grad * scaled_one).float()
            if injection is not None and injection[0] == i:
                scaled.view(-1)[injection[1]] = injection[2]
            params[i].grad = scaled.clone()
            grads.append([num(v) for v in scaled.view(-1).tolist()])
        if mode == "clip":
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(params, MAX_NORM)
        scaler.step(opt)
        found = sum(v.item() for v in scaler._found_inf_per_device(opt).values())
        if new_scale is None:
            scaler.update()
        else:
            scaler.update(new_scale)
        steps.append(
            {
                "scale_before": scale,
                "grads": grads,
                "mode": mode,
                "new_scale": new_scale,
                "stepped": found == 0,
                "scale_after": scaler.get_scale(),
                "growth_tracker_after": scaler._get_growth_tracker(),
                "params_after": [p.detach().view(-1).tolist() for p in params],
            }
        )
    out = {
        "torch_version": torch.__version__,
        "shapes": SHAPES,
        "init_scale": INIT_SCALE,
        "growth_interval": GROWTH_INTERVAL,
        "growth_factor": 2.0,
        "backoff_factor": 0.5,
        "max_norm": MAX_NORM,
        "lr": LR,
        "momentum": MOMENTUM,
        "init_params": [p.view(-1).tolist() for p in init],
        "steps": steps,
        "state_dict": {k: v for k, v in scaler.state_dict().items()},
    }
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scaler_reference.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
