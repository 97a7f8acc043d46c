//! The page checksum (`kvlayout.checksum/v1`): 64 bits over one (buffer, layer, page) payload,
//! bound to the layout by its seed, so a page only verifies under a compatible geometry and in
//! its own layer.
//!
//! A geometry check proves both sides lay a page out alike; this proves the bytes that arrive
//! are the bytes that left (a stale or reused slot, a short or torn copy, a host page overwritten
//! while it loads, a corrupted stored object).
//!
//! # Algorithm, byte for byte
//! (`layout-core/tests/checksum_reference.py` recomputes it in 20 lines of Python.) All
//! arithmetic is modulo 2^64; `u64(b)` reads 8 bytes little-endian.
//!
//! - `fmix(x)` (MurmurHash3's 64-bit finalizer, a bijection): `x ^= x >> 33;
//!   x *= 0xff51afd7ed558ccd; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53; x ^= x >> 33`.
//! - Input: the page payload as the geometry lays it (the canonical page of one layer of one
//!   buffer: `page_size_tokens x bytes_per_token` bytes in the arrangement's byte order, padding
//!   up to the page stride excluded), the buffer's token fingerprint `T`
//!   ([`crate::fingerprint::token_hash`]) and the model layer id `L` (the buffer's
//!   `layer_ids[layer]` when given, else the layer index).
//! - Seed: `h = fmix(T ^ D)`, `D = u64(b"kvlayout") = 0x74756f79616c766b`; `h = fmix(h ^ L)`;
//!   `h = fmix(h ^ n)` with `n` the payload length in bytes.
//! - The payload is cut into chunks of [`CHUNK_BYTES`] (4096) bytes, the last one shorter. A
//!   chunk's bytes are read as words `w_0 .. w_{m-1}`, `m = ceil(len / 8)`, the last word
//!   zero-padded. With `K_j = (j + 1) * 0x9e3779b97f4a7c15` (the same for every chunk) and eight
//!   lanes `a_0 .. a_7` starting at 0, for each word `j`: `x = w_j ^ K_j`;
//!   `a_{j mod 8} += (x mod 2^32) * (x >> 32)`; `a_{(j mod 8) xor 1} += w_j`.
//! - A chunk's value `c = sum over l of fmix(a_l ^ (l + 1) * 0xc2b2ae3d27d4eb4f)` (eight
//!   independent mixes); chunks in order: `h = fmix(h ^ c)`. The checksum is the final `h`.
//!
//! # Why this function
//! A chunk's lanes are sums of independent per-word terms, so a GPU hashes a page's chunks in
//! parallel (a warp per chunk, any summation order) and combines them in a fixed order; a CPU
//! core vectorizes the 32 x 32 -> 64-bit products (xxh3's accumulation). A changed word changes
//! its lane `(j mod 8) xor 1` by exactly the difference of the words (non-zero modulo 2^64);
//! `fmix` is a bijection, so that lane's term of `c` changes and the others do not, so `c`
//! changes, and the chain is a bijection in `c` given the chunks before: **any change confined
//! to one 8-byte word (so any single changed byte) is always detected**. Two swapped
//! words change the lanes unless they are equal (different `j mod 8`), or meet different keys
//! `K_j` (same `j mod 8`, same or other chunk order): detected except with a pseudo-random
//! 2^-64-scale chance (a property test checks both).
//!
//! ```
//! use kvlayout_core::checksum::page_checksum;
//! // One 64-token page of a bf16 index-K (128 x 2 B per token): 16,384 bytes, 4 chunks.
//! let page = vec![7u8; 64 * 128 * 2];
//! let a = page_checksum(0x1234, 3, &page);
//! assert_eq!(a, page_checksum(0x1234, 3, &page));
//! assert_ne!(a, page_checksum(0x1234, 4, &page)); // another layer
//! assert_ne!(a, page_checksum(0x1235, 3, &page)); // another token layout
//! ```

use crate::fingerprint::token_hash;
use crate::geometry::{GeometryError, PoolGeometry, buffer_path};

