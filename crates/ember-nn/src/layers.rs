//! Layers (`torch.nn`).
