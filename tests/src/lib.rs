//! Test crate: see tests/.