/// Bytes per chunk: chunks are hashed independently, then combined in order.
pub const CHUNK_BYTES: usize = 4096;
/// Words (8 bytes) per full chunk.
pub const CHUNK_WORDS: usize = CHUNK_BYTES / 8;
/// Lanes per chunk.
pub const LANES: usize = 8;
/// The domain separator `u64(b"kvlayout")`.
pub const DOMAIN: u64 = u64::from_le_bytes(*b"kvlayout");
/// The key step: `K_j = (j + 1) * KEY_STEP`.
pub const KEY_STEP: u64 = 0x9e37_79b9_7f4a_7c15;
/// The lane key step: lane `l` is mixed as `fmix(a_l ^ (l + 1) * LANE_STEP)`.
pub const LANE_STEP: u64 = 0xc2b2_ae3d_27d4_eb4f;

/// The per-word keys of a chunk, `K_j = (j + 1) * KEY_STEP`.
pub const KEYS: [u64; CHUNK_WORDS] = {
    let mut k = [0u64; CHUNK_WORDS];
    let mut j = 0;
    while j < CHUNK_WORDS {
        k[j] = ((j as u64) + 1).wrapping_mul(KEY_STEP);
        j += 1;
    }
    k
};

/// MurmurHash3's 64-bit finalizer (a bijection).
#[inline(always)]
pub const fn fmix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// The chain's start: `fmix(fmix(fmix(T ^ D) ^ L) ^ n)`.
pub const fn seed(token_fingerprint: u64, layer_id: u64, payload_bytes: u64) -> u64 {
    fmix(fmix(fmix(token_fingerprint ^ DOMAIN) ^ layer_id) ^ payload_bytes)
}

/// Adds the terms of `words` (word `j0 + i` of its chunk) to the lanes.
#[inline(always)]
fn accumulate(lanes: &mut [u64; LANES], words: &[u64; LANES], keys: &[u64; LANES]) {
    for l in 0..LANES {
        let w = words[l];
        let x = w ^ keys[l];
        lanes[l] = lanes[l].wrapping_add((x & 0xffff_ffff).wrapping_mul(x >> 32));
        lanes[l ^ 1] = lanes[l ^ 1].wrapping_add(w);
    }
}

/// Any CPU: the same sums, word by word.
fn chunk_lanes_portable(chunk: &[u8]) -> [u64; LANES] {
    let mut lanes = [0u64; LANES];
    let stripes = chunk.chunks_exact(8 * LANES);
    let tail = stripes.remainder();
    let mut j = 0;
    for stripe in stripes {
        let mut words = [0u64; LANES];
        for (l, w) in words.iter_mut().enumerate() {
            let mut b = [0u8; 8];
            b.copy_from_slice(&stripe[8 * l..8 * l + 8]);
            *w = u64::from_le_bytes(b);
        }
        let mut keys = [0u64; LANES];
        keys.copy_from_slice(&KEYS[j..j + LANES]);
        accumulate(&mut lanes, &words, &keys);
        j += LANES;
    }
    tail_words(&mut lanes, tail, j);
    lanes
}

/// AVX2: xxh3's accumulation, two 4-lane vectors per 64-byte stripe. `a_l += w_{l xor 1}` is
/// a swap of the 64-bit halves of each 128-bit lane; the keys advance by `8 * KEY_STEP` per
/// stripe (no table read).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn chunk_lanes_avx2(chunk: &[u8]) -> [u64; LANES] {
    use std::arch::x86_64::*;
    let stripes = chunk.chunks_exact(8 * LANES);
    let tail = stripes.remainder();
    let full_words = chunk.len() / (8 * LANES) * LANES;
    let k = |j: u64| (j + 1).wrapping_mul(KEY_STEP) as i64;
    let mut acc_lo = _mm256_setzero_si256();
    let mut acc_hi = _mm256_setzero_si256();
    let mut key_lo = _mm256_set_epi64x(k(3), k(2), k(1), k(0));
    let mut key_hi = _mm256_set_epi64x(k(7), k(6), k(5), k(4));
    let step = _mm256_set1_epi64x(KEY_STEP.wrapping_mul(LANES as u64) as i64);
    for stripe in stripes {
        // SAFETY: `stripe` holds 64 bytes; unaligned loads of 32 bytes at offsets 0 and 32.
        let (w_lo, w_hi) = unsafe {
            (
                _mm256_loadu_si256(stripe.as_ptr().cast()),
                _mm256_loadu_si256(stripe.as_ptr().add(32).cast()),
            )
        };
        let x_lo = _mm256_xor_si256(w_lo, key_lo);
        let x_hi = _mm256_xor_si256(w_hi, key_hi);
        let p_lo = _mm256_mul_epu32(x_lo, _mm256_srli_epi64::<32>(x_lo));
        let p_hi = _mm256_mul_epu32(x_hi, _mm256_srli_epi64::<32>(x_hi));
        acc_lo = _mm256_add_epi64(acc_lo, p_lo);
        acc_hi = _mm256_add_epi64(acc_hi, p_hi);
        acc_lo = _mm256_add_epi64(acc_lo, _mm256_shuffle_epi32::<0b0100_1110>(w_lo));
        acc_hi = _mm256_add_epi64(acc_hi, _mm256_shuffle_epi32::<0b0100_1110>(w_hi));
        key_lo = _mm256_add_epi64(key_lo, step);
        key_hi = _mm256_add_epi64(key_hi, step);
    }
    let mut lanes = [0u64; LANES];
    // SAFETY: `lanes` holds 64 bytes; unaligned stores of 32 bytes at offsets 0 and 32.
    unsafe {
        _mm256_storeu_si256(lanes.as_mut_ptr().cast(), acc_lo);
        _mm256_storeu_si256(lanes.as_mut_ptr().add(4).cast(), acc_hi);
    }
    tail_words(&mut lanes, tail, full_words);
    lanes
}

