//! `kvlayout replay` exit codes on the binary: 0 ran clean, 1 pairing refused, 2 bad input,
//! 3 corrupted. The synthetic workload runs small (8 sessions, 2 layers, batches of 2, 14 device
//! pages); the trace workload runs a hand-made 12-request multi-turn trace (see
//! `multi_turn_trace`) so the debug binary stays fast.

use std::process::Command;

fn replay(extra: &[&str]) -> (i32, String) {
    replay_layers("2", extra)
}

fn replay_layers(layers: &str, extra: &[&str]) -> (i32, String) {
    let host = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../configs/geometry/host-index-k-fp8-formula.json"
    );
    let mut args = vec![
        "replay",
        "--workload",
        "synthetic",
        "--sessions",
        "8",
        "--layers",
        layers,
        "--concurrency",
        "2",
        "--device-pages",
        "14",
    ];
    // A host geometry file brings its own pages.
    if !extra.contains(&"--host-geometry") {
        args.extend(["--host-pages", "64"]);
    }
    for a in extra {
        args.push(if *a == "HOST" { host } else { a });
    }
    let out = Command::new(env!("CARGO_BIN_EXE_kvlayout"))
        .args(&args)
        .output()
        .expect("run kvlayout");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().expect("exit code"), text)
}

#[test]
fn mirrored_bf16_host_exits_0() {
    let (code, text) = replay(&["--index-k", "bf16"]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("corrupted 0"), "{text}");
}

#[test]
fn fp8_formula_host_is_refused_with_exit_1() {
    let (code, text) = replay(&["--index-k", "bf16", "--host-geometry", "HOST"]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("index_k.bytes_per_token: 256, 132"), "{text}");
}

#[test]
fn seed_bug_without_the_shim_exits_3() {
    let (code, text) = replay(&[
        "--index-k",
        "bf16",
        "--host-geometry",
        "HOST",
        "--no-verify",
    ]);
    assert_eq!(code, 3, "{text}");
    assert!(!text.contains("corrupted 0"), "{text}");
}

#[test]
fn more_layers_than_the_model_exits_2() {
    let (code, text) = replay_layers("62", &[]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("62 simulated layers, but the model has 61"),
        "{text}"
    );
}

/// Review 2, N1: a host geometry file is read up to the 16 MiB cap, not whole.
#[test]
fn endless_host_geometry_file_is_refused() {
    let (code, text) = replay(&["--host-geometry", "/dev/zero"]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("16777216-byte limit"), "{text}");
}

/// Review 2, N2: an unwritable stdout is an exit-2 error, not a panic (exit 101).
#[test]
fn unwritable_stdout_exits_2() {
    let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
        eprintln!("skipped: no /dev/full on this system");
        return;
    };
    let out = Command::new(env!("CARGO_BIN_EXE_kvlayout"))
        .args(["formats", "--json"])
        .stdout(full)
        .output()
        .expect("run kvlayout");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.starts_with("error: failed printing to stdout"), "{err}");
}

/// Issue 12: a batch larger than the device pool names `--concurrency`.
#[test]
fn concurrency_past_the_pool_names_concurrency() {
    // A session ends at 3 x 64 + 3 x (48 + 8) = 360 tokens = ceil(360 / 64) = 6 pages; 8 at
    // once need 48 > 14.
    let out = Command::new(env!("CARGO_BIN_EXE_kvlayout"))
        .args([
            "replay",
            "--workload",
            "synthetic",
            "--sessions",
            "8",
            "--layers",
            "2",
        ])
        .args([
            "--concurrency",
            "8",
            "--device-pages",
            "14",
            "--host-pages",
            "64",
        ])
        .output()
        .expect("run kvlayout");
    let text = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(
        text.contains("--concurrency: 8 sessions at once need 8 x 6 pages = 48, more than the device pool's 14 pages"),
        "{text}"
    );
}

/// 4 sessions x 3 turns, one request a second; session `s`, turn `k` sends blocks
/// `10 s ..= 10 s + k` (`(k + 1) x 512` tokens). With 24 device pages (3 blocks) turns 1 and 2
/// load their earlier blocks back from the host: 8 of 12 requests.
fn multi_turn_trace(extra_line: &str) -> std::path::PathBuf {
    let mut out = String::new();
    let mut t = 0;
    for k in 0..3u64 {
        for s in 0..4u64 {
            let ids: Vec<String> = (0..=k).map(|b| (10 * s + b).to_string()).collect();
            out.push_str(&format!(
                "{{\"timestamp\": {t}, \"input_length\": {}, \"output_length\": 0, \"hash_ids\": [{}]}}\n",
                (k + 1) * 512,
                ids.join(", ")
            ));
            t += 1000;
        }
    }
    out.push_str(extra_line);
    // One file per call: tests run in parallel threads, and a shared name let one test
    // truncate the trace while another's kvlayout read it ("no requests", CI stop 19).
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = format!("multi-turn-{call}.jsonl");
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::write(&path, out).expect("write the trace");
    path
}

