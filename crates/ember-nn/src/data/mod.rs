//! Datasets and the `DataLoader` (`torch.utils.data`).
