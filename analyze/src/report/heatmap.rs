//! Layer × step heatmaps: one chart per metric and run, one panel per role, rows are the GEMM
//! sites in forward order (`layers.0.qkv` at the top), columns the recorded steps (binned to at
//! most [`MAX_COLUMNS`], each bin showing its worst value), and a labelled colour bar on the right.
//! Cells with NaN/Inf are grey; cells without data stay white.

use super::{ColorMap, DrawError, FONT, LABEL_PX, TICK_PX, TITLE_PX, draw_err, palette, png};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;

/// More columns than this are binned (a laptop-sized panel has about 1000 px).
pub const MAX_COLUMNS: usize = 300;

/// How values map to colours, and how the colour bar is labelled.
#[derive(Clone, Copy, Debug)]
pub enum Scale {
    /// A fraction in [0, 1], linear, viridis; worse is brighter. Bins keep their maximum.
    Fraction,
    /// A cosine similarity, coloured by log10(1 − cosine) from 10⁻⁴ (cosine ≥ 0.9999, dark) to 1
    /// (cosine ≤ 0, bright); cividis. Bins keep their minimum.
    Cosine,
    /// A spread in bits (a standard deviation of log2 values), linear from 0 to 8 (and beyond),
    /// viridis; wider is brighter. Bins keep their maximum.
    Bits,
}

impl Scale {
    /// The position in [0, 1] of a value on the colour bar (None: non-finite).
    pub fn position(self, v: f64) -> Option<f64> {
        if !v.is_finite() {
            return None;
        }
        Some(match self {
            Scale::Fraction => v.clamp(0.0, 1.0),
            Scale::Cosine => (((1.0 - v).max(1e-4).log10() + 4.0) / 4.0).min(1.0),
            Scale::Bits => (v / 8.0).clamp(0.0, 1.0),
        })
    }

    fn map(self) -> ColorMap {
        match self {
            Scale::Fraction | Scale::Bits => ColorMap::Viridis,
            Scale::Cosine => ColorMap::Cividis,
        }
    }

    /// The worse of two values.
    fn worse(self, a: f64, b: f64) -> f64 {
        if !a.is_finite() || !b.is_finite() {
            return f64::NAN;
        }
        match self {
            Scale::Fraction | Scale::Bits => a.max(b),
            Scale::Cosine => a.min(b),
        }
    }

    /// Colour-bar ticks: (position, label).
    fn ticks(self) -> Vec<(f64, String)> {
        match self {
            Scale::Fraction => (0..=5).map(|i| (i as f64 / 5.0, format!("{}%", i * 20))).collect(),
            Scale::Bits => (0..=4).map(|i| (i as f64 / 4.0, if i == 4 { "≥ 8".to_string() } else { format!("{}", 2 * i) })).collect(),
            Scale::Cosine => vec![(0.0, "≥ 0.9999".into()), (0.25, "0.999".into()), (0.5, "0.99".into()), (0.75, "0.9".into()), (1.0, "≤ 0".into())],
        }
    }
}

/// One panel: a role's values per site (rows) and step (columns).
#[derive(Clone, Debug)]
pub struct Grid {
    /// The panel's caption, e.g. `gradient (E5M2)`.
    pub title: String,
    pub rows: Vec<String>,
    pub steps: Vec<i64>,
    /// `cells[row][col]`; None where nothing was recorded.
    pub cells: Vec<Vec<Option<f64>>>,
}

impl Grid {
    /// The grid with at most `MAX_COLUMNS` columns: consecutive steps binned, each bin keeping
    /// the worst value (`scale.worse`) and labelled by its first step.
    pub fn binned(&self, scale: Scale) -> Grid {
        let n = self.steps.len();
        if n <= MAX_COLUMNS {
            return self.clone();
        }
        let per = n.div_ceil(MAX_COLUMNS);
        let steps: Vec<i64> = self.steps.chunks(per).map(|c| c[0]).collect();
        let cells = self.cells.iter().map(|row| row.chunks(per).map(|c| c.iter().flatten().copied().reduce(|a, b| scale.worse(a, b))).collect()).collect();
        Grid { title: self.title.clone(), rows: self.rows.clone(), steps, cells }
    }
}

