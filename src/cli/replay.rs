//! `kvlayout replay` (owned by the pools work; being written).

/// Arguments of `kvlayout replay`.
#[derive(clap::Args)]
pub struct ReplayArgs {}

/// Runs the subcommand.
pub fn run(_args: &ReplayArgs) -> u8 {
    eprintln!("kvlayout replay: not built yet");
    2
}
