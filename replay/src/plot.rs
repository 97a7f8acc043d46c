//! `kvlayout replay --plot FILE.svg`: the per-minute series of a trace replay as an SVG line
//! chart (plotters' SVG backend: text is written as SVG `<text>`, no system font is read).

use std::path::Path;

use plotters::prelude::*;

use crate::report::{Minute, TraceReport};

/// Draws requests, requests with host hits and corrupted requests per minute into `path`.
pub fn plot_svg(report: &TraceReport, path: &Path) -> Result<(), String> {
    let minutes = report.per_minute.len().max(1) as u64;
    let top = report
        .per_minute
        .iter()
        .map(|m| m.requests)
        .max()
        .unwrap_or(1)
        .max(1);
    let root = SVGBackend::new(path, (960, 480)).into_drawing_area();
    let err = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let caption = format!(
        "{}: {} requests, {} with host hits, {} corrupted ({})",
        report.model,
        report.requests,
        report.requests_with_host_hits,
        report.corrupted_requests,
        report.pairing
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(0u64..minutes, 0u64..top + top / 10 + 1)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("minute of the trace")
        .y_desc("requests per minute")
        .draw()
        .map_err(|e| err(&e))?;
    type Series = (&'static str, RGBColor, fn(&Minute) -> u64);
    let series: [Series; 3] = [
        ("requests", RGBColor(120, 120, 120), |m| m.requests),
        ("requests with host hits", RGBColor(31, 119, 180), |m| {
            m.requests_with_host_hits
        }),
        ("corrupted requests", RGBColor(214, 39, 40), |m| {
            m.corrupted_requests
        }),
    ];
    for (name, color, get) in series {
        chart
            .draw_series(LineSeries::new(
                report.per_minute.iter().map(|m| (m.minute, get(m))),
                color.stroke_width(2),
            ))
            .map_err(|e| err(&e))?
            .label(name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}
