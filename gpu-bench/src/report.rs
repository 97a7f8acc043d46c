//! The `--overlap` report: medians with their range, one line per row as it is measured, and
//! the markdown table at the end.

pub struct Stat {
    pub median: f64,
    pub lo: f64,
    pub hi: f64,
}

pub fn stat(mut v: Vec<f64>) -> Stat {
    v.sort_by(f64::total_cmp);
    Stat {
        median: v[v.len() / 2],
        lo: v[0],
        hi: v[v.len() - 1],
    }
}

pub struct Row {
    pub shape: String,
    pub path: String,
    pub bytes: u64,
    pub alone: Stat,
    pub next: Stat,
    pub slowdown: Stat,
    pub ceiling_alone_ms: f64,
    pub ceiling_next_ms: f64,
    pub loop_outlasted: bool,
}

pub fn gbps(bytes: u64, ms: f64) -> f64 {
    bytes as f64 / ms / 1e6
}

pub fn print_table(name: &str, sm_count: u32, gemm_ms: f64, rows: &[Row]) {
    println!(
        "\n## Transfers next to a bf16 GEMM ({name}, {} SMs; GEMM alone {:.3} ms)\n",
        sm_count, gemm_ms
    );
    println!(
        "| transfer | path | alone GB/s (range) | / memcpy | next to GEMM GB/s (range) | / memcpy next to GEMM | GEMM slowed (range) |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|");
    for r in rows {
        println!(
            "| {} | {} | {:.2} ({:.2}-{:.2}) | {:.3} | {:.2} ({:.2}-{:.2}){} | {:.3} | {:+.1}% ({:+.1} to {:+.1}) |",
            r.shape,
            r.path,
            gbps(r.bytes, r.alone.median),
            gbps(r.bytes, r.alone.hi),
            gbps(r.bytes, r.alone.lo),
            r.ceiling_alone_ms / r.alone.median,
            gbps(r.bytes, r.next.median),
            gbps(r.bytes, r.next.hi),
            gbps(r.bytes, r.next.lo),
            if r.loop_outlasted {
                ""
            } else {
                " (GEMM loop ended first)"
            },
            r.ceiling_next_ms / r.next.median,
            100.0 * r.slowdown.median,
            100.0 * r.slowdown.lo,
            100.0 * r.slowdown.hi,
        );
    }
}

pub fn print_row(r: &Row, burst: usize) {
    println!(
        "{:<70} {:<55} alone {:>7.2} GB/s ({:.3})  next {:>7.2} GB/s ({:.3})  GEMM {:+.1}%{}",
        if burst > 1 {
            format!("{} (burst of {burst})", r.shape)
        } else {
            r.shape.clone()
        },
        r.path,
        gbps(r.bytes, r.alone.median),
        r.ceiling_alone_ms / r.alone.median,
        gbps(r.bytes, r.next.median),
        r.ceiling_next_ms / r.next.median,
        100.0 * r.slowdown.median,
        if r.loop_outlasted {
            ""
        } else {
            " (loop ended first)"
        }
    );
}
