//! Tensor files: named tensors in the safetensors format ([`save`], [`load`]).

mod safetensors;
mod save;

pub use self::safetensors::{
    CHECKSUM_KEY, DATA_CHECKSUM_KEY, Loaded, MAX_HEADER_BYTES, load, load_from_bytes,
    load_with_metadata,
};
pub use self::save::{save, save_to_bytes, save_with_metadata};
