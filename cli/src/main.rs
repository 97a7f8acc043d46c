//! The `kvlayout` command line: `formats`, `check`, `describe`, `replay`. One module per
//! subcommand; each `run` returns the process exit code.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod check;
mod describe;
mod formats;
mod replay;

/// KV-cache layouts: list formats, check two geometry files, describe a model's pools, replay a
/// HiCache workload.
#[derive(Parser)]
#[command(name = "kvlayout", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List the built-in token layouts.
    Formats(formats::FormatsArgs),
    /// Check whether two geometry files can exchange pages (exit 0 yes, 1 no, 2 bad input).
    Check(check::CheckArgs),
    /// Print a real model's pool geometry.
    Describe(describe::DescribeArgs),
    /// Replay a HiCache workload and report corrupted sessions.
    Replay(Box<replay::ReplayArgs>),
}

fn main() -> ExitCode {
    restore_sigpipe();
    exit_quietly_on_output_errors();
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Formats(a) => formats::run(&a),
        Command::Check(a) => check::run(&a),
        Command::Describe(a) => describe::run(&a),
        Command::Replay(a) => replay::run(&a),
    };
    ExitCode::from(code)
}

/// `kvlayout describe ... | head` should end quietly like any Unix tool: Rust ignores SIGPIPE,
/// which turns a closed pipe into a `println!` panic; restore the default action.
fn restore_sigpipe() {
    #[cfg(unix)]
    // SAFETY: called first thing in main, before any thread exists; SIG_DFL is a valid action.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// `println!` panics when stdout cannot be written (a full disk, `> /dev/full`); report it as
/// an input/output error (exit 2, one line on stderr) instead of a panic and a backtrace.
/// Every other panic keeps the default report.
fn exit_quietly_on_output_errors() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or_default();
        if message.starts_with("failed printing to stdout") {
            eprintln!("error: {message}");
            std::process::exit(2);
        }
        default(info);
    }));
}
