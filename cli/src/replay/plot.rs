//! `kvlayout replay --plot FILE.svg`: the per-minute series of a trace replay as an SVG line
//! chart (plotters' SVG backend: text is written as SVG `<text>`, no system font is read). Top
//! panel: requests per minute; bottom panel, on its own scale: requests with host hits and
//! corrupted requests per minute.

use std::path::Path;

use plotters::prelude::*;

use kvlayout_replay::report::{Minute, TraceReport};

type Series = (&'static str, RGBColor, fn(&Minute) -> u64);

/// Draws one panel of `series` over the minutes of `report`.
fn panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    report: &TraceReport,
    caption: &str,
    series: &[Series],
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let minutes = report.per_minute.len().max(1) as u64;
    let top = report
        .per_minute
        .iter()
        .flat_map(|m| series.iter().map(move |(_, _, get)| get(m)))
        .max()
        .unwrap_or(0)
        .max(1);
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(36)
        .y_label_area_size(52)
        .build_cartesian_2d(0u64..minutes, 0u64..top + top / 10 + 1)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("minute of the trace")
        .y_desc("requests per minute")
        .draw()
        .map_err(|e| err(&e))?;
    for &(name, color, get) in series {
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
    Ok(())
}

/// Draws requests, requests with host hits and corrupted requests per minute into `path`.
pub fn plot_svg(report: &TraceReport, path: &Path) -> Result<(), String> {
    let root = SVGBackend::new(path, (960, 640)).into_drawing_area();
    let at = |e: String| format!("{}: {e}", path.display());
    root.fill(&WHITE).map_err(|e| at(e.to_string()))?;
    let (upper, lower) = root.split_vertically(280);
    panel(
        &upper,
        report,
        &format!(
            "{} on {}: {} requests",
            report.model, report.trace, report.requests
        ),
        &[("requests", RGBColor(120, 120, 120), |m| m.requests)],
    )
    .map_err(at)?;
    panel(
        &lower,
        report,
        &format!(
            "{} with host hits, {} corrupted (pairing {})",
            report.requests_with_host_hits, report.corrupted_requests, report.pairing
        ),
        &[
            ("requests with host hits", RGBColor(31, 119, 180), |m| {
                m.requests_with_host_hits
            }),
            ("corrupted requests", RGBColor(214, 39, 40), |m| {
                m.corrupted_requests
            }),
        ],
    )
    .map_err(at)?;
    root.present().map_err(|e| at(e.to_string()))?;
    Ok(())
}
