//! One checkpoint of everything (`torch.save(dict, path)` and
//! `torch.load(path, map_location=device)`): [`save`] writes a [`StateDict`] — a module's, an
//! optimizer's, or a whole training state nested with [`StateDict::with`] — to a
//! safetensors file, and [`load`] reads it back as a [`StateDict`] of autograd tensors that
//! [`Module::load_state_dict`](crate::Module::load_state_dict), optimizers, schedulers and
//! the `GradScaler` take as is ([`StateDict::sub`] for a nested part).
//!
//! On disk (Note [Checkpoint file]):
//! - tensors are the file's tensors, under their dotted keys, as PyTorch names them
//!   (`model.0.weight`, `optimizer.state.0.exp_avg`): `safetensors.torch.load_file` reads
//!   them in Python;
//! - plain values (an epoch, a scaler's scale, a config string) are the file's metadata,
//!   each under its key as JSON ([`Value::to_metadata`]: `3`, `0.001`, `true`, `"mlp"`),
//!   so `json.loads` reads them in Python;
//! - a CRC-32 of the whole file, header and metadata included, that [`load`] verifies
//!   (Note [Checkpoint checksum] in `ember-tensor`): a corrupted or edited file is an error,
//!   not a silent load.
//!
//! Files are written atomically and streamed (Note [Atomic save]; through a symbolic link,
//! its target is written).
//!
//! ```
//! use ember_nn::{Module, io, layers::Linear};
//! let model = Linear::new(3, 2, ())?;
//! let path = std::env::temp_dir().join(format!("ember-io-doc-{}.safetensors", std::process::id()));
//! io::save(&model.state_dict()?, &path)?;
//! let copy = Linear::new(3, 2, ())?;
//! copy.load_state_dict(&io::load(&path, ember_tensor::Device::Cpu)?)?;
//! assert_eq!(copy.weight.to_vec::<f32>()?, model.weight.to_vec::<f32>()?);
//! # std::fs::remove_file(&path).ok();
//! # Ok::<(), ember_nn::Error>(())
//! ```

// Note [Checkpoint file]:
// ~~~~~~~~~~~~~~~~~~~~~~~
// PyTorch's `torch.save` pickles a nested dict of tensors and Python values; Ember keeps
// safetensors (no code runs on load, readable by PyTorch's `safetensors`), so the nesting is
// flattened: a dict under key `model` contributes `model.<its key>` for each of its entries,
// which is how PyTorch itself names the parameters of submodules. The split back is by
// prefix (`StateDict::sub`). Plain values go to the metadata as JSON text: the type
// survives (`1.0` is a float, `1` an integer, `"1"` a string), and metadata another tool
// wrote that is not JSON (PyTorch's `"format": "pt"`) loads as a string. The checksum keys
// (`ember.checksum`, `ember.crc32`) are Ember's and never appear among the values.

use std::collections::BTreeMap;
use std::path::Path;

use ember_device::Device;
use ember_tensor::io::{CHECKSUM_KEY, DATA_CHECKSUM_KEY};

use crate::{NnError, Result, StateDict, Tensor, Value};

/// Saves `state` to `path` (safetensors; see the module docs for the layout), atomically:
/// on error, a file already at `path` is left as it was. A plain value under a reserved key
/// (`ember.checksum`, `ember.crc32`) is an error.
pub fn save(state: &StateDict, path: impl AsRef<Path>) -> Result<()> {
    let path = path.as_ref();
    let mut meta = BTreeMap::new();
    for (k, v) in state.plain() {
        if k == CHECKSUM_KEY || k == DATA_CHECKSUM_KEY {
            return Err(NnError::invalid(
                "save",
                format!(
                    "{}: the key {k:?} is reserved for the file's checksum; name the value otherwise",
                    path.display()
                ),
            )
            .into());
        }
        meta.insert(k.clone(), v.to_metadata());
    }
    save_with_metadata(state, &meta, path)
}

/// Saves the tensors of `tensors` (a [`StateDict`], or any `(name, &Tensor)` pairs) with
/// raw string metadata (the file header's `__metadata__`), atomically. [`save`] is the
/// usual call: it writes a dict's plain values as the metadata.
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

/// Loads a file [`save`] wrote (or any safetensors file) onto `device` (PyTorch's
/// `map_location`): its tensors, as leaves that do not require grad, and its metadata as
/// plain values ([`Value::from_metadata`]; the checksum is verified, not returned).
pub fn load(path: impl AsRef<Path>, device: impl Into<Device>) -> Result<StateDict> {
    let (mut state, meta) = load_with_metadata(path, device)?;
    for (k, v) in meta {
        if k != CHECKSUM_KEY && k != DATA_CHECKSUM_KEY {
            state.set(k, Value::from_metadata(&v));
        }
    }
    Ok(state)
}

/// The tensors of a safetensors file onto `device`, and the file's raw string metadata
/// (empty if none; the checksum included).
pub fn load_with_metadata(
    path: impl AsRef<Path>,
    device: impl Into<Device>,
) -> Result<(StateDict, BTreeMap<String, String>)> {
    let (tensors, meta) = ember_tensor::io::load_with_metadata(path, device.into())?;
    let tensors = tensors.into_iter().collect();
    Ok((tensors, meta))
}
