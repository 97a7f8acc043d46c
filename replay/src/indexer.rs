//! The DeepSeek sparse indexer's selection (DeepSeek-V3.2 paper): for a query token `t`,
//! `I(t, s) = sum_h w(t, h) * ReLU(q(t, h) . k(s))` over the indexer heads `h`, with `k(s)` the
//! index-K key of past token `s` (one 128-dim key shared by every head); the main attention
//! reads only the `top_k` best tokens. The real model has 64 indexer heads and top-2048; the
//! replays run 8 heads and top-16 so that a whole trace runs in seconds on a CPU (fewer heads
//! change the scores, not what a corrupted key does to them: a key read from the wrong bytes
//! scores differently under any query, and a top-16 that contains it differs).

/// The score of one key under `heads` queries `q` (`[heads][dim]`) with weights `w`.
pub fn score(q: &[f32], w: &[f32], key: &[f32]) -> f32 {
    let dim = key.len();
    w.iter()
        .zip(q.chunks_exact(dim))
        .map(|(wh, qh)| {
            let dot: f32 = qh.iter().zip(key).map(|(a, b)| a * b).sum();
            wh * dot.max(0.0)
        })
        .sum()
}

/// Indexer scores `I(s) = sum_h w[h] * ReLU(q[h] . k[s])` over `keys` (`[tokens][dim]`) and the
/// indices of the `k` best (ties: lower index first), best first.
pub fn top_k(q: &[f32], w: &[f32], keys: &[f32], dim: usize, k: usize) -> Vec<u64> {
    let scores: Vec<f32> = keys.chunks_exact(dim).map(|key| score(q, w, key)).collect();
    top_k_of_scores(&scores, k)
}

/// The indices of the `k` highest `scores` (ties: lower index first), best first.
pub fn top_k_of_scores(scores: &[f32], k: usize) -> Vec<u64> {
    let mut scored: Vec<(f32, u64)> = scores
        .iter()
        .enumerate()
        .map(|(s, &v)| (v, s as u64))
        .collect();
    let order = |a: &(f32, u64), b: &(f32, u64)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
    if k < scored.len() && k > 0 {
        scored.select_nth_unstable_by(k - 1, order);
        scored.truncate(k);
    }
    scored.sort_by(order);
    scored.truncate(k);
    scored.into_iter().map(|(_, s)| s).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn score_is_weighted_relu_of_dots() {
        // Two heads over dim 2: q0 . k = 1*3 + 0*4 = 3, q1 . k = -1*3 + 0*4 = -3 -> ReLU 0.
        // I = 0.5 * 3 + 2 * 0 = 1.5.
        assert_eq!(score(&[1.0, 0.0, -1.0, 0.0], &[0.5, 2.0], &[3.0, 4.0]), 1.5);
    }

    #[test]
    fn top_k_keeps_the_best_with_ties_to_the_lower_index() {
        assert_eq!(
            top_k_of_scores(&[1.0, 5.0, 3.0, 5.0, 0.0], 3),
            vec![1, 3, 2]
        );
        assert_eq!(top_k_of_scores(&[1.0, 2.0], 5), vec![1, 0]);
    }
}