fn trace_replay(extra_line: &str, extra: &[&str]) -> (i32, String) {
    let trace = multi_turn_trace(extra_line);
    let host = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../configs/geometry/host-index-k-fp8-formula.json"
    );
    let mut args = vec![
        "replay".to_string(),
        "--trace".into(),
        trace.display().to_string(),
        "--index-k".into(),
        "bf16".into(),
        "--device-pages".into(),
        "24".into(),
    ];
    if !extra.contains(&"--host-geometry") {
        args.extend(["--host-pages".to_string(), "96".to_string()]);
    }
    args.extend(extra.iter().map(|a| {
        if *a == "HOST" {
            host.to_string()
        } else {
            a.to_string()
        }
    }));
    let out = Command::new(env!("CARGO_BIN_EXE_kvlayout"))
        .args(&args)
        .output()
        .expect("run kvlayout");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().expect("exit code"), text)
}

#[test]
fn trace_mirrored_host_exits_0_with_host_hits() {
    let (code, text) = trace_replay("", &[]);
    assert_eq!(code, 0, "{text}");
    // 8 of 12 requests load from the host: 8 / 12 = 66.7%.
    assert!(
        text.contains("requests 12: with host hits 8 (66.7%), corrupted 0 (0.0%)"),
        "{text}"
    );
}

#[test]
fn trace_seed_host_is_refused_with_exit_1() {
    let (code, text) = trace_replay("", &["--host-geometry", "HOST"]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("index_k.bytes_per_token: 256, 132"), "{text}");
    assert!(text.contains("no request ran"), "{text}");
}

#[test]
fn trace_seed_host_without_the_shim_exits_3() {
    let (code, text) = trace_replay("", &["--host-geometry", "HOST", "--no-verify", "--json"]);
    assert_eq!(code, 3, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).expect("one JSON object");
    let corrupted = v["corrupted_requests"].as_u64().unwrap();
    let hits = v["requests_with_host_hits"].as_u64().unwrap();
    assert!(corrupted > 0 && corrupted <= hits, "{v}");
    assert_eq!(v["host_pages"], 4096);
    assert_eq!(v["device_pages"], 24);
}

#[test]
fn trace_bad_line_exits_2_naming_line_and_field() {
    let (code, text) = trace_replay(
        "{\"timestamp\": 12000, \"input_length\": 1025, \"output_length\": 0, \"hash_ids\": [1, 2]}\n",
        &[],
    );
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains(
            "trace line 13: hash_ids: 2 ids for input_length 1025; 512-token blocks need exactly \
             ceil(1025/512) = 3"
        ),
        "{text}"
    );
    // Regression: a surplus was reported as ids that "do not cover" the prompt. 512 tokens are
    // ceil(512 / 512) = 1 block; 2 ids are given.
    let (code, text) = trace_replay(
        "{\"timestamp\": 12000, \"input_length\": 512, \"output_length\": 0, \"hash_ids\": [1, 2]}\n",
        &[],
    );
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains(
            "trace line 13: hash_ids: 2 ids for input_length 512; 512-token blocks need exactly \
             ceil(512/512) = 1"
        ),
        "{text}"
    );
    let (code, text) = trace_replay(
        "{\"timestamp\": 12000, \"input_length\": -5, \"output_length\": 0, \"hash_ids\": []}\n",
        &[],
    );
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("trace line 13: input_length: -5"), "{text}");
    // A key named twice (the last value won before).
    let (code, text) = trace_replay(
        "{\"timestamp\": 12000, \"input_length\": 512, \"input_length\": 1024, \"output_length\": 0, \"hash_ids\": [1, 2]}\n",
        &[],
    );
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("trace line 13: input_length: key \"input_length\" given twice"),
        "{text}"
    );
}

/// Hostile review: `--decode-ms-per-token 18446744073709551615` saturated and printed `last
/// request done at 18446744073709552.0 s`, exit 0. Line 13 decodes 2 tokens: 2 x (2^64 - 1)
/// overflows; with 1 token the decode time fits (2^64 - 1 ms) but the end, 12,000 ms (its
/// timestamp; the 12 requests before it decode nothing) + 26 ms of prefill (512 new tokens at
/// 20,000 tokens/s = 25.6 ms, rounded up) + that, does not.
#[test]
fn replay_times_that_overflow_are_errors_naming_the_line_and_flag() {
    let line = |out: u64| {
        format!(
            "{{\"timestamp\": 12000, \"input_length\": 512, \"output_length\": {out}, \"hash_ids\": [99]}}\n"
        )
    };
    let max = u64::MAX.to_string();
    let (code, text) = trace_replay(&line(2), &["--decode-ms-per-token", &max]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains(
            "trace line 13: output_length: 2 tokens x --decode-ms-per-token \
             18446744073709551615 ms overflows 64 bits"
        ),
        "{text}"
    );
    let (code, text) = trace_replay(&line(1), &["--decode-ms-per-token", &max]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains(
            "trace line 13: output_length: the request ends at 12000 ms (admitted) + 26 ms \
             (prefill) + 18446744073709551615 ms (1 tokens x --decode-ms-per-token \
             18446744073709551615 ms): overflows 64 bits"
        ),
        "{text}"
    );
    assert!(!text.contains("last request done"), "{text}");
}

