"""PyTorch's numbers for the BatchNorm options `tests/derive.rs` checks: `momentum=None`
(a cumulative average of the batches' statistics) and `track_running_stats=False` (no
buffers; batch statistics in eval too), in float64.

Inputs are exact binary fractions, `x[i] = ((37 i + 11 k) % 17) / 4 - 2` for batch `k`,
which the Rust test computes the same way. Run with any recent PyTorch and paste the output.
"""

import torch
from torch import nn


def batch(k, shape):
    n = 1
    for d in shape:
        n *= d
    v = [((37 * i + 11 * k) % 17) / 4 - 2 for i in range(n)]
    return torch.tensor(v, dtype=torch.float64).reshape(shape)


def show(label, t):
    print(f"{label} = {t.flatten().tolist()!r}")


# momentum=None: three training batches of [4, 3], then eval.
bn = nn.BatchNorm1d(3, momentum=None).double()
for k in range(3):
    y = bn(batch(k, [4, 3]))
show("cumulative_train_out_k2", y.detach())
show("cumulative_running_mean", bn.running_mean)
show("cumulative_running_var", bn.running_var)
print("cumulative_num_batches_tracked =", int(bn.num_batches_tracked))
bn.eval()
show("cumulative_eval_out", bn(batch(3, [4, 3])).detach())

# track_running_stats=False: BatchNorm2d on [2, 2, 2, 2]; eval uses the batch's statistics.
bn = nn.BatchNorm2d(2, track_running_stats=False).double()
with torch.no_grad():
    bn.weight.copy_(torch.tensor([0.5, 2.0]))
    bn.bias.copy_(torch.tensor([0.25, -1.0]))
x = batch(5, [2, 2, 2, 2])
show("untracked_train_out", bn(x).detach())
bn.eval()
show("untracked_eval_out", bn(x).detach())
print("untracked_state_dict =", list(bn.state_dict().keys()))
print("untracked_repr =", repr(repr(bn)))

# affine=False: no parameters, buffers only.
bn = nn.BatchNorm1d(3, affine=False)
print("no_affine_parameters =", len(list(bn.parameters())))
print("no_affine_state_dict =", list(bn.state_dict().keys()))
print("no_affine_repr =", repr(repr(bn)))
