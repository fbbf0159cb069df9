//! `autocast`: the per-thread mixed-precision regions and the one policy table.
