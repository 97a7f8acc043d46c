//! `kvlayout replay` on a trace (the default workload): runs [`kvlayout_replay::trace_replay`]
//! and prints its report.

use kvlayout_core::MemoryLayout;
use kvlayout_models::{Model, PoolOptions};
use kvlayout_replay::report::TraceReport;
use kvlayout_replay::schedule::WritePolicy;
use kvlayout_replay::trace_replay::{self, TraceHost, TraceInput, TraceOutcome};

use super::{
    Pools, ReplayArgs, host_source, json_with_backend, print_refusal, progress_bar, thousands,
};

pub(super) fn run_trace(args: &ReplayArgs, model: Model, pool: PoolOptions, pools: Pools) -> u8 {
    let host = match &args.host_geometry {
        Some(_) => match host_source(args, 0) {
            Ok(h) => TraceHost::Foreign(h),
            Err(e) => {
                eprintln!("error: {e}");
                return 2;
            }
        },
        None => TraceHost::Mirror {
            pages: args.host_pages,
            memory_layout: args.host_layout.unwrap_or(MemoryLayout::LayerFirst),
        },
    };
    let (trace, trace_name, trace_bytes): (Box<dyn std::io::BufRead>, String, u64) = match &args
        .trace
    {
        None => (
            Box::new(trace_replay::CONVERSATION_TRACE.as_bytes()),
            "embedded: Mooncake FAST'25 conversation trace (data/conversation_trace.jsonl)".into(),
            trace_replay::CONVERSATION_TRACE.len() as u64,
        ),
        Some(path) if path.as_os_str() == "-" => (
            Box::new(std::io::BufReader::new(std::io::stdin())),
            "stdin".into(),
            0,
        ),
        Some(path) => match std::fs::File::open(path) {
            Ok(f) => {
                let len = f.metadata().map(|m| m.len()).unwrap_or(0);
                (
                    Box::new(std::io::BufReader::new(f)),
                    path.display().to_string(),
                    len,
                )
            }
            Err(e) => {
                eprintln!("error: --trace {}: {e}", path.display());
                return 2;
            }
        },
    };
    // The plot file is opened before the run: an unwritable path is refused now, not after it.
    // A file created here is removed again when no report comes (an error or a refusal).
    let plot_created = match &args.plot {
        Some(path) => match open_plot(path) {
            Ok(created) => created,
            Err(e) => {
                eprintln!("error: --plot {}: {e}", path.display());
                return 2;
            }
        },
        None => false,
    };
    let remove_plot = || {
        if let (Some(path), true) = (&args.plot, plot_created) {
            let _ = std::fs::remove_file(path);
        }
    };
    let input = TraceInput {
        model,
        pool,
        device_pages: args.device_pages,
        host,
        verify: !args.no_verify,
        layers: args.layers.unwrap_or(1),
        buffers: args.buffers.clone(),
        top_k: args.top_k,
        indexer_heads: 8,
        seed: args.seed,
        write_policy: args.write_policy.unwrap_or(WritePolicy::WriteBack),
        prefill_tokens_per_s: args.prefill_tokens_per_s.unwrap_or(20_000),
        decode_ms_per_token: args.decode_ms_per_token.unwrap_or(20),
        trace_name,
        checksum: args.checksum,
    };
    let bar = if trace_bytes == 0 {
        // Length unknown (stdin): bytes read so far.
        progress_bar(args, 0, "{spinner} {bytes} of the trace read {elapsed}")
    } else {
        progress_bar(
            args,
            trace_bytes,
            "{bar:40} {percent}% of the trace {elapsed}",
        )
    };
    if let Some(b) = &bar {
        // Drawn only once the run has taken a second.
        b.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let started = std::time::Instant::now();
    let (backend, backend_text) = (pools.name(), pools.describe());
    let outcome = pools.run_trace(&input, trace, &mut |done| {
        if let Some(b) = &bar {
            if started.elapsed().as_secs() >= 1 && b.is_hidden() {
                b.set_draw_target(indicatif::ProgressDrawTarget::stderr());
            }
            b.set_position(done);
        }
    });
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    match outcome {
        Err(e) => {
            remove_plot();
            eprintln!("error: {}", super::error_text(&e));
            2
        }
        Ok(TraceOutcome::Refused(r)) => {
            remove_plot();
            if args.json {
                println!("{}", json_with_backend(&r, backend, args.device));
            } else {
                print_refusal(
                    &r.host_geometry,
                    &r.model,
                    &r.mismatch,
                    "no request ran",
                    &backend_text,
                );
            }
            1
        }
        Ok(TraceOutcome::Completed(r)) => {
            // A drawing that fails after the run loses neither the report nor the exit code:
            // the error goes to stderr after the report.
            let plotted = args
                .plot
                .as_ref()
                .map(|path| super::plot::plot_svg(&r, path).map(|()| path));
            if args.json {
                println!("{}", json_with_backend(&r, backend, args.device));
            } else {
                print_trace_report(&r, &backend_text);
                if let Some(Ok(path)) = &plotted {
                    println!("plot: {}", path.display());
                }
            }
            if let Some(Err(e)) = &plotted {
                eprintln!(
                    "error: --plot {e} (the report above stands; the exit code is the run's)"
                );
            }
            // A transfer the shim refused is recomputed (as an engine would), but the run is not
            // clean: exit 1, as a refused pairing.
            if r.corrupted_requests > 0 {
                3
            } else if r.pages.refused_transfers > 0 {
                1
            } else {
                0
            }
        }
    }
}

/// Opens `path` for writing, creating it when it does not exist (true: created here). The
/// contents are left alone: the plot overwrites them after the run.
fn open_plot(path: &std::path::Path) -> std::io::Result<bool> {
    let existed = path.exists();
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    Ok(!existed)
}

fn pct(share: f64) -> String {
    format!("{:.1}%", share * 100.0)
}

fn print_trace_report(r: &TraceReport, backend: &str) {
    println!(
        "kvlayout replay: {} ({}), trace {}",
        r.model,
        r.formats.join(", "),
        r.trace
    );
    println!("  backend: {backend}");
    println!(
        "  device pool {} pages of {} tokens ({}); host pool {} pages, {} ({}; {}); pairing {}",
        thousands(r.device_pages),
        r.page_size_tokens,
        r.device_pages_source,
        thousands(r.host_pages),
        r.host_memory_layout,
        r.host_geometry,
        r.host_pages_source,
        r.pairing
    );
    if !r.mismatch.is_empty() {
        println!("  geometry NOT checked; device and host differ:");
        for m in &r.mismatch {
            println!("    {m}");
        }
    }
    println!(
        "  fingerprints: device {}, host {}",
        r.device_fingerprint, r.host_fingerprint
    );
    println!("  sampled: {}", r.sampled);
    println!(
        "  model of SGLang HiCache: {} policy, LRU leaf eviction, loads before prefill; {} prefill tokens/s and {} ms per decoded token per request",
        match r.write_policy {
            WritePolicy::WriteBack => "write_back",
            WritePolicy::WriteThrough => "write_through",
        },
        thousands(r.prefill_tokens_per_s),
        r.decode_ms_per_token
    );
    println!(
        "requests {}: with host hits {} ({}), corrupted {} ({})",
        thousands(r.requests),
        thousands(r.requests_with_host_hits),
        pct(r.host_hit_share),
        thousands(r.corrupted_requests),
        pct(r.corrupted_share)
    );
    println!(
        "prompt tokens {}: from device {}, from host {}, recomputed {}",
        thousands(r.prompt_tokens),
        thousands(r.device_tokens),
        thousands(r.host_tokens),
        thousands(r.recomputed_tokens)
    );
    println!(
        "pages: {} device hits, {} computed, {} backed up ({} B), {} loaded ({} B), {} dropped",
        thousands(r.pages.device_hit_pages),
        thousands(r.pages.computed_pages),
        thousands(r.pages.backed_up_pages),
        thousands(r.backed_up_bytes),
        thousands(r.pages.loaded_pages),
        thousands(r.loaded_bytes),
        thousands(r.pages.dropped_pages)
    );
    println!(
        "transfers: {} backups, {} loads, {} refused; {} requests waited for free pages; last request done at {:.1} s",
        thousands(r.backup_transfers),
        thousands(r.load_transfers),
        r.pages.refused_transfers,
        thousands(r.pages.delayed_requests),
        r.end_ms as f64 / 1000.0
    );
    if r.checksum != "off" {
        println!(
            "checksums ({}): {} page payloads verified at load, {} mismatched, in {} loads",
            r.checksum,
            thousands(r.checksummed_pages),
            thousands(r.checksum_mismatches),
            thousands(r.checksum_mismatched_loads)
        );
        if let Some(m) = &r.first_checksum_mismatch {
            println!("  first mismatch: {m}");
        }
    }
    if let Some(why) = &r.first_refusal {
        println!("first refusal: {why}");
    }
}
