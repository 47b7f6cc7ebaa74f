//! The per-rank chart of a run recorded by several ranks: above, each rank's loss over the steps
//! as it recorded it (the PyTorch recorder's ranks each their own shard of the batch, so the curves
//! differ by the data; fp8-capture's the global batch's; one that leaves the bundle, or stops
//! early, stands out); below, each rank's step time, where a straggler sits above
//! the rest. Up to [`MAX_LINES`] ranks get a line each; past that the chart draws the minimum,
//! median and maximum over the ranks at each step, and the ranks of the extremes are in the caption.

use super::{DrawError, FONT, LABEL_PX, LEGEND_PX, TICK_PX, TITLE_PX, draw_err, palette, png};
use plotters::prelude::*;
use std::collections::BTreeMap;
use std::path::Path;

/// Ranks drawn one line each; more are drawn as a min / median / max band.
pub const MAX_LINES: usize = 8;

/// One rank's series.
#[derive(Clone, Debug, Default)]
pub struct RankSeries {
    pub rank: u32,
    pub steps: Vec<i64>,
    pub loss: Vec<f64>,
    pub step_ms: Vec<f64>,
}

impl RankSeries {
    /// The median step time over the steps, when any.
    pub fn median_ms(&self) -> Option<f64> {
        let mut v: Vec<f64> = self.step_ms.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        Some(v[v.len() / 2])
    }
}

/// Per step, (min, median, max) of `value` over the ranks that recorded it.
fn band(series: &[RankSeries], value: fn(&RankSeries) -> &[f64]) -> Vec<(i64, f64, f64, f64)> {
    let mut at: BTreeMap<i64, Vec<f64>> = BTreeMap::new();
    for s in series {
        for (st, v) in s.steps.iter().zip(value(s)) {
            if v.is_finite() {
                at.entry(*st).or_default().push(*v);
            }
        }
    }
    at.into_iter()
        .map(|(st, mut v)| {
            v.sort_by(f64::total_cmp);
            (st, v[0], v[v.len() / 2], v[v.len() - 1])
        })
        .collect()
}

fn range(series: &[RankSeries], value: fn(&RankSeries) -> &[f64]) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in series.iter().flat_map(|s| value(s).iter()).filter(|v| v.is_finite()) {
        lo = lo.min(*v);
        hi = hi.max(*v);
    }
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    let pad = ((hi - lo) * 0.05).max(hi.abs() * 1e-3).max(1e-9);
    (lo - pad, hi + pad)
}

/// Draws the chart at `path` ([`super::RANKS_SIZE`]).
pub fn draw(path: &Path, run: &str, series: &[RankSeries]) -> Result<(), DrawError> {
    png(path, super::RANKS_SIZE, |root| {
        let title = format!("{run}: {} ranks", series.len());
        let root = root.titled(&title, (FONT, TITLE_PX, FontStyle::Bold)).map_err(draw_err)?;
        let (top, bottom) = root.split_vertically(super::RANKS_SIZE.1 as i32 * 55 / 100 - 30);
        let (s0, s1) = (
            series.iter().flat_map(|s| s.steps.first()).min().copied().unwrap_or(0),
            series.iter().flat_map(|s| s.steps.last()).max().copied().unwrap_or(1).max(1),
        );
        let panels: [(&plotters::drawing::DrawingArea<BitMapBackend, plotters::coord::Shift>, &str, fn(&RankSeries) -> &[f64]); 2] =
            [(&top, "loss", |s| &s.loss), (&bottom, "step time (ms)", |s| &s.step_ms)];
        for (area, label, value) in panels {
            let (lo, hi) = range(series, value);
            let mut chart = ChartBuilder::on(area)
                .margin(10)
                .margin_right(30)
                .x_label_area_size(40)
                .y_label_area_size(80)
                .build_cartesian_2d(s0 as f64..s1 as f64, lo..hi)
                .map_err(draw_err)?;
            chart
                .configure_mesh()
                .x_desc("step")
                .x_label_formatter(&|x| format!("{}", x.round() as i64))
                .y_desc(label)
                .label_style((FONT, TICK_PX))
                .axis_desc_style((FONT, LABEL_PX))
                .light_line_style(palette::LIGHT_GREY)
                .draw()
                .map_err(draw_err)?;
            if series.len() <= MAX_LINES {
                for (i, s) in series.iter().enumerate() {
                    let colour = palette::run(i);
                    let points = s.steps.iter().zip(value(s)).filter(|(_, v)| v.is_finite()).map(|(st, v)| (*st as f64, *v));
                    chart
                        .draw_series(LineSeries::new(points, colour.stroke_width(2)))
                        .map_err(draw_err)?
                        .label(format!("rank {}", s.rank))
                        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(3)));
                }
            } else {
                let b = band(series, value);
                for (name, pick, colour) in
                    [("min over ranks", 0usize, palette::BLUE), ("median", 1, palette::BLACK), ("max over ranks", 2, palette::VERMILLION)]
                {
                    let points = b.iter().map(move |(st, a, m, z)| (*st as f64, [*a, *m, *z][pick]));
                    chart
                        .draw_series(LineSeries::new(points, colour.stroke_width(2)))
                        .map_err(draw_err)?
                        .label(name)
                        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(3)));
                }
            }
            chart
                .configure_series_labels()
                .label_font((FONT, LEGEND_PX))
                .background_style(WHITE.mix(0.85))
                .border_style(palette::GREY)
                .position(SeriesLabelPosition::UpperRight)
                .draw()
                .map_err(draw_err)?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_band_takes_min_median_max_per_step_over_the_ranks_that_recorded_it() {
        let s = |rank, loss: Vec<f64>| RankSeries { rank, steps: (1..=loss.len() as i64).collect(), step_ms: vec![1.0; loss.len()], loss };
        let series = [s(0, vec![3.0, 2.0]), s(1, vec![1.0, f64::NAN]), s(2, vec![2.0, 4.0])];
        assert_eq!(band(&series, |s| &s.loss), [(1, 1.0, 2.0, 3.0), (2, 2.0, 4.0, 4.0)]);
        assert_eq!(series[0].median_ms(), Some(1.0));
    }
}
