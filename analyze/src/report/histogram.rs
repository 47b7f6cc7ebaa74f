//! Histograms of log2|x| of dumped tensors (the high-precision values that were cast), with the
//! FP8 format's representable range brought into x's units through the cast's scale
//! (byte = cast(x · scale), so a format bound b sits at |x| = b / scale): the smallest subnormal,
//! the smallest normal and the largest finite value are drawn as vertical lines, the values that
//! round to zero (|x·scale| ≤ min subnormal / 2) and those that saturate (|x·scale| > max) are
//! shaded, and each panel states their shares of the sample.

use super::{DrawError, FONT, LABEL_PX, LEGEND_PX, TICK_PX, TITLE_PX, draw_err, palette, png};
use fp8scope_schemas::quant::{ElementFormat, FormatSpec};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::path::Path;

/// The representable range of an FP8 format.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fp8Range {
    pub name: &'static str,
    pub min_subnormal: f64,
    pub min_normal: f64,
    pub max: f64,
}

impl Fp8Range {
    /// The range of an element format of the quantization contract (`fp8scope_schemas::quant`).
    pub const fn of_spec(name: &'static str, s: &FormatSpec) -> Fp8Range {
        let min_subnormal = match s.min_subnormal {
            Some(v) => v,
            None => s.min_normal,
        };
        Fp8Range { name, min_subnormal, min_normal: s.min_normal, max: s.max_finite }
    }

    /// The range of a format named as in the tables (`e4m3`, `e5m2`, `e2m1`); None for others (`bf16`).
    pub fn of(format: &str) -> Option<Fp8Range> {
        match ElementFormat::parse(format)? {
            ElementFormat::E4M3 => Some(E4M3),
            ElementFormat::E5M2 => Some(E5M2),
            ElementFormat::E2M1 => Some(E2M1),
            ElementFormat::E8M0 => None,
        }
    }
}

/// E4M3 (finite-only variant): subnormals from 2⁻⁹, normals from 2⁻⁶, max 448.
pub const E4M3: Fp8Range = Fp8Range::of_spec("E4M3", ElementFormat::E4M3.spec());
/// E5M2: subnormals from 2⁻¹⁶, normals from 2⁻¹⁴, max 57344.
pub const E5M2: Fp8Range = Fp8Range::of_spec("E5M2", ElementFormat::E5M2.spec());
/// E2M1 (NVFP4's elements): 0.5, normals from 1, max 6.
pub const E2M1: Fp8Range = Fp8Range::of_spec("E2M1", ElementFormat::E2M1.spec());

/// One dumped tensor to draw.
#[derive(Clone, Debug)]
pub struct TensorSample {
    /// `layers.1.fc2.gradient at step 100`
    pub label: String,
    pub range: Fp8Range,
    /// The cast's scale (byte = cast(value · scale)).
    pub scale: f64,
    /// Elements of the whole tensor (the sample may hold fewer).
    pub numel: i64,
    pub values: Vec<f32>,
}

/// Shares of a sample's values by where the cast puts them.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct Shares {
    /// Values in the sample.
    pub n: usize,
    /// Exact zeros (not drawn on a log axis).
    pub zero: f64,
    /// Non-zero values that round to ±0.
    pub underflow: f64,
    /// Non-zero values that land in the subnormal range (fewer significant bits).
    pub subnormal: f64,
    /// Values beyond the format's max (clipped).
    pub saturated: f64,
    /// NaN or ±∞.
    pub nonfinite: f64,
}

/// Where the sample's values fall against the scaled range.
pub fn shares(values: &[f32], range: Fp8Range, scale: f64) -> Shares {
    let mut s = Shares { n: values.len(), ..Default::default() };
    if values.is_empty() {
        return s;
    }
    let (mut z, mut u, mut sub, mut sat, mut nf) = (0usize, 0usize, 0usize, 0usize, 0usize);
    for &v in values {
        let v = v as f64;
        if !v.is_finite() {
            nf += 1;
            continue;
        }
        let a = (v * scale).abs();
        if v == 0.0 {
            z += 1;
        } else if a <= range.min_subnormal / 2.0 {
            u += 1;
        } else if a < range.min_normal {
            sub += 1;
        } else if a > range.max {
            sat += 1;
        }
    }
    let n = values.len() as f64;
    s.zero = z as f64 / n;
    s.underflow = u as f64 / n;
    s.subnormal = sub as f64 / n;
    s.saturated = sat as f64 / n;
    s.nonfinite = nf as f64 / n;
    s
}

/// Draws up to four tensors (2 × 2) at `path` ([`super::HISTOGRAM_SIZE`]).
pub fn draw(path: &Path, run: &str, tensors: &[TensorSample]) -> Result<(), DrawError> {
    png(path, super::HISTOGRAM_SIZE, |root| {
        let title = format!("{run}: log2|x| of dumped tensors against the FP8 range at their scale");
        let root = root.titled(&title, (FONT, TITLE_PX - 2, FontStyle::Bold)).map_err(draw_err)?;
        let areas = root.split_evenly((2, 2));
        for (t, a) in tensors.iter().take(4).zip(areas.iter()) {
            draw_panel(a, t)?;
        }
        Ok(())
    })
}

/// Bin width in log2 units.
const BIN: f64 = 0.25;

