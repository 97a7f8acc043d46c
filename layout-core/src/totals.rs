//! Per-request totals of one rank's pool (the `kvlayout describe --totals` figures): what a
//! request costs per token in full-attention buffers, at most in windowed buffers, and once in
//! state buffers, and per token in compressed buffers (one row per R tokens). No page rounding.

use crate::buffer::Attention;
use crate::geometry::{GeometryError, PoolGeometry, buffer_path, layout_error};

/// Bytes one request occupies, by kind of buffer.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Totals {
    /// Sum over `full` buffers with `compress_ratio` 1 of bytes per token x layers: grows with
    /// every token.
    pub full_bytes_per_token: u64,
    /// Sum over buffers with `compress_ratio` R > 1 of row bytes x layers / R: what every token
    /// adds on average (DeepSeek-V4's C4 indexer: 132 x 21 / 4 = 693). Exact when every R is a
    /// power of two (computed over a common denominator, divided once).
    pub compressed_bytes_per_token: f64,
    /// Sum over sliding-window and chunked buffers of bytes per token x layers x W (or C): the
    /// most those buffers hold for one request.
    pub window_bytes_per_request_max: u64,
    /// Sum over `state` buffers of slot bytes x layers: fixed per request.
    pub state_bytes_per_request: u64,
}

impl PoolGeometry {
    /// The per-request totals of this pool; an overflow is an error naming the buffer.
    ///
    /// # Errors
    ///
    /// A [`GeometryError`] naming the buffer when a page size or a total overflows 64 bits, or a
    /// buffer's layout is invalid.
    pub fn totals(&self) -> Result<Totals, GeometryError> {
        let mut t = Totals::default();
        let mut compressed: Vec<(u64, u64)> = Vec::new();
        for (i, b) in self.buffers.iter().enumerate() {
            let per = b
                .layout
                .bytes_per_token()
                .map_err(|e| layout_error(i, b, e))?;
            let overflow = || {
                GeometryError::new(
                    buffer_path(i, b),
                    format!(
                        "overflow: {per} B x {} layers ({}) does not fit in 64 bits",
                        b.layers, b.attention
                    ),
                )
            };
            let layers_bytes = per.checked_mul(b.layers).ok_or_else(overflow)?;
            if b.compress_ratio != 1 {
                compressed.push((layers_bytes, b.compress_ratio));
                continue;
            }
            let (slot, add) = match b.attention {
                Attention::Full => (&mut t.full_bytes_per_token, layers_bytes),
                Attention::SlidingWindow { .. } | Attention::Chunked { .. } => (
                    &mut t.window_bytes_per_request_max,
                    layers_bytes
                        .checked_mul(b.attention.tokens())
                        .ok_or_else(overflow)?,
                ),
                Attention::State => (&mut t.state_bytes_per_request, layers_bytes),
            };
            *slot = slot.checked_add(add).ok_or_else(overflow)?;
        }
        t.compressed_bytes_per_token = compressed_per_token(&compressed);
        Ok(t)
    }
}

/// Sum of `bytes / ratio` over `(bytes, ratio)`: over the least common multiple of the ratios
/// in 128-bit integers, divided once (exact for powers of two up to f64's 53-bit mantissa);
/// summed as floats when the common denominator overflows.
fn compressed_per_token(parts: &[(u64, u64)]) -> f64 {
    fn gcd(a: u128, b: u128) -> u128 {
        if b == 0 { a } else { gcd(b, a % b) }
    }
    let mut denominator: u128 = 1;
    for &(_, r) in parts {
        let r = r as u128;
        match (denominator / gcd(denominator, r)).checked_mul(r) {
            Some(l) => denominator = l,
            None => return parts.iter().map(|&(b, r)| b as f64 / r as f64).sum(),
        }
    }
    let mut numerator: u128 = 0;
    for &(bytes, r) in parts {
        let term = (bytes as u128).checked_mul(denominator / r as u128);
        match term.and_then(|t| numerator.checked_add(t)) {
            Some(n) => numerator = n,
            None => return parts.iter().map(|&(b, r)| b as f64 / r as f64).sum(),
        }
    }
    numerator as f64 / denominator as f64
}