/// Hostile review: errors found after a line was read said `workload: output_length: overflow`
/// (no line, no value) and gave no line for a timestamp past the 31-day span.
#[test]
fn trace_overflow_and_span_name_the_line_and_values() {
    // 1,024 + 18,446,744,073,709,551,000 > 2^64 - 1 = 18,446,744,073,709,551,615.
    let (code, text) = trace_replay(
        "{\"timestamp\": 12000, \"input_length\": 1024, \"output_length\": 18446744073709551000, \"hash_ids\": [1, 2]}\n",
        &[],
    );
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains(
            "trace line 13: output_length: input_length 1024 + output_length \
             18446744073709551000 tokens overflows 64 bits"
        ),
        "{text}"
    );
    // The first request is at 0 ms; 31 days = 2,678,400,000 ms, one more is refused.
    let (code, text) = trace_replay(
        "{\"timestamp\": 2678400001, \"input_length\": 512, \"output_length\": 0, \"hash_ids\": [1]}\n",
        &[],
    );
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains(
            "trace line 13: timestamp: 2678400001 ms is 2678400001 ms after the first request's \
             (0 ms), more than the 2678400000 ms (31 days) a trace may span"
        ),
        "{text}"
    );
}

#[test]
fn trace_plot_writes_an_svg() {
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("replay-plot.svg");
    let _ = std::fs::remove_file(&path);
    let (code, text) = trace_replay("", &["--plot", path.to_str().unwrap()]);
    assert_eq!(code, 0, "{text}");
    let svg = std::fs::read_to_string(&path).expect("the plot");
    assert!(svg.starts_with("<svg"), "{svg}");
    for label in [
        "requests with host hits",
        "corrupted requests",
        "minute of the trace",
    ] {
        assert!(svg.contains(label), "{label} missing");
    }
}

/// Issue 12: `--require-gpu` fails instead of falling back to the CPU.
#[test]
fn require_gpu_does_not_fall_back() {
    let (code, text) = trace_replay("", &["--device", "cuda", "--require-gpu"]);
    if text.contains("--require-gpu") {
        // No usable GPU here: refused, nothing ran.
        assert_eq!(code, 2, "{text}");
        assert!(!text.contains("requests 12"), "{text}");
    } else {
        // A GPU: it ran there.
        assert_eq!(code, 0, "{text}");
        assert!(text.contains("backend: cuda"), "{text}");
    }
}

/// Issue 12: `replay --help` names the built-in models and that a model directory works.
#[test]
fn help_names_models_and_directories() {
    let out = Command::new(env!("CARGO_BIN_EXE_kvlayout"))
        .args(["replay", "--help"])
        .output()
        .expect("run kvlayout");
    let text = String::from_utf8_lossy(&out.stdout);
    for want in [
        "deepseek-v3.2-exp",
        "llama-3.1-8b",
        "model directory",
        "--workload",
        "--trace",
    ] {
        assert!(text.contains(want), "{want} missing from {text}");
    }
}

/// Issue 13: Mooncake's synthetic trace also runs (its first 100 requests, vendored in data/),
/// and every prompt token is accounted for: the JSON's `prompt_tokens` equals the sum of the
/// file's `input_length`s, split into device + host + recomputed.
#[test]
fn mooncake_synthetic_trace_runs() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../data/synthetic_trace_head100.jsonl"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_kvlayout"))
        .args([
            "replay",
            "--index-k",
            "bf16",
            "--device-pages",
            "2000",
            "--json",
            "--trace",
            path,
        ])
        .output()
        .expect("run kvlayout");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).expect("one JSON object");
    let input: u64 = std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["input_length"]
                .as_u64()
                .unwrap()
        })
        .sum();
    assert_eq!(v["requests"], 100);
    assert_eq!(v["prompt_tokens"], input);
    let parts = ["device_tokens", "host_tokens", "recomputed_tokens"]
        .iter()
        .map(|k| v[k].as_u64().unwrap())
        .sum::<u64>();
    assert_eq!(parts, input);
    assert_eq!(v["corrupted_requests"], 0);
    assert!(v["requests_with_host_hits"].as_u64().unwrap() > 0, "{v}");
}

/// Nothing dropped silently: `--host-pages` next to a host geometry file (which brings its own
/// pages) is refused.
#[test]
fn host_pages_with_a_host_geometry_is_refused() {
    let (code, text) = trace_replay("", &["--host-geometry", "HOST", "--host-pages", "5"]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("--host-pages: the --host-geometry file brings the host pages"),
        "{text}"
    );
}

/// Runs `kvlayout replay ARGS` on the 12-request trace; (exit code, stdout + stderr).
fn replay_on_trace(args: &[&str]) -> (i32, String) {
    let trace = multi_turn_trace("");
    let out = Command::new(env!("CARGO_BIN_EXE_kvlayout"))
        .arg("replay")
        .args(args)
        .arg("--trace")
        .arg(&trace)
        .output()
        .expect("run kvlayout");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().expect("exit code"), text)
}

