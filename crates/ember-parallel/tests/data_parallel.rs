//! `DataParallel` and the comm functions on 2 emulated CUDA devices (Note [Replicas]).
#![allow(clippy::unwrap_used)]

mod common;

const DEVICES: usize = 2;

#[test]
fn forward_equals_the_module() {
    common::install(DEVICES);
    common::forward_equals_the_module(DEVICES);
}

#[test]
fn gradients_equal_single_device() {
    common::install(DEVICES);
    common::gradients_equal_single_device(DEVICES);
}

#[test]
fn training_matches_single_device() {
    common::install(DEVICES);
    common::training_matches_single_device(DEVICES);
}

#[test]
fn errors_are_clear() {
    common::install(DEVICES);
    common::errors_are_clear(DEVICES);
}

#[test]
fn comm_functions() {
    common::install(DEVICES);
    common::comm_functions(DEVICES);
}

#[test]
fn autograd_functions() {
    common::install(DEVICES);
    common::autograd_functions(DEVICES);
}
