//! amax and scale over time for the GEMMs `locate` ranks highest: one row per GEMM; on the left,
//! each operand's amax per step (solid) against the amax its scale was computed from (dashed:
//! with delayed scaling, the history's reduction, which lags a sudden rise); on the right, the
//! scale (log axes both). A vertical dotted line marks the step the GEMM first crossed the
//! threshold.

use super::{DrawError, FONT, LABEL_PX, LEGEND_PX, TICK_PX, TITLE_PX, draw_err, palette, png};
use plotters::coord::Shift;
use plotters::coord::types::RangedCoordf64;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use std::path::Path;

/// One operand's series, aligned on `steps`.
#[derive(Clone, Debug)]
pub struct Operand {
    pub role: String,
    /// `e4m3` / `e5m2` / `bf16`.
    pub format: String,
    pub steps: Vec<i64>,
    pub amax: Vec<f64>,
    pub amax_used: Vec<f64>,
    pub scale: Vec<f64>,
}

/// One GEMM's row.
#[derive(Clone, Debug)]
pub struct GemmSeries {
    /// `layers.1.fc2.dgrad`
    pub name: String,
    /// 1-based rank in `locate`.
    pub rank: usize,
    pub first_crossed: Option<i64>,
    pub operands: Vec<Operand>,
}

fn log_range(vals: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = vals.filter(|v| v.is_finite() && *v > 0.0).fold((f64::INFINITY, 0.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if !(lo.is_finite() && hi > 0.0) {
        return (0.1, 10.0);
    }
    // At least one decade, padded by a quarter decade.
    let (mut lo, mut hi) = (lo / 10f64.powf(0.25), hi * 10f64.powf(0.25));
    if hi / lo < 10.0 {
        let mid = (lo * hi).sqrt();
        lo = mid / 10f64.sqrt();
        hi = mid * 10f64.sqrt();
    }
    (lo, hi)
}

/// Draws up to three GEMMs at `path` ([`super::AMAX_SIZE`]).
pub fn draw(path: &Path, run: &str, gemms: &[GemmSeries]) -> Result<(), DrawError> {
    png(path, super::AMAX_SIZE, |root| {
        let title = format!("{run}: amax against the amax the scale was computed from, for the top GEMMs of locate");
        let root = root.titled(&title, (FONT, TITLE_PX - 4, FontStyle::Bold)).map_err(draw_err)?;
        let rows = root.split_evenly((3, 1));
        for (g, area) in gemms.iter().take(3).zip(rows.iter()) {
            let (w, _) = area.dim_in_pixel();
            let (plots, legend) = area.split_horizontally(w - 250);
            let (l, r) = plots.split_horizontally((58).percent_width());
            draw_amax(&l, g)?;
            draw_scale(&r, g)?;
            draw_legend(&legend, g)?;
        }
        Ok(())
    })
}

fn step_range(g: &GemmSeries) -> std::ops::Range<f64> {
    let lo = g.operands.iter().flat_map(|o| o.steps.first().copied()).min().unwrap_or(0);
    let hi = g.operands.iter().flat_map(|o| o.steps.last().copied()).max().unwrap_or(1).max(lo + 1);
    lo as f64..hi as f64
}

fn positive(steps: &[i64], v: &[f64]) -> Vec<(f64, f64)> {
    steps.iter().zip(v).filter(|(_, y)| y.is_finite() && **y > 0.0).map(|(&s, &y)| (s as f64, y)).collect()
}

/// A chart of training steps against a log y axis over `lo..hi`, its mesh drawn.
fn log_chart<'a, 'b>(
    area: &'a DrawingArea<BitMapBackend<'b>, Shift>,
    caption: &str,
    margin_right: u32,
    steps: std::ops::Range<f64>,
    (lo, hi): (f64, f64),
    y_desc: &str,
) -> Result<ChartContext<'a, BitMapBackend<'b>, Cartesian2d<RangedCoordf64, LogCoord<f64>>>, DrawError> {
    let mut chart = ChartBuilder::on(area)
        .margin(8)
        .margin_right(margin_right)
        .caption(caption, (FONT, LABEL_PX - 2))
        .x_label_area_size(40)
        .y_label_area_size(72)
        .build_cartesian_2d(steps, (lo..hi).log_scale())
        .map_err(draw_err)?;
    chart
        .configure_mesh()
        .light_line_style(palette::LIGHT_GREY.mix(0.5))
        .x_desc("training step")
        .y_desc(y_desc)
        .axis_desc_style((FONT, TICK_PX))
        .label_style((FONT, TICK_PX))
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| super::short(*v))
        .draw()
        .map_err(draw_err)?;
    Ok(chart)
}

fn draw_amax(area: &DrawingArea<BitMapBackend, Shift>, g: &GemmSeries) -> Result<(), DrawError> {
    let (lo, hi) = log_range(g.operands.iter().flat_map(|o| o.amax.iter().chain(&o.amax_used).copied()));
    let mut chart = log_chart(area, &format!("#{} {}: amax", g.rank, g.name), 8, step_range(g), (lo, hi), "max |x| (log)")?;
    for o in &g.operands {
        let col = palette::role(&o.role);
        chart
            .draw_series(LineSeries::new(positive(&o.steps, &o.amax), col.stroke_width(2)))
            .map_err(draw_err)?
            .label(format!("{} amax ({})", o.role, o.format))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 22, y)], col.stroke_width(2)));
        chart
            .draw_series(DashedLineSeries::new(positive(&o.steps, &o.amax_used), 7, 4, col.stroke_width(2)))
            .map_err(draw_err)?
            .label(format!("{} amax used by the scale", o.role))
            .legend(move |(x, y)| DashedPathElement::new(vec![(x, y), (x + 22, y)], 5, 3, col.stroke_width(2)));
    }
    if let Some(s) = g.first_crossed {
        chart
            .draw_series(DashedLineSeries::new(vec![(s as f64, lo), (s as f64, hi)], 2, 4, palette::BLACK.stroke_width(1)))
            .map_err(draw_err)?
            .label(format!("first crossed (step {s})"))
            .legend(|(x, y)| DashedPathElement::new(vec![(x, y), (x + 22, y)], 2, 3, palette::BLACK.stroke_width(1)));
    }
    Ok(())
}

