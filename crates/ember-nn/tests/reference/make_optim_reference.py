"""Writes optim_reference.json: PyTorch's optimizers, schedulers and gradient clipping on
fixed inputs, the oracle of crates/ember-nn/tests/optim.rs.

Run from the repository root (any PyTorch 2.x, CPU is enough):

    python crates/ember-nn/tests/reference/make_optim_reference.py

Every input is written into the JSON as explicit numbers (f32 values), so the Rust test
needs nothing but the file: two parameters (shapes [3, 4] and [4]) and a fixed sequence of
gradients. At step k the test sets `p.grad = grads[k]` (or no gradient where the entry is
null) and calls `step()`; the parameters after the steps in `checkpoints` are recorded.
Optimizers run the single-tensor code path (`foreach=False`).
"""

import json
import math
import os

import torch

STEPS = 100
CHECKPOINTS = [1, 2, 10, 50, 100]
SHAPES = [[3, 4], [4]]

torch.manual_seed(0)
INIT = [torch.randn(s, dtype=torch.float32) for s in SHAPES]


def make_grads():
    """STEPS gradients per parameter whose scale swings (so amsgrad's max matters)."""
    g = torch.Generator().manual_seed(1)
    out = []
    for k in range(STEPS):
        scale = 1.0 + 0.9 * math.sin(k / 7.0)
        out.append([(torch.randn(s, generator=g) * scale).float() for s in SHAPES])
    return out


GRADS = make_grads()


def flat(t):
    return [float(x) for x in t.reshape(-1).tolist()]


# name -> (optimizer class, param-group overrides or None, kwargs, skip rule)
# skip "p1_every_3rd": parameter 1 has no gradient at steps k % 3 == 0 (it must be skipped,
# its state untouched).
CONFIGS = {
    "sgd_plain": ("SGD", None, dict(lr=0.01), None),
    "sgd_momentum_dampening": ("SGD", None, dict(lr=0.01, momentum=0.9, dampening=0.1), None),
    "sgd_nesterov": ("SGD", None, dict(lr=0.01, momentum=0.9, nesterov=True), None),
    "sgd_weight_decay": ("SGD", None, dict(lr=0.01, momentum=0.5, weight_decay=0.1), None),
    "sgd_maximize_skip": (
        "SGD", None, dict(lr=0.01, momentum=0.9, weight_decay=0.05, maximize=True), "p1_every_3rd"),
    "sgd_groups": ("SGD", [dict(), dict(lr=0.1, momentum=0.5)], dict(lr=0.01, momentum=0.9), None),
    "adam_plain": ("Adam", None, dict(lr=0.01), None),
    "adam_weight_decay": ("Adam", None, dict(lr=0.01, weight_decay=0.1), None),
    "adam_amsgrad": ("Adam", None, dict(lr=0.01, amsgrad=True), None),
    "adam_betas_maximize_skip": (
        "Adam", None, dict(lr=0.02, betas=(0.3, 0.99), eps=1e-6, maximize=True), "p1_every_3rd"),
    "adam_groups": ("Adam", [dict(), dict(lr=0.05, weight_decay=0.01)], dict(lr=0.01), None),
    "adamw_plain": ("AdamW", None, dict(lr=0.01), None),
    "adamw_amsgrad": ("AdamW", None, dict(lr=0.01, weight_decay=0.1, amsgrad=True), None),
}


def run_optimizer(cls_name, groups, kwargs, skip):
    params = [p.clone().requires_grad_(True) for p in INIT]
    cls = getattr(torch.optim, cls_name)
    if groups is None:
        opt = cls(params, foreach=False, **kwargs)
    else:
        opt = cls([dict(params=[p], **g) for p, g in zip(params, groups)], foreach=False, **kwargs)
    checkpoints = {}
    for k in range(STEPS):
        for i, p in enumerate(params):
            if skip == "p1_every_3rd" and i == 1 and k % 3 == 0:
                p.grad = None
            else:
                p.grad = GRADS[k][i].clone()
        opt.step()
        if k + 1 in CHECKPOINTS:
            checkpoints[str(k + 1)] = [flat(p.detach()) for p in params]
    return checkpoints