/// Regression: gpt-oss-20b ran with its sliding-window buffer `swa` sized as if it kept every
/// token. The page schedule models full-attention pools only: refused, naming `swa` and its
/// window (config.json `sliding_window` 128).
#[test]
fn sliding_window_model_is_refused_naming_the_buffer() {
    let (code, text) = replay_on_trace(&["--model", "gpt-oss-20b", "--device-pages", "24"]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains(
            "error: --model gpt-oss-20b: buffer `swa` keeps a sliding window: the last 128 \
             tokens of a request (attention: sliding_window_tokens 128); `kvlayout describe` \
             covers this model, but the replay's page schedule models full-attention pools only"
        ),
        "{text}"
    );
    assert!(!text.contains("requests 12"), "{text}");
    let out = Command::new(env!("CARGO_BIN_EXE_kvlayout"))
        .args([
            "replay",
            "--model",
            "gpt-oss-20b",
            "--workload",
            "synthetic",
        ])
        .output()
        .expect("run kvlayout");
    let text = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(
        text.contains("buffer `swa` keeps a sliding window"),
        "{text}"
    );
}

/// Regression: qwen3-coder-next (Gated DeltaNet layers: `conv` and `temporal` state buffers)
/// failed inside the pool ("token index out of range for the page") and was reported as bad
/// input. It is refused up front, naming the state buffers, on both workloads.
#[test]
fn state_buffer_model_is_refused_naming_the_buffer() {
    let want = "error: --model qwen3-coder-next: buffer `conv` keeps a recurrent state: one \
                fixed-size slot per request, no token axis (attention: state); buffer `temporal` \
                keeps a recurrent state";
    let (code, text) = replay_on_trace(&["--model", "qwen3-coder-next"]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains(want), "{text}");
    assert!(!text.contains("token index out of range"), "{text}");
    let out = Command::new(env!("CARGO_BIN_EXE_kvlayout"))
        .args([
            "replay",
            "--model",
            "qwen3-coder-next",
            "--workload",
            "synthetic",
        ])
        .output()
        .expect("run kvlayout");
    let text = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(text.contains(want), "{text}");
}

/// Regression: an unwritable `--plot` path was found only after the whole run, and the report
/// was lost. It is refused before the run (exit 2, naming --plot and the path).
#[test]
fn unwritable_plot_is_refused_before_the_run() {
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("no-such-dir/plot.svg");
    let (code, text) = trace_replay("", &["--plot", path.to_str().unwrap()]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains(&format!("error: --plot {}:", path.display())),
        "{text}"
    );
    assert!(!text.contains("requests 12"), "{text}");
}

/// Regression: a drawing that fails after the run (here /dev/full: it opens, every write fails)
/// printed only the drawing error and exited 2, hiding the run's exit 3. The report comes
/// first, the plot error follows on stderr, and the exit code is the run's.
#[cfg(target_os = "linux")]
#[test]
fn failed_drawing_keeps_the_report_and_the_exit_code() {
    let out = Command::new(env!("CARGO_BIN_EXE_kvlayout"))
        .args(["replay", "--index-k", "bf16", "--device-pages", "24"])
        .args(["--no-verify", "--plot", "/dev/full", "--host-geometry"])
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../configs/geometry/host-index-k-fp8-formula.json"
        ))
        .arg("--trace")
        .arg(multi_turn_trace(""))
        .output()
        .expect("run kvlayout");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    // The seed bug without the shim: exit 3, as trace_seed_host_without_the_shim_exits_3.
    assert_eq!(out.status.code(), Some(3), "{stdout}{stderr}");
    assert!(stdout.contains("requests 12: with host hits 8"), "{stdout}");
    assert!(!stdout.contains("plot: /dev/full"), "{stdout}");
    assert!(stderr.contains("error: --plot /dev/full: "), "{stderr}");
}

/// Regression: `--require-gpu` without `--device cuda` was ignored.
#[test]
fn require_gpu_without_cuda_is_refused() {
    let (code, text) = trace_replay("", &["--require-gpu"]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("error: --require-gpu needs --device cuda"),
        "{text}"
    );
    assert!(!text.contains("requests 12"), "{text}");
}

/// Regression: `--buffers index_k,index_k` was accepted silently.
#[test]
fn a_buffer_named_twice_is_refused() {
    let (code, text) = trace_replay("", &["--buffers", "index_k,index_k"]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("workload: --buffers: index_k is named twice"),
        "{text}"
    );
}

/// Regression: a trace without requests (empty, or empty lines only) exited 0 saying nothing.
#[test]
fn an_empty_trace_is_refused() {
    for (name, body) in [("empty.jsonl", ""), ("blank.jsonl", "\n\n")] {
        let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
        std::fs::write(&path, body).expect("write the trace");
        let out = Command::new(env!("CARGO_BIN_EXE_kvlayout"))
            .args(["replay", "--device-pages", "24", "--trace"])
            .arg(&path)
            .output()
            .expect("run kvlayout");
        let text = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{text}");
        assert!(
            text.contains(&format!("error: trace {}: no requests", path.display())),
            "{text}"
        );
    }
}

