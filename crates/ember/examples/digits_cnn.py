# The PyTorch twin of digits_cnn.rs (issue 45's new user's program): a custom CNN with a
# generic residual block, the digits under a DataLoader, AdamW with OneCycleLR, gradient
# clipping and accumulation, autocast with a GradScaler, five profiled steps, memory
# statistics, a checkpoint of model, optimizer and scaler reloaded into fresh objects, and
# evaluation under inference_mode. `python digits_cnn.py` (needs torch and scikit-learn).
import os
import tempfile

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule
from torch.utils.data import DataLoader, TensorDataset, random_split


class Residual(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return F.relu(x + self.inner(x))


def conv_bn(c_in, c_out):
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(conv_bn(1, 16), nn.ReLU())
        self.block = Residual(nn.Sequential(conv_bn(16, 16), nn.ReLU(), conv_bn(16, 16)))
        self.pool = nn.MaxPool2d(2)
        self.head = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x):
        x = self.pool(self.block(self.stem(x)))
        return self.head(x.flatten(1))


def evaluate(model, loader, device):
    model.eval()
    correct = 0
    with torch.inference_mode():
        for x, y in loader:
            correct += (model(x.to(device)).argmax(1) == y.to(device)).sum().item()
    return correct / len(loader.dataset)


def run(device, epochs, accum=2, lr=3e-3):
    torch.manual_seed(0)
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16
    train, val = random_split(TensorDataset(x, torch.tensor(digits.target)), [0.8, 0.2])
    train_loader = DataLoader(train, batch_size=32, shuffle=True)
    val_loader = DataLoader(val, batch_size=256)

    model = Net().to(device)
    print(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    steps = epochs * (len(train_loader) // accum)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, lr, total_steps=steps)
    scaler = torch.amp.GradScaler(device.type, enabled=device.type == "cuda")
    amp_dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    prof = profile(activities=activities, schedule=schedule(wait=1, warmup=1, active=5, repeat=1))
    prof.start()
    for epoch in range(epochs):
        model.train()
        for i, (x, y) in enumerate(train_loader):
            x, y = x.to(device), y.to(device)
            with torch.autocast(device.type, dtype=amp_dtype):
                loss = F.cross_entropy(model(x), y) / accum
            scaler.scale(loss).backward()
            if (i + 1) % accum == 0:
                scaler.unscale_(optimizer)
                nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
                scheduler.step()
            if prof is not None:
                prof.step()
        if prof is not None:
            prof.stop()
            print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=10))
            prof = None
        print(f"epoch {epoch}: accuracy {evaluate(model, val_loader, device):.3f}")
    if device.type == "cuda":
        allocated, peak = torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated()
        print(f"memory: {allocated} bytes allocated, peak {peak}")

    path = os.path.join(tempfile.gettempdir(), "digits_cnn.pt")
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
             "scaler": scaler.state_dict(), "epoch": epochs}
    torch.save(state, path)
    ckpt = torch.load(path, map_location=device)
    model2 = Net().to(device)
    optimizer2 = torch.optim.AdamW(model2.parameters(), lr=lr)
    scaler2 = torch.amp.GradScaler(device.type, enabled=device.type == "cuda")
    model2.load_state_dict(ckpt["model"])
    optimizer2.load_state_dict(ckpt["optimizer"])
    scaler2.load_state_dict(ckpt["scaler"])
    accuracy, reloaded = evaluate(model, val_loader, device), evaluate(model2, val_loader, device)
    print(f"epoch {ckpt['epoch']}: accuracy {accuracy:.3f}, reloaded {reloaded:.3f}")
    return accuracy, reloaded


if __name__ == "__main__":
    run(torch.device("cuda" if torch.cuda.is_available() else "cpu"), epochs=5)
