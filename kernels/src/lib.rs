//! Kernels (being written).