/// Regression: for every model the default device pool was DeepSeek-V3.2's H200 budget, said
/// as if it were the model's own. llama-3.1-70b: 80 layers x 8 KV heads x 128 dims x 2 (K, V)
/// x 2 B (bf16) = 327,680 B per token, x 64 tokens = 20,971,520 B per page; the budget
/// 0.90 x 141 GB - 86.25 GB = 40,650,000,000 B holds floor(40,650,000,000 / 20,971,520) =
/// 1,938 pages. The report says whose budget it is, and an error blaming --device-pages names
/// the default: a 128,000-token prompt needs 128,000 / 64 = 2,000 pages.
#[test]
fn default_device_pages_say_whose_budget_they_are() {
    let source = "DeepSeek-V3.2's H200 budget; pass --device-pages for this model's deployment: \
                  KV budget 40650000000 B (0.90 x 141 GB HBM - 86.25 GB DeepSeek-V3.2 weights \
                  at TP 8) / 20971520 B per page of this model over all layers";
    let (code, text) = replay_on_trace(&["--model", "llama-3.1-70b"]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains(&format!("device pool 1,938 pages of 64 tokens ({source})")),
        "{text}"
    );
    let ids: Vec<String> = (0..128_000 / 512).map(|i: u64| i.to_string()).collect();
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("one-long-prompt.jsonl");
    std::fs::write(
        &path,
        format!(
            "{{\"timestamp\": 0, \"input_length\": 128000, \"output_length\": 0, \"hash_ids\": [{}]}}\n",
            ids.join(", ")
        ),
    )
    .expect("write the trace");
    let out = Command::new(env!("CARGO_BIN_EXE_kvlayout"))
        .args(["replay", "--model", "llama-3.1-70b", "--trace"])
        .arg(&path)
        .output()
        .expect("run kvlayout");
    let text = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(
        text.contains(&format!(
            "error: workload: --device-pages: 1938 pages cannot hold the request of trace line \
             1: it needs 2000 pages (0 to load, 2000 to compute, 0 private for its 0 prompt \
             tokens past the last full page and 0 decoded tokens) (--device-pages not given: \
             the default 1938 pages came from {source})"
        )),
        "{text}"
    );
}

/// Review 3: `--host-pages 0` was refused as `pool: geometry: pages: ...`, not naming the flag
/// the way `--device-pages 0` is.
#[test]
fn zero_host_pages_names_the_flag() {
    let (code, text) = replay_on_trace(&["--index-k", "bf16", "--host-pages", "0"]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("error: workload: --host-pages: must be at least 1, got 0"),
        "{text}"
    );
}

/// Regression: a synthetic-workload flag on the (default) trace workload was ignored silently
/// (`replay --sessions 80` ran the trace). Given at all, even at its default, it is refused.
#[test]
fn synthetic_flags_on_the_trace_workload_are_refused() {
    let (code, text) = trace_replay("", &["--sessions", "80"]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains(
            "error: --sessions belongs to --workload synthetic (this run's workload is trace)"
        ),
        "{text}"
    );
    assert!(!text.contains("requests 12"), "{text}");
    let (code, text) = trace_replay("", &["--turns", "3", "--concurrency", "16"]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("error: --turns and --concurrency belong to --workload synthetic"),
        "{text}"
    );
}

/// Regression: `--write-policy`, `--prefill-tokens-per-s` and `--decode-ms-per-token` were
/// ignored silently by the synthetic workload.
#[test]
fn trace_flags_on_the_synthetic_workload_are_refused() {
    let (code, text) = replay(&["--write-policy", "write_through"]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains(
            "error: --write-policy belongs to --workload trace (this run's workload is synthetic)"
        ),
        "{text}"
    );
    let (code, text) = replay(&[
        "--decode-ms-per-token",
        "20",
        "--prefill-tokens-per-s",
        "20000",
        "--plot",
        "x.svg",
    ]);
    assert_eq!(code, 2, "{text}");
    // Named in the order of the help: --plot, then the HiCache timing flags.
    assert!(
        text.contains(
            "error: --plot, --prefill-tokens-per-s and --decode-ms-per-token belong to --workload trace"
        ),
        "{text}"
    );
    assert!(!text.contains("sessions 8"), "{text}");
}

/// `--host-layout` takes the geometry file's names (as `describe --json` and Python spell
/// them); the dashed names the CLI documented before still work. Regression:
/// `--host-layout layer_first` was refused ("a similar value exists: 'layer-first'").
#[test]
fn host_layout_takes_the_file_names_and_the_old_dashed_ones() {
    for (arg, shown) in [
        ("layer_first", "layer_first"),
        ("layer-first", "layer_first"),
        ("page_first", "page_first"),
        ("page-first", "page_first"),
        ("page_first_direct", "page_first_direct"),
    ] {
        let (code, text) = trace_replay("", &["--host-layout", arg]);
        assert_eq!(code, 0, "--host-layout {arg}: {text}");
        assert!(
            text.contains(&format!("host pool 96 pages, {shown} (mirror")),
            "--host-layout {arg}: {text}"
        );
    }
    let (code, text) = trace_replay("", &["--host-layout", "head_first"]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains(
            "[possible values: layer_first, page_first, page_first_direct, page_head, layer_head, page_head_token]"
        ),
        "{text}"
    );
}