def scheduler_runs():
    runs = {}

    def two_groups(cls, **kwargs):
        a, b = (torch.zeros(1, requires_grad=True) for _ in range(2))
        return cls([dict(params=[a]), dict(params=[b], lr=0.05)], lr=0.1, **kwargs)

    def record(opt, sched, steps, key):
        lrs, moms = [sched.get_last_lr()], [[momentum(g) for g in opt.param_groups]]
        for _ in range(steps):
            opt.step()
            sched.step()
            lrs.append(sched.get_last_lr())
            moms.append([momentum(g) for g in opt.param_groups])
        return {"lr": lrs, key: moms}

    def momentum(g):
        return g["betas"][0] if "betas" in g else g["momentum"]

    opt = two_groups(torch.optim.SGD, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=7, gamma=0.5)
    runs["step_lr"] = dict(step_size=7, gamma=0.5, **record(opt, sched, 40, "momentum"))

    opt = two_groups(torch.optim.SGD, momentum=0.9)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10, eta_min=0.001)
    runs["cosine_annealing_lr"] = dict(t_max=10, eta_min=0.001, **record(opt, sched, 45, "momentum"))

    opt = two_groups(torch.optim.SGD, momentum=0.9)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=50)
    r = dict(max_lr=0.1, total_steps=50, **record(opt, sched, 50, "momentum"))
    try:
        opt.step()
        sched.step()
        raise AssertionError("OneCycleLR stepped past total_steps")
    except ValueError as e:
        r["error"] = str(e)
    runs["one_cycle_lr_cos"] = r

    opt = two_groups(torch.optim.Adam, betas=(0.9, 0.999))
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=[0.2, 0.1], total_steps=30, pct_start=0.25, anneal_strategy="linear",
        three_phase=True, div_factor=10.0, final_div_factor=100.0,
        base_momentum=0.8, max_momentum=0.9)
    runs["one_cycle_lr_linear_three_phase"] = dict(
        max_lr=[0.2, 0.1], total_steps=30, pct_start=0.25, div_factor=10.0,
        final_div_factor=100.0, base_momentum=0.8, max_momentum=0.9,
        **record(opt, sched, 30, "momentum"))
    return runs


def clip_runs():
    g = torch.Generator().manual_seed(2)
    grads = [torch.randn(s, generator=g).float() * 3.0 for s in SHAPES]
    out = {"grads": [flat(x) for x in grads], "cases": []}
    for norm_type, max_norm in [(2.0, 1.0), (1.0, 2.5), (float("inf"), 0.5), (3.0, 1.5), (2.0, 1e3)]:
        params = [torch.zeros(s, requires_grad=True) for s in SHAPES]
        for p, x in zip(params, grads):
            p.grad = x.clone()
        total = torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type=norm_type, foreach=False)
        out["cases"].append(dict(
            norm_type="inf" if math.isinf(norm_type) else norm_type,
            max_norm=max_norm,
            total_norm=float(total),
            clipped=[flat(p.grad) for p in params]))
    params = [torch.zeros(s, requires_grad=True) for s in SHAPES]
    for p, x in zip(params, grads):
        p.grad = x.clone()
    torch.nn.utils.clip_grad_value_(params, 1.25, foreach=False)
    out["value"] = dict(clip_value=1.25, clipped=[flat(p.grad) for p in params])
    return out


def main():
    ref = {
        "torch_version": torch.__version__,
        "shapes": SHAPES,
        "init": [flat(p) for p in INIT],
        "grads": [[flat(g) for g in step] for step in GRADS],
        "checkpoints": CHECKPOINTS,
        "optimizers": {},
        "schedulers": scheduler_runs(),
        "clip": clip_runs(),
    }
    for name, (cls_name, groups, kwargs, skip) in CONFIGS.items():
        ref["optimizers"][name] = dict(
            optimizer=cls_name,
            options={k: list(v) if isinstance(v, tuple) else v for k, v in kwargs.items()},
            groups=groups,
            skip=skip,
            params=run_optimizer(cls_name, groups, kwargs, skip),
        )
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "optim_reference.json")
    with open(path, "w") as f:
        json.dump(ref, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
