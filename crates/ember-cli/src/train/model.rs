//! The models `ember train` builds.

use std::sync::Arc;

use ember_device::Device;
use ember_nn::layers::{Conv2d, Conv2dConfig, Flatten, Linear, MaxPool2d, ReLU, Sequential};
use ember_nn::{Error, Module};

use super::ModelKind;
use super::gpt::{Gpt, GptConfig};

/// A model and its sizes: what [`build_model`] builds and a checkpoint records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelSpec {
    /// 64 → 128 → ReLU → 10.
    Mlp,
    /// The CNN whose first convolution has `width` channels.
    Cnn {
        /// Channels of the first convolution.
        width: usize,
    },
    /// The character-level GPT (Note [The GPT] in `gpt`).
    Gpt(GptConfig),
}

impl ModelSpec {
    /// Which model it is.
    pub fn kind(&self) -> ModelKind {
        match self {
            ModelSpec::Mlp => ModelKind::Mlp,
            ModelSpec::Cnn { .. } => ModelKind::Cnn,
            ModelSpec::Gpt(_) => ModelKind::Gpt,
        }
    }

    /// The GPT's hyper-parameters, if it is the GPT.
    pub fn gpt(&self) -> Option<GptConfig> {
        match self {
            ModelSpec::Gpt(c) => Some(*c),
            _ => None,
        }
    }
}

/// Builds the model of `spec` on `device` (initialised from the seeded CPU generator, then
/// moved, as `model = Net().to(device)` does in PyTorch).
pub fn build_model(spec: &ModelSpec, device: Device) -> Result<Arc<dyn Module>, Error> {
    Ok(match *spec {
        ModelSpec::Mlp => Arc::new(build_classifier(None, device)?),
        ModelSpec::Cnn { width } => Arc::new(build_classifier(Some(width), device)?),
        ModelSpec::Gpt(c) => Arc::new(Gpt::new(c, device)?),
    })
}

/// The digits' classifiers: the MLP (`None`), or the CNN whose first convolution has
/// `Some(width)` channels.
fn build_classifier(cnn_width: Option<usize>, device: Device) -> Result<Sequential, Error> {
    let m = match cnn_width {
        None => Sequential::new()
            .add(Linear::new(64, 128, ())?)
            .add(ReLU::new())
            .add(Linear::new(128, 10, ())?),
        Some(width) => {
            let same = Conv2dConfig {
                padding: (1, 1).into(),
                ..Default::default()
            };
            Sequential::new()
                .add(Conv2d::with_config(1, width, 3, same, ())?)
                .add(ReLU::new())
                .add(MaxPool2d::new(2))
                .add(Conv2d::with_config(width, 2 * width, 3, same, ())?)
                .add(ReLU::new())
                .add(MaxPool2d::new(2))
                .add(Flatten::new())
                .add(Linear::new(2 * width * 2 * 2, 10, ())?)
        }
    };
    m.to(device)?;
    Ok(m)
}