/// `--write-policy` takes SGLang's (and the report's) `write_through`, and the dashed name the
/// README documented.
#[test]
fn write_policy_takes_both_spellings() {
    for arg in ["write_through", "write-through"] {
        let (code, text) = trace_replay("", &["--write-policy", arg]);
        assert_eq!(code, 0, "--write-policy {arg}: {text}");
        assert!(
            text.contains("model of SGLang HiCache: write_through policy"),
            "--write-policy {arg}: {text}"
        );
    }
}

/// Nothing dropped silently: `--host-layout` next to a host geometry file (which brings its own
/// memory layout) is refused.
#[test]
fn host_layout_with_a_host_geometry_is_refused() {
    let (code, text) = trace_replay(
        "",
        &["--host-geometry", "HOST", "--host-layout", "page_first"],
    );
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains(
            "error: --host-layout: the --host-geometry file brings the host memory layout"
        ),
        "{text}"
    );
}

/// Regression: `--index-k` on a model without the DeepSeek indexer was a note on stderr and
/// the run went on; it is an error naming the flag and the model.
#[test]
fn index_k_on_a_model_without_the_indexer_is_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_kvlayout"))
        .args(["replay", "--model", "llama-3.1-8b", "--index-k", "bf16"])
        .output()
        .expect("run kvlayout");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(
            "error: --index-k does not apply: llama-3.1-8b has no DeepSeek sparse-attention indexer"
        ),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());
}

/// Issue 23: `--checksum` on the trace replay: `all` prints a checksum line (mirrored host: no
/// mismatch); the seed's host file with `--no-verify` mismatches on loads and still exits 3;
/// a bad mode and the synthetic workload are refused by name.
#[test]
fn checksum_flag_on_the_trace_replay() {
    let (code, text) = replay_on_trace(&[
        "--index-k",
        "bf16",
        "--device-pages",
        "24",
        "--checksum",
        "all",
    ]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("checksums (all): ") && text.contains(" 0 mismatched, in 0 loads"),
        "{text}"
    );
    let (code, text) = replay_on_trace(&[
        "--index-k",
        "bf16",
        "--device-pages",
        "24",
        "--host-geometry",
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../configs/geometry/host-index-k-fp8-formula.json"
        ),
        "--no-verify",
        "--checksum",
        "sampled:1",
    ]);
    assert_eq!(code, 3, "{text}");
    assert!(
        text.contains("checksums (sampled:1): ") && text.contains("first mismatch: "),
        "{text}"
    );
    // Unchecked (--no-verify): the mismatching bytes were used, not refused (the trial found
    // "refused (treat them as a miss)" printed beside "0 refused").
    let first = text
        .lines()
        .find(|l| l.contains("first mismatch: "))
        .unwrap();
    assert!(
        first.contains("used anyway (unchecked pairing)") && !first.contains("refused"),
        "{first}"
    );
    // N at least the host pool's pages would check host page 0 alone: refused naming the flag.
    let (code, text) = replay_on_trace(&["--checksum", "sampled:18446744073709551615"]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("--checksum: sampled:18446744073709551615")
            && text.contains("only page 0 would be checked"),
        "{text}"
    );
    let (code, text) = replay_on_trace(&["--checksum", "sampled:0"]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("sampled:0") && text.contains("sampled:N with N >= 1"),
        "{text}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_kvlayout"))
        .args(["replay", "--workload", "synthetic", "--checksum", "all"])
        .output()
        .expect("run kvlayout");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--checksum belongs to --workload trace")
    );
}

/// The synthetic workload at `--page-size-tokens 1` (issue 25) with `extra` arguments: exit
/// code and stdout + stderr.
fn replay_page_size_1(device_pages: &str, extra: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kvlayout"))
        .args([
            "replay",
            "--workload",
            "synthetic",
            "--page-size-tokens",
            "1",
        ])
        .args(["--sessions", "4", "--layers", "2", "--concurrency", "2"])
        .args(["--device-pages", device_pages, "--host-pages", "2000"])
        .args(extra)
        .output()
        .expect("run kvlayout");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().expect("exit code"), text)
}

/// Issue 25: at `--page-size-tokens 1` (SGLang's `--page-size 1`) a page is one token. A
/// session ends at 3 prefix pages (3 tokens) + 3 turns x (48 + 8) = 171 tokens = 171 pages
/// (172 would be a page too many: 2 at once need 342 of 340); every page moved carries one
/// token of each of the 2 simulated layers: DeepSeek-V3.2's MLA fp8 token, 656 B (512 fp8 +
/// 4 f32 scales + 64 bf16), and its index-K fp8 token, 132 B (128 fp8 + 1 f32 scale):
/// 2 x 788 = 1,576 B per page.
#[test]
fn page_size_1_pages_are_tokens() {
    let (code, text) = replay_page_size_1("340", &[]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains(
            "2 sessions at once need 2 x 171 pages = 342, more than the device pool's 340 pages"
        ),
        "{text}"
    );
    let (code, text) = replay_page_size_1("400", &["--json"]);
    assert_eq!(code, 0, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).expect("one JSON object");
    assert_eq!(v["page_size_tokens"], 1, "{text}");
    assert_eq!(v["device_pages"], 400, "{text}");
    assert_eq!(v["corrupted_sessions"], 0, "{text}");
    let count = |k: &str| v[k].as_u64().expect(k);
    // 400 pages hold 2 sessions of 171: the second batch evicts (backs up) the first's pages,
    // and the next turn loads them back.
    assert!(
        count("backed_up_pages") > 0 && count("loaded_pages") > 0,
        "{text}"
    );
    assert_eq!(count("backed_up_bytes"), count("backed_up_pages") * 1576);
    assert_eq!(count("loaded_bytes"), count("loaded_pages") * 1576);
}

