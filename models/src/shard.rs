//! Tensor parallelism: which part of each buffer one rank holds.
//!
//! - GQA K/V heads (vLLM `QKVParallelLinear`, SGLang the same): with `H` KV heads and `N`
//!   ranks, `H >= N` needs `H % N == 0` and rank `r` holds heads `[r*H/N, (r+1)*H/N)`;
//!   `H < N` needs `N % H == 0` and every rank holds one head, head `r / (N/H)` (each head
//!   replicated on `N/H` ranks). Query heads must divide by `N` too.
//! - MLA latent and DSA index-K: replicated (one latent row per token, shared by all heads; the
//!   indexer key is one 128-dim key shared by all indexer heads).
//! - Gated DeltaNet state (SGLang `configs/mamba_utils.py`, vLLM `mamba_utils.py`): key and
//!   value heads split like attention heads; both counts must divide by `N`.

use crate::ModelError;

/// A tensor-parallel rank: `rank` of `size`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tp {
    /// Ranks (`--tp`).
    pub size: u64,
    /// This rank, `0..size` (`--rank`).
    pub rank: u64,
}

impl Tp {
    /// One rank of one (no tensor parallelism).
    pub const SINGLE: Tp = Tp { size: 1, rank: 0 };

    /// Checks `size >= 1` and `rank < size`.
    ///
    /// # Errors
    ///
    /// A message naming `--tp` when `size` is 0, and `--rank` and `--tp` with both values when
    /// `rank >= size`.
    pub fn new(size: u64, rank: u64) -> Result<Tp, String> {
        if size == 0 {
            return Err("--tp must be at least 1, got 0".into());
        }
        if rank >= size {
            return Err(format!("--rank {rank} is not below --tp {size}"));
        }
        Ok(Tp { size, rank })
    }
}

/// How a buffer is shared among ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Shard {
    /// The head axis (first shape entry) is split: this rank holds `local` of `heads_total`
    /// heads starting at `first`; `replicas` ranks hold the same heads (1 unless
    /// `heads_total < tp size`).
    Heads {
        /// Ranks and this rank.
        tp: Tp,
        /// Heads of the whole model.
        heads_total: u64,
        /// Heads on this rank.
        local: u64,
        /// First head on this rank.
        first: u64,
        /// Ranks holding the same heads.
        replicas: u64,
    },
    /// Every rank holds the whole buffer.
    Replicated {
        /// Ranks and this rank.
        tp: Tp,
    },
}

/// The heads rank `tp.rank` holds of `total` heads split over `tp.size` ranks (the engines'
/// rule above); `field` names the config field of `total` in errors.
///
/// # Errors
///
/// ModelError::Field naming `field` and both values when `total` heads are not a multiple of the
/// rank count (`total >= tp.size`) or the rank count is not a multiple of `total` (fewer heads than
/// ranks).
pub fn split_heads(name: &str, field: &str, total: u64, tp: Tp) -> Result<Shard, ModelError> {
    let n = tp.size;
    if total >= n {
        if !total.is_multiple_of(n) {
            return Err(ModelError::field(
                name,
                field,
                format!("{total} heads do not split evenly over --tp {n}"),
            ));
        }
        let local = total / n;
        Ok(Shard::Heads {
            tp,
            heads_total: total,
            local,
            first: tp.rank * local,
            replicas: 1,
        })
    } else {
        if !n.is_multiple_of(total) {
            return Err(ModelError::field(
                name,
                field,
                format!(
                    "{total} heads cannot be replicated evenly over --tp {n} (engines need {n} to be a multiple of {total})"
                ),
            ));
        }
        let replicas = n / total;
        Ok(Shard::Heads {
            tp,
            heads_total: total,
            local: 1,
            first: tp.rank / replicas,
            replicas,
        })
    }
}

impl Shard {
    /// The geometry `shard`. Heads replicated over ranks (`heads_total < tp size`) are written
    /// as geometry v3 has them: `heads_total` is the model's KV head count, and the core
    /// derives the replicas (`tp size / heads_total`) and rank `r`'s head (`r / replicas`).
    pub const fn geometry(self) -> kvlayout_core::Shard {
        match self {
            Shard::Heads {
                tp, heads_total, ..
            } => kvlayout_core::Shard::heads(tp.size, tp.rank, heads_total),
            Shard::Replicated { tp } => kvlayout_core::Shard::replicated(tp.size, tp.rank),
        }
    }
}

/// Heads that must split evenly (no replication): query heads, linear-attention heads.
///
/// # Errors
///
/// ModelError::Field naming `field`, `total` and the rank count when `total` heads do not split
/// evenly over `tp.size` ranks.
pub fn divide_evenly(name: &str, field: &str, total: u64, tp: Tp) -> Result<u64, ModelError> {
    if !total.is_multiple_of(tp.size) {
        return Err(ModelError::field(
            name,
            field,
            format!("{total} heads do not split evenly over --tp {}", tp.size),
        ));
    }
    Ok(total / tp.size)
}
