//! The loss chart: every run's loss curve over the baseline's (black), with each run's spike
//! peaks (triangles), drift onset (dashed vertical line) and first non-finite loss (cross at the
//! top edge, dotted vertical line) marked; below it, the relative gap of each run to the baseline
//! in percent (raw, thin; EMA-smoothed as the drift detector sees it, thick) with the ± drift
//! threshold. Without a baseline the loss panel takes the whole chart.

use super::{DrawError, FONT, LABEL_PX, LEGEND_PX, TICK_PX, TITLE_PX, draw_err, palette, png};
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use std::path::Path;

/// One curve.
#[derive(Clone, Debug)]
pub struct Curve {
    pub name: String,
    pub steps: Vec<i64>,
    pub loss: Vec<f64>,
}

/// A run's curve with what the detectors found on it.
#[derive(Clone, Debug)]
pub struct RunCurve {
    pub curve: Curve,
    /// (step, loss) at the peak of each spike that counts: against the baseline when there is one.
    pub spike_peaks: Vec<(i64, f64)>,
    pub drift_first: Option<i64>,
    pub first_nonfinite: Option<i64>,
    /// (step, raw gap, smoothed gap) at the common finite steps, when there is a baseline.
    pub gap: Vec<(i64, f64, f64)>,
}

/// Everything the chart shows.
#[derive(Clone, Debug)]
pub struct LossChart {
    pub baseline: Option<Curve>,
    pub runs: Vec<RunCurve>,
    /// The drift threshold (a fraction), drawn as ± lines on the gap panel.
    pub drift_threshold: f64,
}

fn finite_range(vals: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    vals.filter(|v| v.is_finite()).fold(None, |acc, v| match acc {
        None => Some((v, v)),
        Some((lo, hi)) => Some((lo.min(v), hi.max(v))),
    })
}

fn padded(lo: f64, hi: f64, frac: f64) -> (f64, f64) {
    let span = (hi - lo).abs().max(1e-9 + 1e-6 * hi.abs());
    (lo - frac * span, hi + frac * span)
}

/// Draws the chart at `path` ([`super::LOSS_SIZE`]).
pub fn draw(path: &Path, c: &LossChart) -> Result<(), DrawError> {
    png(path, super::LOSS_SIZE, |root| {
        let title = match &c.baseline {
            Some(b) => format!("Training loss against baseline '{}'", b.name),
            None => "Training loss".to_string(),
        };
        let root = root.titled(&title, (FONT, TITLE_PX, FontStyle::Bold)).map_err(draw_err)?;
        let (top, bottom) = if c.baseline.is_some() {
            let (t, b) = root.split_vertically((62).percent_height());
            (t, Some(b))
        } else {
            (root.clone(), None)
        };
        let all = c.baseline.iter().chain(c.runs.iter().map(|r| &r.curve));
        let max_step = all.clone().flat_map(|cv| cv.steps.iter().copied()).max().unwrap_or(1).max(1);
        let min_step = all.clone().flat_map(|cv| cv.steps.iter().copied()).min().unwrap_or(0).min(max_step - 1);
        let (lo, hi) = finite_range(all.clone().flat_map(|cv| cv.loss.iter().copied())).unwrap_or((0.0, 1.0));
        let (lo, hi) = padded(lo, hi, 0.06);
        let x_range = min_step as f64..max_step as f64;

        let mut chart = ChartBuilder::on(&top)
            .margin(12)
            .margin_right(24)
            .x_label_area_size(if bottom.is_some() { 30 } else { 50 })
            .y_label_area_size(70)
            .build_cartesian_2d(x_range.clone(), lo..hi)
            .map_err(draw_err)?;
        let mut mesh = chart.configure_mesh();
        mesh.light_line_style(palette::LIGHT_GREY.mix(0.6))
            .y_desc("loss (nats / token)")
            .axis_desc_style((FONT, LABEL_PX))
            .label_style((FONT, TICK_PX))
            .y_label_formatter(&|v| format!("{v:.2}"))
            .x_label_formatter(&|v| format!("{v:.0}"));
        if bottom.is_none() {
            mesh.x_desc("training step");
        }
        mesh.draw().map_err(draw_err)?;

        for (i, r) in c.runs.iter().enumerate() {
            let col = palette::run(i);
            // Draw the curve in segments between non-finite losses, so a NaN breaks the line.
            let mut first = true;
            for seg in segments(&r.curve) {
                let s = chart.draw_series(LineSeries::new(seg, col.stroke_width(3))).map_err(draw_err)?;
                if first {
                    s.label(r.curve.name.clone()).legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], col.stroke_width(2)));
                    first = false;
                }
            }
        }
        if let Some(b) = &c.baseline {
            chart
                .draw_series(LineSeries::new(points(b), palette::BLACK.stroke_width(1)))
                .map_err(draw_err)?
                .label(format!("{} (baseline)", b.name))
                .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], palette::BLACK.stroke_width(1)));
        }
        // Markers, each kind in the legend once.
        let mut legend_spike = false;
        let mut legend_drift = false;
        let mut legend_nan = false;
        for (i, r) in c.runs.iter().enumerate() {
            let col = palette::run(i);
            for &(peak, peak_loss) in &r.spike_peaks {
                let s = chart.draw_series(std::iter::once(TriangleMarker::new((peak as f64, peak_loss.min(hi)), 9, col.filled()))).map_err(draw_err)?;
                if !legend_spike {
                    s.label("loss spike (peak)").legend(|(x, y)| TriangleMarker::new((x + 12, y), 7, palette::BLACK.filled()));
                    legend_spike = true;
                }
            }
            if let Some(d) = r.drift_first {
                chart
                    .draw_series(std::iter::once(Text::new(
                        format!("drift from step {d}"),
                        (d as f64 + 0.01 * (max_step - min_step) as f64, lo + 0.04 * (hi - lo)),
                        (FONT, LEGEND_PX).into_font().color(&col),
                    )))
                    .map_err(draw_err)?;
                let s = chart.draw_series(DashedLineSeries::new(vec![(d as f64, lo), (d as f64, hi)], 8, 5, col.stroke_width(2))).map_err(draw_err)?;
                if !legend_drift {
                    s.label("drift onset").legend(|(x, y)| DashedPathElement::new(vec![(x, y), (x + 24, y)], 5, 3, palette::BLACK.stroke_width(2)));
                    legend_drift = true;
                }
            }
            if let Some(n) = r.first_nonfinite {
                let x = n as f64;
                chart.draw_series(DashedLineSeries::new(vec![(x, lo), (x, hi)], 2, 4, col.stroke_width(2))).map_err(draw_err)?;
                let y_mark = hi - 0.04 * (hi - lo);
                let s = chart.draw_series(std::iter::once(Cross::new((x, y_mark), 8, col.stroke_width(3)))).map_err(draw_err)?;
                if !legend_nan {
                    s.label("first non-finite loss").legend(|(x, y)| Cross::new((x + 12, y), 6, palette::BLACK.stroke_width(3)));
                    legend_nan = true;
                }
                chart
                    .draw_series(std::iter::once(Text::new(
                        format!("NaN/Inf at step {n}"),
                        (x + 0.01 * (max_step - min_step) as f64, y_mark),
                        (FONT, LEGEND_PX).into_font().color(&col),
                    )))
                    .map_err(draw_err)?;
            }
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.9))
            .border_style(palette::GREY)
            .label_font((FONT, LEGEND_PX))
            .draw()
            .map_err(draw_err)?;

        if let Some(bottom) = bottom {
            draw_gap(&bottom, c, x_range)?;
        }
        Ok(())
    })
}

