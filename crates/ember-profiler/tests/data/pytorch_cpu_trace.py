"""Writes pytorch_cpu_trace.json: a trace PyTorch's profiler writes on the CPU for one
training step of a small MLP (record_shapes and profile_memory on), which
tests/profile.rs::chrome_trace_has_pytorchs_schema compares Ember's trace keys with.

Run from this directory: python3 pytorch_cpu_trace.py  (PyTorch 2.x; made with 2.15).
"""
import torch
from torch.profiler import profile, ProfilerActivity, record_function

torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
opt = torch.optim.Adam(m.parameters())
x = torch.randn(5, 8)
t = torch.randint(0, 4, (5,))
with profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True) as prof:
    with record_function("forward"):
        loss = torch.nn.functional.cross_entropy(m(x), t)
    loss.backward()
    opt.step()
prof.export_chrome_trace("pytorch_cpu_trace.json")
print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=8))