/// AVX-512: the eight lanes in one vector, one 64-byte stripe per step (as [`chunk_lanes_avx2`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn chunk_lanes_avx512(chunk: &[u8]) -> [u64; LANES] {
    use std::arch::x86_64::*;
    let stripes = chunk.chunks_exact(8 * LANES);
    let tail = stripes.remainder();
    let full_words = chunk.len() / (8 * LANES) * LANES;
    let k = |j: u64| (j + 1).wrapping_mul(KEY_STEP) as i64;
    // Two accumulators (even and odd stripes) for two independent add chains; their sum is
    // the lanes (addition modulo 2^64 in any order).
    let mut acc = [_mm512_setzero_si512(); 2];
    let mut key = _mm512_set_epi64(k(7), k(6), k(5), k(4), k(3), k(2), k(1), k(0));
    let step = _mm512_set1_epi64(KEY_STEP.wrapping_mul(LANES as u64) as i64);
    for (i, stripe) in stripes.enumerate() {
        // SAFETY: `stripe` holds 64 bytes; an unaligned load of 64 bytes.
        let w = unsafe { _mm512_loadu_si512(stripe.as_ptr().cast()) };
        let x = _mm512_xor_si512(w, key);
        let p = _mm512_mul_epu32(x, _mm512_srli_epi64::<32>(x));
        let a = &mut acc[i & 1];
        *a = _mm512_add_epi64(
            *a,
            _mm512_add_epi64(p, _mm512_shuffle_epi32::<0b0100_1110>(w)),
        );
        key = _mm512_add_epi64(key, step);
    }
    let acc = _mm512_add_epi64(acc[0], acc[1]);
    let mut lanes = [0u64; LANES];
    // SAFETY: `lanes` holds 64 bytes; an unaligned store of 64 bytes.
    unsafe { _mm512_storeu_si512(lanes.as_mut_ptr().cast(), acc) };
    tail_words(&mut lanes, tail, full_words);
    lanes
}

/// The words of the last, shorter stripe (starting at word `j`): zero-padded, absent words
/// not counted.
#[inline(always)]
fn tail_words(lanes: &mut [u64; LANES], tail: &[u8], j: usize) {
    for (i, word) in tail.chunks(8).enumerate() {
        let mut b = [0u8; 8];
        b[..word.len()].copy_from_slice(word);
        let w = u64::from_le_bytes(b);
        let l = i % LANES;
        let x = w ^ KEYS[j + i];
        lanes[l] = lanes[l].wrapping_add((x & 0xffff_ffff).wrapping_mul(x >> 32));
        lanes[l ^ 1] = lanes[l ^ 1].wrapping_add(w);
    }
}

/// The eight lanes of one chunk (at most [`CHUNK_BYTES`] bytes; longer input is cut there).
pub fn chunk_lanes(chunk: &[u8]) -> [u64; LANES] {
    let chunk = &chunk[..chunk.len().min(CHUNK_BYTES)];
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU supports AVX-512F (checked just above), the only requirement of the
        // target-feature function.
        return unsafe { chunk_lanes_avx512(chunk) };
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked just above), the only requirement of the
        // target-feature function.
        return unsafe { chunk_lanes_avx2(chunk) };
    }
    chunk_lanes_portable(chunk)
}