fn draw_gap(area: &DrawingArea<BitMapBackend, plotters::coord::Shift>, c: &LossChart, x_range: std::ops::Range<f64>) -> Result<(), DrawError> {
    let thr = 100.0 * c.drift_threshold;
    let (glo, ghi) = finite_range(c.runs.iter().flat_map(|r| r.gap.iter().flat_map(|g| [100.0 * g.1, 100.0 * g.2]))).unwrap_or((-thr, thr));
    let (glo, ghi) = padded(glo.min(-1.5 * thr), ghi.max(1.5 * thr), 0.06);
    let mut chart = ChartBuilder::on(area)
        .margin(12)
        .margin_right(24)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .caption("Relative gap to the baseline, (run − baseline) / baseline", (FONT, LABEL_PX))
        .build_cartesian_2d(x_range.clone(), glo..ghi)
        .map_err(draw_err)?;
    chart
        .configure_mesh()
        .light_line_style(palette::LIGHT_GREY.mix(0.6))
        .x_desc("training step")
        .y_desc("gap (%)")
        .axis_desc_style((FONT, LABEL_PX))
        .label_style((FONT, TICK_PX))
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| format!("{v:+.1}"))
        .y_labels(6)
        .draw()
        .map_err(draw_err)?;
    chart.draw_series(LineSeries::new(vec![(x_range.start, 0.0), (x_range.end, 0.0)], palette::BLACK.stroke_width(1))).map_err(draw_err)?;
    for sign in [-1.0, 1.0] {
        let s = chart
            .draw_series(DashedLineSeries::new(vec![(x_range.start, sign * thr), (x_range.end, sign * thr)], 6, 6, palette::GREY.stroke_width(1)))
            .map_err(draw_err)?;
        if sign > 0.0 {
            s.label(format!("drift threshold ±{thr}%")).legend(|(x, y)| DashedPathElement::new(vec![(x, y), (x + 24, y)], 4, 3, palette::GREY.stroke_width(1)));
        }
    }
    for (i, r) in c.runs.iter().enumerate() {
        let col = palette::run(i);
        chart.draw_series(LineSeries::new(r.gap.iter().map(|g| (g.0 as f64, 100.0 * g.1)), col.mix(0.35).stroke_width(1))).map_err(draw_err)?;
        chart
            .draw_series(LineSeries::new(r.gap.iter().map(|g| (g.0 as f64, 100.0 * g.2)), col.stroke_width(3)))
            .map_err(draw_err)?
            .label(format!("{} (thick: EMA as drift sees it; thin: raw)", r.curve.name))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], col.stroke_width(3)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.9))
        .border_style(palette::GREY)
        .label_font((FONT, LEGEND_PX))
        .draw()
        .map_err(draw_err)?;
    Ok(())
}

fn points(c: &Curve) -> Vec<(f64, f64)> {
    c.steps.iter().zip(&c.loss).filter(|(_, l)| l.is_finite()).map(|(&s, &l)| (s as f64, l)).collect()
}

/// The curve split at non-finite losses.
fn segments(c: &Curve) -> Vec<Vec<(f64, f64)>> {
    let mut out = vec![Vec::new()];
    for (&s, &l) in c.steps.iter().zip(&c.loss) {
        if l.is_finite() {
            if let Some(v) = out.last_mut() {
                v.push((s as f64, l))
            }
        } else if out.last().is_some_and(|v| !v.is_empty()) {
            out.push(Vec::new());
        }
    }
    out.retain(|v| !v.is_empty());
    out
}
