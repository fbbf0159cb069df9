"""PyTorch's names for the model that `tests/derive.rs` builds with `#[derive(Module)]`.

Run with any recent PyTorch (`python derive_names.py`); the test pastes this output as its
expected values. Registration order is attribute-assignment order, as the Rust struct's
field order is.
"""

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, norm: bool):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4) if norm else None  # Option<LayerNorm>
        self.act = nn.ReLU()

    def forward(self, x):
        x = self.fc(x)
        if self.norm is not None:
            x = self.norm(x)
        return self.act(x)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(4))  # #[param] scale: Tensor
        self.embed = nn.Embedding(10, 4)
        self.blocks = nn.ModuleList([Block(True), Block(False)])  # Vec<Block>
        self.extra = None  # Option<Linear> = None
        self.head = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.ReLU())
        shared = nn.Linear(4, 4)
        self.shared_a = shared  # Arc<Linear>, the same one twice
        self.shared_b = shared
        self.decoder = nn.Linear(4, 10)
        self.decoder.weight = self.embed.weight  # a shared (tied) parameter
        self.register_buffer("step", torch.zeros(()))  # #[buffer] step: Tensor
        self.scratch = [nn.Linear(4, 4)]  # #[module(skip)]: not registered
        self.width = 4  # plain data

    def forward(self, idx):
        x = self.embed(idx) * self.scale
        for b in self.blocks:
            x = b(x)
        x = self.head(x)
        x = self.shared_b(self.shared_a(x))
        return self.decoder(x)


def show(label, items):
    print(f"{label} = {list(items)!r}")


torch.manual_seed(0)
net = Net()
show("named_parameters", (n for n, _ in net.named_parameters()))
show("state_dict", net.state_dict().keys())
show("named_buffers", (n for n, _ in net.named_buffers()))
show("named_modules", ((n, type(m).__name__) for n, m in net.named_modules()))
show("children", (type(m).__name__ for m in net.children()))
order = []
net.apply(lambda m: order.append(type(m).__name__))
show("apply", order)
print("parameters =", len(list(net.parameters())))
print("numel =", sum(p.numel() for p in net.parameters()))
print("repr =", repr(repr(net)))
net.eval()
print("training after eval =", [m.training for m in net.modules()].count(True))