/// Folds one chunk's lanes into the chain: `fmix(h ^ sum of fmix(a_l ^ (l + 1) * LANE_STEP))`.
#[inline]
pub fn fold_lanes(h: u64, lanes: &[u64; LANES]) -> u64 {
    let mut c = 0u64;
    for (l, &a) in lanes.iter().enumerate() {
        c = c.wrapping_add(fmix(a ^ (l as u64 + 1).wrapping_mul(LANE_STEP)));
    }
    fmix(h ^ c)
}

/// The checksum of one page payload (see the module docs): `token_fingerprint` is the buffer's
/// token fingerprint, `layer_id` the model layer id.
pub fn page_checksum(token_fingerprint: u64, layer_id: u64, payload: &[u8]) -> u64 {
    let mut h = seed(token_fingerprint, layer_id, payload.len() as u64);
    for chunk in payload.chunks(CHUNK_BYTES) {
        h = fold_lanes(h, &chunk_lanes(chunk));
    }
    h
}

/// The checksum of a payload given in pieces (a page gathered from several segments, such as
/// `page_head`'s per-head runs), equal to [`page_checksum`] of the pieces concatenated. Pieces
/// that do not end on a chunk boundary are buffered (one chunk at most).
#[derive(Clone, Debug)]
pub struct ChecksumStream {
    h: u64,
    expected_bytes: u64,
    seen_bytes: u64,
    partial: Vec<u8>,
}

impl ChecksumStream {
    /// A stream over a payload of `payload_bytes` bytes.
    pub fn new(token_fingerprint: u64, layer_id: u64, payload_bytes: u64) -> Self {
        ChecksumStream {
            h: seed(token_fingerprint, layer_id, payload_bytes),
            expected_bytes: payload_bytes,
            seen_bytes: 0,
            partial: Vec::new(),
        }
    }

    /// Feeds the next piece.
    pub fn update(&mut self, mut data: &[u8]) {
        self.seen_bytes = self.seen_bytes.saturating_add(data.len() as u64);
        if !self.partial.is_empty() {
            let take = (CHUNK_BYTES - self.partial.len()).min(data.len());
            self.partial.extend_from_slice(&data[..take]);
            data = &data[take..];
            if self.partial.len() < CHUNK_BYTES {
                return;
            }
            self.h = fold_lanes(self.h, &chunk_lanes(&self.partial));
            self.partial.clear();
        }
        let mut chunks = data.chunks_exact(CHUNK_BYTES);
        for chunk in &mut chunks {
            self.h = fold_lanes(self.h, &chunk_lanes(chunk));
        }
        self.partial.extend_from_slice(chunks.remainder());
    }

    /// The checksum.
    ///
    /// # Errors
    /// A [`GeometryError`] on `payload bytes` naming both lengths when the pieces fed do not
    /// add up to the length given to [`ChecksumStream::new`].
    pub fn finish(self) -> Result<u64, GeometryError> {
        if self.seen_bytes != self.expected_bytes {
            return Err(GeometryError::new(
                "payload bytes",
                format!(
                    "checksum stream fed {} bytes, the page payload has {}",
                    self.seen_bytes, self.expected_bytes
                ),
            ));
        }
        let mut h = self.h;
        if !self.partial.is_empty() {
            h = fold_lanes(h, &chunk_lanes(&self.partial));
        }
        Ok(h)
    }
}

/// What seeds the checksum of one layer of one buffer's pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PageChecksumKey {
    /// The buffer's token fingerprint ([`crate::fingerprint::token_hash`]).
    pub token_fingerprint: u64,
    /// The model layer id: `layer_ids[layer]` when the buffer gives them, else the layer index.
    pub layer_id: u64,
    /// Page payload bytes (padding excluded).
    pub payload_bytes: u64,
}

impl PageChecksumKey {
    /// The checksum of `payload`.
    ///
    /// # Errors
    /// A [`GeometryError`] on `payload bytes` naming both lengths when `payload` is not one
    /// page payload.
    pub fn checksum(&self, payload: &[u8]) -> Result<u64, GeometryError> {
        if payload.len() as u64 != self.payload_bytes {
            return Err(GeometryError::new(
                "payload bytes",
                format!(
                    "{} bytes given to a checksum of a {}-byte page payload",
                    payload.len(),
                    self.payload_bytes
                ),
            ));
        }
        Ok(page_checksum(
            self.token_fingerprint,
            self.layer_id,
            payload,
        ))
    }