fn draw_panel(area: &DrawingArea<BitMapBackend, Shift>, t: &TensorSample) -> Result<(), DrawError> {
    let r = t.range;
    let s = t.scale;
    // The format's bounds in x's units (log2).
    let l_sub = (r.min_subnormal / s).log2();
    let l_norm = (r.min_normal / s).log2();
    let l_max = (r.max / s).log2();
    let l_zero = (r.min_subnormal / 2.0 / s).log2();
    let logs: Vec<f64> = t.values.iter().map(|v| (*v as f64).abs()).filter(|a| a.is_finite() && *a > 0.0).map(f64::log2).collect();
    let (dlo, dhi) = logs.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    // The x range covers the data and the whole format range, so both ends are visible.
    let lo = dlo.min(l_sub - 2.0).floor();
    let hi = dhi.max(l_max + 2.0).ceil();
    let nb = ((hi - lo) / BIN).ceil().max(1.0) as usize;
    let mut counts = vec![0usize; nb];
    for &v in &logs {
        let i = (((v - lo) / BIN).floor() as usize).min(nb - 1);
        counts[i] += 1;
    }
    let n = t.values.len().max(1) as f64;
    let ymax = counts.iter().map(|&c| 100.0 * c as f64 / n).fold(0.0, f64::max).max(1.0) * 1.25;
    let sh = shares(&t.values, r, s);

    // A strip under the caption states the shares, each after a swatch of its shading.
    let (w, _) = area.dim_in_pixel();
    let (head, body) = area.split_vertically(56);
    let title_style = TextStyle::from((FONT, LABEL_PX).into_font()).pos(Pos::new(HPos::Center, VPos::Top));
    head.draw(&Text::new(t.label.clone(), (w as i32 / 2, 6), title_style)).map_err(draw_err)?;
    let items = [
        (palette::SKY_BLUE.mix(0.45), format!("rounds to 0: {}", super::percent(sh.underflow))),
        (palette::SKY_BLUE.mix(0.15), format!("subnormal: {}", super::percent(sh.subnormal))),
        (palette::VERMILLION.mix(0.3), format!("saturates: {}", super::percent(sh.saturated))),
    ];
    let font = (FONT, LEGEND_PX - 2).into_font();
    let mut x = 70;
    for (col, text) in items {
        head.draw(&Rectangle::new([(x, 34), (x + 14, 48)], col.filled())).map_err(draw_err)?;
        head.draw(&Rectangle::new([(x, 34), (x + 14, 48)], palette::GREY.stroke_width(1))).map_err(draw_err)?;
        let (tw, _) = head.estimate_text_size(&text, &TextStyle::from(font.clone())).map_err(draw_err)?;
        head.draw(&Text::new(text, (x + 19, 33), font.clone())).map_err(draw_err)?;
        x += 19 + tw as i32 + 24;
    }
    let mut chart = ChartBuilder::on(&body)
        .margin(10)
        .margin_top(4)
        .margin_right(18)
        .x_label_area_size(44)
        .y_label_area_size(60)
        .build_cartesian_2d(lo..hi, 0.0..ymax)
        .map_err(draw_err)?;
    chart
        .configure_mesh()
        .light_line_style(palette::LIGHT_GREY.mix(0.5))
        .x_desc(format!("log2 |x|   ({} of {} values sampled)", t.values.len(), t.numel))
        .y_desc("share of values (%)")
        .axis_desc_style((FONT, TICK_PX))
        .label_style((FONT, TICK_PX))
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .draw()
        .map_err(draw_err)?;
    // Shaded regions first, bars over them.
    let shade = [
        (lo, l_zero.max(lo), palette::SKY_BLUE.mix(0.45)),
        (l_zero.max(lo), l_norm.max(lo), palette::SKY_BLUE.mix(0.15)),
        (l_max.min(hi), hi, palette::VERMILLION.mix(0.3)),
    ];
    chart.draw_series(shade.iter().map(|(a, b, c)| Rectangle::new([(*a, 0.0), (*b, ymax)], c.filled()))).map_err(draw_err)?;
    chart
        .draw_series(counts.iter().enumerate().filter(|(_, c)| **c > 0).map(|(i, &c)| {
            let x0 = lo + i as f64 * BIN;
            Rectangle::new([(x0, 0.0), (x0 + BIN, 100.0 * c as f64 / n)], palette::BLUE.filled())
        }))
        .map_err(draw_err)?;
    for x in [l_sub, l_norm, l_max] {
        chart.draw_series(DashedLineSeries::new(vec![(x, 0.0), (x, ymax)], 6, 4, palette::BLACK.stroke_width(2))).map_err(draw_err)?;
    }
    // Names of the bounds along the top: the lower pair right of the min-normal line, the max
    // left of its line, so neither runs off the panel.
    let top = ymax * 0.985;
    let left = TextStyle::from((FONT, LEGEND_PX - 2).into_font()).pos(Pos::new(HPos::Left, VPos::Top));
    let right = TextStyle::from((FONT, LEGEND_PX - 2).into_font()).pos(Pos::new(HPos::Right, VPos::Top));
    let pad = 0.01 * (hi - lo);
    chart
        .draw_series([
            Text::new(format!("{} min subnormal, min normal", r.name), (l_norm + pad, top), left),
            Text::new(format!("{} max", r.name), (l_max - pad, top), right),
        ])
        .map_err(draw_err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_follow_the_scaled_bounds() {
        // scale 2: E4M3's max 448 sits at |x| = 224, the smallest subnormal 2^-9 at 2^-10.
        let v = [0.0f32, 1e-6, 300.0, -300.0, 1.0, 2f32.powi(-9), f32::NAN, 10.0];
        let s = shares(&v, E4M3, 2.0);
        assert_eq!(s.n, 8);
        assert_eq!(s.zero, 1.0 / 8.0);
        assert_eq!(s.underflow, 1.0 / 8.0, "1e-6·2 is below 2^-10");
        assert_eq!(s.saturated, 2.0 / 8.0);
        assert_eq!(s.subnormal, 1.0 / 8.0, "2^-9·2 = 2^-8 is subnormal in E4M3");
        assert_eq!(s.nonfinite, 1.0 / 8.0);
    }
}