fn draw_scale(area: &DrawingArea<BitMapBackend, Shift>, g: &GemmSeries) -> Result<(), DrawError> {
    let (lo, hi) = log_range(g.operands.iter().flat_map(|o| o.scale.iter().copied()));
    let mut chart = log_chart(area, "scale (multiplier before the cast)", 16, step_range(g), (lo, hi), "scale (log)")?;
    if let Some(s) = g.first_crossed {
        chart.draw_series(DashedLineSeries::new(vec![(s as f64, lo), (s as f64, hi)], 2, 4, palette::BLACK.stroke_width(1))).map_err(draw_err)?;
    }
    for o in &g.operands {
        let col = palette::role(&o.role);
        chart
            .draw_series(LineSeries::new(positive(&o.steps, &o.scale), col.stroke_width(2)))
            .map_err(draw_err)?
            .label(o.role.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 22, y)], col.stroke_width(2)));
    }
    Ok(())
}

/// The legend of one row, beside its two plots: colour = operand, solid = amax (and scale),
/// dashed = the amax the scale was computed from.
fn draw_legend(area: &DrawingArea<BitMapBackend, Shift>, g: &GemmSeries) -> Result<(), DrawError> {
    let font = (FONT, LEGEND_PX - 2).into_font();
    let mut y = 40;
    let entry = |y: i32, line: &dyn Fn(i32) -> Result<(), DrawError>, text: String| -> Result<(), DrawError> {
        line(y)?;
        area.draw(&Text::new(text, (40, y - 8), font.clone())).map_err(draw_err)?;
        Ok(())
    };
    for o in &g.operands {
        let col = palette::role(&o.role);
        entry(
            y,
            &|y| area.draw(&PathElement::new(vec![(6, y), (32, y)], col.stroke_width(2))).map_err(draw_err),
            format!("{} ({}): amax, scale", o.role, o.format),
        )?;
        y += 24;
        entry(
            y,
            &|y| area.draw(&DashedPathElement::new(vec![(6, y), (32, y)], 5, 3, col.stroke_width(2))).map_err(draw_err),
            format!("{}: amax used by scale", o.role),
        )?;
        y += 30;
    }
    if let Some(s) = g.first_crossed {
        entry(
            y,
            &|y| area.draw(&DashedPathElement::new(vec![(6, y), (32, y)], 2, 3, palette::BLACK.stroke_width(1))).map_err(draw_err),
            format!("first crossed: step {s}"),
        )?;
    }
    Ok(())
}
