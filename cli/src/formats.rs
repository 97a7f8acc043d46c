//! `kvlayout formats [--json]`: the built-in token layouts with their sizes and fingerprints.

use kvlayout_core::{LayoutError, arrangement_text, formats};
use serde_json::json;

/// Arguments of `kvlayout formats`.
#[derive(clap::Args)]
pub struct FormatsArgs {
    /// Print a JSON array instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Tokens per page used for the `bytes_per_page_64` column.
const PAGE_64_TOKENS: u64 = 64;

fn row(f: &formats::Format) -> Result<serde_json::Value, LayoutError> {
    let l = &f.layout;
    Ok(json!({
        "name": f.name,
        "bytes_per_token": l.bytes_per_token()?,
        "value_bytes_per_token": l.value_bytes_per_token()?,
        "scale_bytes_per_token": l.scale_bytes_per_token()?,
        "bytes_per_page_64": l.page_stride_bytes(PAGE_64_TOKENS)?,
        "arrangement": arrangement_text(l),
        "fingerprint": format!("{:#018x}", l.fingerprint()),
        "source": f.source,
    }))
}

/// Prints the list.
pub fn run(args: &FormatsArgs) -> u8 {
    let rows: Result<Vec<_>, _> = formats::all().iter().map(row).collect();
    let rows = match rows {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: built-in format invalid: {e}");
            return 2;
        }
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows).expect("json"));
        return 0;
    }
    println!(
        "{:<18} {:>10} {:>10} {:>18}  arrangement",
        "name", "B/token", "B/page64", "fingerprint"
    );
    for r in &rows {
        println!(
            "{:<18} {:>10} {:>10} {:>18}  {}",
            r["name"].as_str().unwrap_or_default(),
            r["bytes_per_token"].as_u64().unwrap_or_default(),
            r["bytes_per_page_64"].as_u64().unwrap_or_default(),
            r["fingerprint"].as_str().unwrap_or_default(),
            r["arrangement"].as_str().unwrap_or_default()
        );
    }
    0
}
