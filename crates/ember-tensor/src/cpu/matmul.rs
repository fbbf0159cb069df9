//! CPU matrix products.
