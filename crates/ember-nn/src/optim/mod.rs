//! Optimizers (`torch.optim`).
