//! Losses (`torch.nn.functional` and the loss modules).