/// Draws `panels` (1 to 6) at `path` ([`super::HEATMAP_SIZE`]): up to three in one column, more in
/// two.
pub fn draw(path: &Path, title: &str, bar_label: &str, scale: Scale, panels: &[Grid]) -> Result<(), DrawError> {
    png(path, super::HEATMAP_SIZE, |root| {
        let root = root.titled(title, (FONT, TITLE_PX, FontStyle::Bold)).map_err(draw_err)?;
        let (w, _) = root.dim_in_pixel();
        let (main, bar) = root.split_horizontally(w - 150);
        draw_bar(&bar, bar_label, scale)?;
        let (rows, cols) = if panels.len() <= 3 { (3, 1) } else { (3, 2) };
        let areas = main.split_evenly((rows, cols));
        // Fill column by column, so that with two columns the roles read top to bottom.
        for (k, g) in panels.iter().enumerate() {
            let idx = if cols == 1 { k } else { (k % rows) * cols + k / rows };
            if let Some(a) = areas.get(idx) {
                draw_panel(a, g, scale)?;
            }
        }
        Ok(())
    })
}

fn draw_panel(area: &DrawingArea<BitMapBackend, Shift>, g: &Grid, scale: Scale) -> Result<(), DrawError> {
    let g = g.binned(scale);
    let nr = g.rows.len().max(1);
    // Each column spans from midway to its left neighbour to midway to its right one, so the x
    // axis is in steps and uneven dump intervals keep their proportions.
    let st: Vec<f64> = g.steps.iter().map(|&s| s as f64).collect();
    let edge = |i: usize| -> f64 {
        match (i, st.len()) {
            (_, 0) => i as f64,
            (0, 1) => st[0] - 0.5,
            (0, _) => st[0] - 0.5 * (st[1] - st[0]).clamp(0.5, 1.0),
            (i, n) if i >= n => st[n - 1] + 0.5 * if n > 1 { (st[n - 1] - st[n - 2]).clamp(0.5, 1.0) } else { 1.0 },
            (i, _) => 0.5 * (st[i - 1] + st[i]),
        }
    };
    let (x0, x1) = (edge(0), edge(st.len()).max(edge(0) + 1.0));
    let label_w = g.rows.iter().map(|r| r.len()).max().unwrap_or(4) as u32 * 9 + 16;
    let rows = g.rows.clone();
    let mut chart = ChartBuilder::on(area)
        .margin(8)
        .margin_right(16)
        .caption(&g.title, (FONT, LABEL_PX))
        .x_label_area_size(44)
        .y_label_area_size(label_w)
        .build_cartesian_2d(x0..x1, (0..nr as i32 - 1).into_segmented())
        .map_err(draw_err)?;
    chart
        .configure_mesh()
        .disable_mesh()
        .x_desc("training step")
        .axis_desc_style((FONT, TICK_PX))
        .label_style((FONT, TICK_PX))
        .x_labels(8)
        .y_labels(nr)
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| match v {
            // Row 0 is drawn at the top.
            SegmentValue::CenterOf(i) if (*i as usize) < nr => rows.get(nr - 1 - *i as usize).cloned().unwrap_or_default(),
            _ => String::new(),
        })
        .draw()
        .map_err(draw_err)?;
    let map = scale.map();
    let mut cells = Vec::with_capacity(nr * st.len());
    for (r, row) in g.cells.iter().enumerate() {
        let y = (nr - 1 - r) as i32;
        for (c, v) in row.iter().enumerate() {
            let Some(v) = v else { continue };
            let color = match scale.position(*v) {
                Some(t) => map.at(t),
                None => palette::NONFINITE,
            };
            cells.push(Rectangle::new([(edge(c), SegmentValue::Exact(y)), (edge(c + 1), SegmentValue::Exact(y + 1))], color.filled()));
        }
    }
    chart.draw_series(cells).map_err(draw_err)?;
    Ok(())
}

