//! The models `ember train` builds.

use ember_device::Device;
use ember_nn::layers::{Conv2d, Conv2dConfig, Flatten, Linear, MaxPool2d, ReLU, Sequential};
use ember_nn::{Error, Module};

use super::ModelKind;

/// Builds the model on `device` (initialised from the seeded CPU generator, then moved, as
/// `model = Net().to(device)` does in PyTorch); `width` is the CNN's first convolution's
/// channels.
pub fn build_model(kind: ModelKind, width: usize, device: Device) -> Result<Sequential, Error> {
    let m = match kind {
        ModelKind::Mlp => Sequential::new()
            .add(Linear::new(64, 128, ())?)
            .add(ReLU::new())
            .add(Linear::new(128, 10, ())?),
        ModelKind::Cnn => {
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
