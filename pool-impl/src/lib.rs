//! Pools (being written).
