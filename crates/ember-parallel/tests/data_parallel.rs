//! `DataParallel` and the comm functions on 2 emulated CUDA devices (Note [Replicas]); the
//! bodies are in `common/`.

#[macro_use]
mod common;

device_tests!(2);
