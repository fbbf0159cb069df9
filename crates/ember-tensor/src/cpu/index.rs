//! CPU kernels of the indexing family (index_select, gather, scatter_add, ...).
