//! `kvlayout describe` (owned by the pools work; being written).

/// Arguments of `kvlayout describe`.
#[derive(clap::Args)]
pub struct DescribeArgs {}

/// Runs the subcommand.
pub fn run(_args: &DescribeArgs) -> u8 {
    eprintln!("kvlayout describe: not built yet");
    2
}
