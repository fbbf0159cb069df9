"""Reads a checkpoint that `ember::save` wrote with PyTorch's `safetensors.torch.load_file`
(run by `crates/ember/tests/checkpoint_torch.rs`).

    python load_checkpoint_in_torch.py CHECKPOINT INPUTS

CHECKPOINT holds `model.*` (a Sequential: Conv2d(1, 2, 3, padding=1), BatchNorm2d(2), ReLU,
Flatten, Linear(32, 3)), `optimizer.*` (Adam's flat state) and plain values in the metadata
(`epoch`, `config.arch`, `scaler.scale`, ...). INPUTS holds `x` and Ember's eval-mode output
`y` of the model on it. The script loads the model part into the same torch model with
`load_state_dict(strict=True)`, runs it in eval mode, and prints one JSON line: the largest
difference from Ember's output, the metadata values decoded with `json.loads`, and the
shapes of the optimizer's first state. It fails (exit 1) on any mismatch it can see.
"""

import json
import sys

import torch
from safetensors import safe_open
from safetensors.torch import load_file
from torch import nn


def main(ckpt_path: str, inputs_path: str) -> None:
    state = load_file(ckpt_path)
    model_state = {k[len("model."):]: v for k, v in state.items() if k.startswith("model.")}
    model = nn.Sequential(
        nn.Conv2d(1, 2, 3, padding=1),
        nn.BatchNorm2d(2),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(32, 3),
    ).double()
    model.load_state_dict({k: v.double() if v.is_floating_point() else v
                           for k, v in model_state.items()}, strict=True)
    model.eval()
    io = load_file(inputs_path)
    with torch.no_grad():
        y = model(io["x"].double())
    diff = (y - io["y"].double()).abs().max().item()
    with safe_open(ckpt_path, framework="pt") as f:
        meta = f.metadata() or {}
    values = {k: json.loads(v) for k, v in meta.items() if not k.startswith("ember.")}
    exp_avg = state["optimizer.state.0.exp_avg"]
    out = {
        "max_abs_diff": diff,
        "model_keys": sorted(model_state),
        "num_batches_tracked": int(model_state["1.num_batches_tracked"]),
        "values": values,
        "exp_avg_shape": list(exp_avg.shape),
        "weight_shape": list(model_state["0.weight"].shape),
        "torch": torch.__version__,
    }
    print(json.dumps(out))
    if diff > 1e-5:
        sys.exit(f"outputs differ by {diff}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