/// The trace workload models at most 8 pages per 512-token block: page size 1 (512 pages a
/// block) is refused naming the flag, exit 2.
#[test]
fn trace_at_page_size_1_is_refused_naming_the_flag() {
    let out = Command::new(env!("CARGO_BIN_EXE_kvlayout"))
        .args(["replay", "--page-size-tokens", "1", "--layers", "1"])
        .output()
        .expect("run kvlayout");
    let text = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(
        text.contains(
            "--page-size-tokens: 1 gives 512 pages per 512-token block; at most 8 are modelled"
        ),
        "{text}"
    );
}

/// A page size whose page bytes overflow 64 bits names the flag and the value, exit 2 (trial
/// finding: the synthetic workload said only "model ...: buffers[0] (kv): overflow in layout
/// arithmetic (page payload bytes)").
#[test]
fn a_page_size_that_overflows_names_the_flag_and_value() {
    let out = Command::new(env!("CARGO_BIN_EXE_kvlayout"))
        .args(["replay", "--workload", "synthetic"])
        .args(["--page-size-tokens", "18446744073709551615"])
        .output()
        .expect("run kvlayout");
    let text = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(
        text.contains("--page-size-tokens: 18446744073709551615 gives an invalid pool: buffers[0]"),
        "{text}"
    );
    assert!(text.contains("overflow"), "{text}");
}

/// A page size the model refuses names the flag and the value, exit 2: 0 for any model (the
/// model crate requires at least 1), 64 for DeepSeek-V4 (SGLang's pool asserts 256-token
/// pages, deepseek_v4 model_runner_kv_cache_mixin.py). Before, the message named the model's
/// field `page_size_tokens` and, for V4, told the user to pass `--page-size 256` (describe's
/// flag, not replay's).
#[test]
fn a_page_size_the_model_refuses_names_the_flag() {
    for (model, size, want) in [
        (
            "deepseek-v3.2-exp",
            "0",
            "--page-size-tokens: must be at least 1, got 0",
        ),
        (
            "deepseek-v4-flash",
            "64",
            "--page-size-tokens: 64: SGLang's DeepSeek-V4 pool",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_kvlayout"))
            .args(["replay", "--model", model, "--page-size-tokens", size])
            .output()
            .expect("run kvlayout");
        let text = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{text}");
        assert!(text.contains(want), "{text}");
        assert!(!text.contains("--page-size "), "{text}");
    }
}

/// `kvlayout replay --workload synthetic` on llama-3.1-8b at one token a page, 2 simulated
/// layers, with `args`: exit code and stderr.
fn replay_llama_page_size_1(args: &[&str]) -> (i32, String) {
    let mut all = vec![
        "replay",
        "--model",
        "llama-3.1-8b",
        "--workload",
        "synthetic",
    ];
    all.extend(["--page-size-tokens", "1", "--layers", "2"]);
    all.extend(args);
    kvlayout_stderr(&all)
}

/// `kvlayout ARGS`: its exit code and what it wrote to stderr.
fn kvlayout_stderr(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kvlayout"))
        .args(args)
        .output()
        .expect("run kvlayout");
    let text = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.code().expect("exit code"), text)
}

/// Trial finding: `--sessions 18446744073709551615` panicked (`capacity overflow`, exit 101)
/// and `--sessions 1000000000` aborted allocating 72 GB (exit 134). A session owns 3 turns x
/// (48 + 8) = 168 one-token pages past its group's prefix; the 8 groups share 8 x 3 = 24
/// prefix pages; the pools hold 8192 + 512 (the default host pages) = 8704.
#[test]
fn more_sessions_than_the_pools_hold_name_sessions() {
    for (sessions, needed_pages) in [
        ("1000000000", "168000000024"),
        ("18446744073709551615", "3099053004383204671344"),
    ] {
        let (code, text) =
            replay_llama_page_size_1(&["--device-pages", "8192", "--sessions", sessions]);
        assert_eq!(code, 2, "{text}");
        assert_eq!(
            text,
            format!(
                "error: workload: --sessions: {sessions} sessions of 168 pages each (plus 24 \
                 shared prefix pages) need {needed_pages} pages, more than the device and host \
                 pools' 8192 + 512 = 8704 pages (this replay does not evict host pages)\n"
            )
        );
    }
}

