//! One module per subcommand; each `run` returns the process exit code.

pub mod check;
pub mod describe;
pub mod formats;
pub mod replay;
