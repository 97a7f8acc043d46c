//! Per-request totals of one rank's pool (the `kvlayout describe --totals` figures): what a
//! request costs per token in full-attention buffers, at most in windowed buffers, and once in
//! state buffers. No page rounding.

use crate::buffer::Attention;
use crate::geometry::{GeometryError, PoolGeometry, buffer_path, layout_error};

/// Bytes one request occupies, by kind of buffer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    /// Sum over `full` buffers of bytes per token x layers: grows with every token.
    pub full_bytes_per_token: u64,
    /// Sum over sliding-window and chunked buffers of bytes per token x layers x W (or C): the
    /// most those buffers hold for one request.
    pub window_bytes_per_request_max: u64,
    /// Sum over `state` buffers of slot bytes x layers: fixed per request.
    pub state_bytes_per_request: u64,
}

impl PoolGeometry {
    /// The per-request totals of this pool; an overflow is an error naming the buffer.
    pub fn totals(&self) -> Result<Totals, GeometryError> {
        let mut t = Totals::default();
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
        Ok(t)
    }
}
