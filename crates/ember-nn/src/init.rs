//! Parameter initialisers (`torch.nn.init`).