/// Trial finding: pool errors on the page counts and the host layout did not name the flag
/// (`pool: geometry: pages: must be at least 1, got 0`). llama-3.1-8b's KV token is 8 heads x
/// 128 x (K + V) x 2 B = 4096 B, a page at one token; the overflow is checked over the
/// model's 32 layers, the allocation over the 2 simulated ones (10^12 x 4096 x 2 B).
#[test]
fn page_counts_the_pools_refuse_name_their_flag_and_value() {
    let max = "18446744073709551615";
    for (args, want) in [
        (
            ["--device-pages", "8192", "--host-pages", "0"],
            "error: workload: --host-pages: 0 pages: host pool geometry: pages: must be at \
             least 1, got 0"
                .to_string(),
        ),
        (
            ["--device-pages", "8192", "--host-pages", max],
            format!(
                "error: workload: --host-pages: {max} pages: host pool geometry: buffers[0] \
                 (kv): overflow: 4096 B per page x 32 layers x {max} pages does not fit in 64 \
                 bits"
            ),
        ),
        (
            ["--device-pages", max, "--host-pages", "512"],
            format!(
                "error: workload: --device-pages: {max} pages: model \"llama-3.1-8b\": \
                 buffers[0] (kv): overflow: 4096 B per page x 32 layers x {max} pages does \
                 not fit in 64 bits"
            ),
        ),
        (
            ["--device-pages", "1000000000000", "--host-pages", "512"],
            "error: workload: --device-pages: 1000000000000 pages x 2 simulated layers: pool: \
             backend: cannot allocate 8192000000000000 bytes of device memory"
                .to_string(),
        ),
        (
            ["--device-pages", "8192", "--host-pages", "1000000000000"],
            "error: workload: --host-pages: 1000000000000 pages x 2 simulated layers: pool: \
             backend: cannot allocate 8192000000000000 bytes of host memory"
                .to_string(),
        ),
    ] {
        let (code, text) = replay_llama_page_size_1(&args);
        assert_eq!(code, 2, "{args:?}: {text}");
        assert!(text.starts_with(&want), "{args:?}: {text}");
    }
}

/// Trial finding: `page_head` over DeepSeek-V3.2's MLA latent (one 512-wide section, no head
/// axis) said `pool: geometry: memory_layout: ...` without naming `--host-layout`.
#[test]
fn a_host_layout_the_model_cannot_take_names_the_flag() {
    let (code, text) = kvlayout_stderr(&[
        "replay",
        "--model",
        "deepseek-v3.2-exp",
        "--workload",
        "synthetic",
        "--layers",
        "2",
        "--host-layout",
        "page_head",
    ]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.starts_with(
            "error: workload: --host-layout: page_head: host pool geometry: memory_layout: \
             page_head needs every section of buffers[0] (kv) shaped [heads, ...]"
        ),
        "{text}"
    );
    assert!(
        text.contains("sections[0] (nope) has shape [512]"),
        "{text}"
    );
}

/// Trial finding: with `--device-pages` left out, the synthetic error did not say that 128 is
/// the workload's default (the trace's says where its default came from). A session at one
/// token a page is 3 prefix + 3 x (48 + 8) = 171 tokens, 171 pages.
#[test]
fn a_default_device_page_count_says_it_is_the_default() {
    let (code, text) = replay_llama_page_size_1(&[]);
    assert_eq!(code, 2, "{text}");
    assert_eq!(
        text,
        "error: workload: --device-pages: 128 pages cannot hold one session of 171 tokens \
         (171 pages) (--device-pages not given: the synthetic workload's default is 128 pages)\n"
    );
    // Given, the same count is not called a default.
    let (code, text) = replay_llama_page_size_1(&["--device-pages", "128"]);
    assert_eq!(code, 2, "{text}");
    assert!(!text.contains("not given"), "{text}");
}

/// Trial finding: on a model without an indexer a huge `--top-k` panicked (`capacity
/// overflow`) or aborted allocating the sample, on both workloads. Synthetic: the sample is
/// bounded by the tokens before the first decoded one (at one token a page: 3 prefix + 48
/// prompt = 51); trace: by 2,048 (DeepSeek-V3.2's index_topk).
#[test]
fn a_top_k_past_what_is_sampled_names_the_flag_on_models_without_an_indexer() {
    let (code, text) = replay_llama_page_size_1(&[
        "--device-pages",
        "8192",
        "--host-pages",
        "65536",
        "--top-k",
        "18446744073709551615",
    ]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.starts_with(
            "error: workload: --top-k: 18446744073709551615 is more than the 51 tokens sampled \
             from (no indexer) at the first decode step (3 prefix + 48 prompt tokens)"
        ),
        "{text}"
    );
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../data/synthetic_trace_head100.jsonl"
    );
    let (code, text) = kvlayout_stderr(&[
        "replay",
        "--model",
        "llama-3.1-8b",
        "--trace",
        path,
        "--device-pages",
        "2000",
        "--top-k",
        "2049",
    ]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.starts_with(
            "error: workload: --top-k: 2049 is more than the 2048 tokens sampled per step and \
             layer for a model without an indexer"
        ),
        "{text}"
    );
}
