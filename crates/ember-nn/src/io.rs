//! Saving and loading named tensors (`torch.save(model.state_dict(), path)` and
//! `torch.load(path, map_location=device)`), in the safetensors format: what [`load`]
//! returns is a [`StateDict`] of autograd tensors that
//! [`Module::load_state_dict`](crate::Module::load_state_dict) and optimizers take as is.
//! Files are written atomically and streamed (Note [Atomic save] in `ember-tensor`; through
//! a symbolic link, its target is written), with a CRC-32 of the data that [`load`]
//! verifies (Note [Checkpoint checksum]): a corrupted file is an error, not a silent load.
//!
//! ```
//! use ember_nn::{Module, io, layers::Linear};
//! let model = Linear::new(3, 2, ())?;
//! let path = std::env::temp_dir().join(format!("ember-io-doc-{}.safetensors", std::process::id()));
//! io::save(&model.state_dict(), &path)?;
//! let copy = Linear::new(3, 2, ())?;
//! copy.load_state_dict(&io::load(&path, ember_tensor::Device::Cpu)?)?;
//! assert_eq!(copy.state_dict()["weight"].to_vec::<f32>()?, model.state_dict()["weight"].to_vec::<f32>()?);
//! # std::fs::remove_file(&path).ok();
//! # Ok::<(), ember_nn::Error>(())
//! ```

use std::collections::BTreeMap;
use std::path::Path;

use ember_device::Device;

use crate::{Result, StateDict, Tensor};

/// Saves named tensors (a [`StateDict`], or any `(name, &Tensor)` pairs) to `path`,
/// atomically: on error, a file already at `path` is left as it was.
pub fn save<'t, S: AsRef<str>>(
    tensors: impl IntoIterator<Item = (S, &'t Tensor)>,
    path: impl AsRef<Path>,
) -> Result<()> {
    save_with_metadata(tensors, &BTreeMap::new(), path)
}

/// [`save`] with string metadata (the file header's `__metadata__`).
pub fn save_with_metadata<'t, S: AsRef<str>>(
    tensors: impl IntoIterator<Item = (S, &'t Tensor)>,
    metadata: &BTreeMap<String, String>,
    path: impl AsRef<Path>,
) -> Result<()> {
    let raw: Vec<(S, ember_tensor::Tensor)> =
        tensors.into_iter().map(|(k, t)| (k, t.data())).collect();
    ember_tensor::io::save_with_metadata(raw.iter().map(|(k, t)| (k.as_ref(), t)), metadata, path)?;
    Ok(())
}

/// Loads every tensor of a safetensors file onto `device` (PyTorch's `map_location`), by
/// name, as leaves that do not require grad.
pub fn load(path: impl AsRef<Path>, device: impl Into<Device>) -> Result<StateDict> {
    Ok(load_with_metadata(path, device)?.0)
}

/// [`load`], also returning the file's string metadata (empty if none).
pub fn load_with_metadata(
    path: impl AsRef<Path>,
    device: impl Into<Device>,
) -> Result<(StateDict, BTreeMap<String, String>)> {
    let (tensors, meta) = ember_tensor::io::load_with_metadata(path, device.into())?;
    let tensors = tensors.into_iter().collect();
    Ok((tensors, meta))
}