    /// A stream over one page payload given in pieces.
    pub fn stream(&self) -> ChecksumStream {
        ChecksumStream::new(self.token_fingerprint, self.layer_id, self.payload_bytes)
    }
}

impl PoolGeometry {
    /// The checksum key of layer `layer` (an index in `0..layers`) of buffer `b`.
    ///
    /// # Errors
    /// A [`GeometryError`] naming the buffer for an index or layer out of range, or a layout
    /// whose page payload does not fit in 64 bits.
    pub fn page_checksum_key(
        &self,
        b: usize,
        layer: u64,
    ) -> Result<PageChecksumKey, GeometryError> {
        let buf = self.buffer(b)?;
        if layer >= buf.layers {
            return Err(GeometryError::new(
                format!("{}.layers", buffer_path(b, buf)),
                format!("layer {layer} out of range ({} layers)", buf.layers),
            ));
        }
        let layer_id = match buf.layer_ids() {
            // `layer < layers = layer_ids.len()` for a valid geometry; else the index.
            Some(ids) => ids.get(layer as usize).map_or(layer, |&id| u64::from(id)),
            None => layer,
        };
        Ok(PageChecksumKey {
            token_fingerprint: token_hash(buf, self.page_size_tokens),
            layer_id,
            payload_bytes: self.page_geometry(b)?.page_payload_bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fmix_of_one_by_hand() {
        // x = 1: x ^= x >> 33 leaves 1; x *= 0xff51afd7ed558ccd gives that constant; then
        // x ^= x >> 33 with x >> 33 = 0xff51afd7ed558ccd >> 33 = 0x7fa8d7eb.
        let a: u64 = 0xff51_afd7_ed55_8ccd;
        let a = a ^ (a >> 33);
        assert_eq!(a, 0xff51_afd7_ed55_8ccd ^ 0x7fa8_d7eb);
        let b = a.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        assert_eq!(fmix(1), b ^ (b >> 33));
    }

    #[test]
    fn one_word_by_hand() {
        // A 3-byte payload [1, 2, 3]: one word w_0 = 0x030201 (zero-padded), K_0 = KEY_STEP.
        let w: u64 = 0x03_0201;
        let x = w ^ 0x9e37_79b9_7f4a_7c15;
        let mut lanes = [0u64; 8];
        lanes[0] = (x & 0xffff_ffff).wrapping_mul(x >> 32);
        lanes[1] = w;
        assert_eq!(chunk_lanes(&[1, 2, 3]), lanes);
        let h = fmix(fmix(fmix(7 ^ 0x7475_6f79_616c_766b) ^ 2) ^ 3);
        let mut c = 0u64;
        for (l, a) in lanes.into_iter().enumerate() {
            c = c.wrapping_add(fmix(a ^ (l as u64 + 1).wrapping_mul(0xc2b2_ae3d_27d4_eb4f)));
        }
        assert_eq!(page_checksum(7, 2, &[1, 2, 3]), fmix(h ^ c));
    }

    #[test]
    fn the_vector_path_equals_the_portable_one() {
        for len in [0, 1, 7, 8, 63, 64, 65, 1000, 4095, 4096] {
            let chunk: Vec<u8> = (0..len as u32).map(|i| (i * 97 + 5) as u8).collect();
            assert_eq!(
                chunk_lanes(&chunk),
                chunk_lanes_portable(&chunk),
                "{len} bytes"
            );
        }
    }

    #[test]
    fn stream_in_odd_pieces_equals_one_call() {
        let payload: Vec<u8> = (0..10_000u32).map(|i| (i * 31 % 251) as u8).collect();
        let whole = page_checksum(5, 9, &payload);
        let mut s = ChecksumStream::new(5, 9, payload.len() as u64);
        for piece in payload.chunks(1_000) {
            s.update(piece);
        }
        assert_eq!(s.finish().unwrap(), whole);
        let mut short = ChecksumStream::new(5, 9, 10_001);
        short.update(&payload);
        let e = short.finish().unwrap_err();
        assert!(
            e.problem.contains("10000") && e.problem.contains("10001"),
            "{e}"
        );
    }
}
