//! `#[derive(KvLayout)]` (being written).