/// The colour bar: the gradient, its tick labels, its title, and the grey of NaN/Inf cells.
fn draw_bar(area: &DrawingArea<BitMapBackend, Shift>, label: &str, scale: Scale) -> Result<(), DrawError> {
    let (_, h) = area.dim_in_pixel();
    let (top, bottom) = (60i32, h as i32 - 140);
    let (x0, x1) = (14i32, 40i32);
    let map = scale.map();
    let n = (bottom - top).max(1);
    for i in 0..n {
        // Bottom of the bar is position 0 (best), top is 1 (worst).
        let t = 1.0 - i as f64 / n as f64;
        area.draw(&Rectangle::new([(x0, top + i), (x1, top + i + 1)], map.at(t).filled())).map_err(draw_err)?;
    }
    area.draw(&Rectangle::new([(x0, top), (x1, bottom)], palette::BLACK.stroke_width(1))).map_err(draw_err)?;
    let style = TextStyle::from((FONT, TICK_PX).into_font())
        .pos(plotters::style::text_anchor::Pos::new(plotters::style::text_anchor::HPos::Left, plotters::style::text_anchor::VPos::Center));
    for (t, text) in scale.ticks() {
        let y = bottom - (t * (bottom - top) as f64).round() as i32;
        area.draw(&PathElement::new(vec![(x1, y), (x1 + 5, y)], palette::BLACK.stroke_width(1))).map_err(draw_err)?;
        area.draw(&Text::new(text, (x1 + 8, y), style.clone())).map_err(draw_err)?;
    }
    // Title of the bar, above it, wrapped on spaces to fit.
    let mut y = 8;
    for line in wrap(label, 16) {
        area.draw(&Text::new(line, (6, y), (FONT, TICK_PX, FontStyle::Bold).into_font())).map_err(draw_err)?;
        y += 18;
    }
    let ny = bottom + 30;
    area.draw(&Rectangle::new([(x0, ny), (x1, ny + 16)], palette::NONFINITE.filled())).map_err(draw_err)?;
    area.draw(&Text::new("NaN / Inf", (x1 + 8, ny + 8), style.clone())).map_err(draw_err)?;
    area.draw(&Rectangle::new([(x0, ny + 26), (x1, ny + 42)], palette::BLACK.stroke_width(1))).map_err(draw_err)?;
    area.draw(&Text::new("not recorded", (x1 + 8, ny + 34), style)).map_err(draw_err)?;
    Ok(())
}

/// Splits `s` into lines of at most `width` characters at spaces.
pub fn wrap(s: &str, width: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for word in s.split_whitespace() {
        match lines.last_mut() {
            Some(l) if l.chars().count() + 1 + word.chars().count() <= width => {
                l.push(' ');
                l.push_str(word);
            }
            _ => lines.push(word.to_string()),
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binning_keeps_the_worst_value_of_each_bin() {
        let n = 2 * MAX_COLUMNS + 1;
        let g = Grid {
            title: "t".into(),
            rows: vec!["a".into()],
            steps: (1..=n as i64).collect(),
            cells: vec![(0..n).map(|i| Some(if i == 5 { 0.9 } else { 0.1 })).collect()],
        };
        let b = g.binned(Scale::Fraction);
        assert!(b.steps.len() <= MAX_COLUMNS);
        assert_eq!(b.cells[0][1], Some(0.9), "step 6 falls in the second bin of three");
        assert_eq!(b.steps[1], 4);
        let c = Grid { cells: vec![(0..n).map(|i| Some(if i == 5 { 0.5 } else { 1.0 })).collect()], ..g };
        assert_eq!(c.binned(Scale::Cosine).cells[0][1], Some(0.5));
    }

    #[test]
    fn cosine_positions_follow_the_error_decades() {
        assert_eq!(Scale::Cosine.position(1.0), Some(0.0));
        assert!((Scale::Cosine.position(0.99).unwrap() - 0.5).abs() < 1e-9);
        assert_eq!(Scale::Cosine.position(-0.5), Some(1.0));
        assert_eq!(Scale::Cosine.position(f64::NAN), None);
    }
}
