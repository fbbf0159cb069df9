//! Tensor files: named tensors in the safetensors format ([`save`], [`load`]).

mod safetensors;

pub use self::safetensors::{
    Loaded, MAX_HEADER_BYTES, load, load_from_bytes, load_with_metadata, save, save_to_bytes,
    save_with_metadata,
};
