//! `GradScaler`: loss scaling for f16 training (`torch.amp.GradScaler`).
