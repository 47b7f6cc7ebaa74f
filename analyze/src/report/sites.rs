//! Bars of the error each GEMM adds (1 − cosine, at its peak step after delayed scaling's warm-up),
//! `locate`'s top GEMMs of one run in its order (by harm) from the top down, with the threshold 1 − cosine threshold as a dashed line.
//! GEMMs past the threshold are vermillion, the others blue.

use super::{DrawError, FONT, LABEL_PX, TICK_PX, TITLE_PX, draw_err, palette, png};
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use std::path::Path;

/// One bar.
#[derive(Clone, Debug)]
pub struct Bar {
    /// `layers.1.fc2.dgrad`
    pub name: String,
    pub score: f64,
    pub peak_step: i64,
    pub first_crossed: Option<i64>,
}

/// Draws up to 10 bars at `path` ([`super::SITES_SIZE`]).
pub fn draw(path: &Path, run: &str, threshold: f64, bars: &[Bar]) -> Result<(), DrawError> {
    png(path, super::SITES_SIZE, |root| {
        let title = format!("{run}: error each GEMM adds, in order of harm");
        let root = root.titled(&title, (FONT, TITLE_PX - 2, FontStyle::Bold)).map_err(draw_err)?;
        let bars: Vec<&Bar> = bars.iter().take(10).collect();
        let limit = 1.0 - threshold;
        let xmax = bars.iter().map(|b| b.score).filter(|s| s.is_finite()).fold(limit, f64::max) * 1.6;
        let xmin = bars.iter().map(|b| b.score).filter(|s| s.is_finite()).fold(0.0, f64::min) * 1.1;
        let n = bars.len().max(1);
        let names: Vec<String> = bars.iter().map(|b| b.name.clone()).collect();
        let label_w = names.iter().map(|s| s.len()).max().unwrap_or(8) as u32 * 9 + 20;
        let mut chart = ChartBuilder::on(&root)
            .margin(12)
            .margin_right(30)
            .x_label_area_size(50)
            .y_label_area_size(label_w)
            .build_cartesian_2d(xmin..xmax, (0..n as i32 - 1).into_segmented())
            .map_err(draw_err)?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .light_line_style(palette::LIGHT_GREY.mix(0.5))
            .x_desc("error added at the peak step (1 − cosine)")
            .axis_desc_style((FONT, LABEL_PX))
            .label_style((FONT, TICK_PX))
            .x_label_formatter(&|v| super::short(*v))
            .y_labels(n)
            .y_label_formatter(&|v| match v {
                SegmentValue::CenterOf(i) if (*i as usize) < n => names.get(n - 1 - *i as usize).cloned().unwrap_or_default(),
                _ => String::new(),
            })
            .draw()
            .map_err(draw_err)?;
        for (k, b) in bars.iter().enumerate() {
            let y = (n - 1 - k) as i32;
            let (y0, y1) = (SegmentValue::Exact(y), SegmentValue::Exact(y + 1));
            let col = if b.score > limit { palette::VERMILLION } else { palette::BLUE };
            let s = if b.score.is_finite() { b.score } else { xmax };
            chart.draw_series(std::iter::once(Rectangle::new([(0.0, y0), (s, y1)], col.filled()))).map_err(draw_err)?;
            let note = match b.first_crossed {
                Some(c) => format!("{} at step {}, crossed at {c}", super::short(b.score), b.peak_step),
                None => format!("{} at step {}", super::short(b.score), b.peak_step),
            };
            chart
                .draw_series(std::iter::once(Text::new(
                    note,
                    (s.max(0.0) + 0.01 * (xmax - xmin), SegmentValue::CenterOf(y)),
                    TextStyle::from((FONT, TICK_PX).into_font())
                        .pos(plotters::style::text_anchor::Pos::new(plotters::style::text_anchor::HPos::Left, plotters::style::text_anchor::VPos::Center)),
                )))
                .map_err(draw_err)?;
        }
        chart
            .draw_series(DashedLineSeries::new(
                vec![(limit, SegmentValue::Exact(0)), (limit, SegmentValue::Exact(n as i32))],
                6,
                4,
                palette::BLACK.stroke_width(2),
            ))
            .map_err(draw_err)?
            .label(format!("threshold: adds more than {} (cosine < {threshold})", super::short(limit)))
            .legend(|(x, y)| DashedPathElement::new(vec![(x, y), (x + 24, y)], 5, 3, palette::BLACK.stroke_width(2)));
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.9))
            .border_style(palette::GREY)
            .label_font((FONT, TICK_PX))
            .draw()
            .map_err(draw_err)?;
        Ok(())
    })
}
