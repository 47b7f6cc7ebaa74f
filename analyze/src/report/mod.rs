//! Drawing the charts of `report` (PNG, with plotters and fonts bundled in the binary) and its
//! `index.html`. [`build`] gathers the data from [`crate::analysis`] (`find_anomalies`,
//! `compare_runs`, `locate`, `summarize`) and a few stats/tensors scans; the other files only draw.
//!
//! One file per chart family: [`loss`] (loss overlay and relative-gap panel), [`heatmap`]
//! (layer × step maps with a colour bar), [`amax`] (amax against the amax the scale came from, and
//! the scale), [`histogram`] (log2|x| against the FP8 format's range), [`sites`] (bars of the
//! error each GEMM adds), [`channels`] (per-channel max |x| of the top site's activation),
//! [`ranks`] (loss and step time of every rank of a multi-rank run);
//! [`html`] writes the page.
//!
//! Every chart has a fixed size (the constants below, documented in README.md), the Okabe-Ito
//! palette for lines (safe for the common colour-vision deficiencies), and viridis / cividis for
//! colour scales.

pub mod amax;
pub mod build;
pub mod channels;
pub mod heatmap;
pub mod histogram;
pub mod html;
pub mod loss;
pub mod ranks;
pub mod sites;
pub mod whatif;

use plotters::style::{FontStyle, RGBColor};
use serde::Serialize;
use std::path::Path;
use std::sync::Once;

/// Size of the loss chart (loss overlay over the relative-gap panel).
pub const LOSS_SIZE: (u32, u32) = (1200, 800);
/// Size of each heatmap chart (one metric of one run, a panel per role).
pub const HEATMAP_SIZE: (u32, u32) = (1200, 900);
/// Size of each amax/scale chart (the top sites of one run).
pub const AMAX_SIZE: (u32, u32) = (1200, 900);
/// Size of each histogram chart (up to four dumped tensors of one run).
pub const HISTOGRAM_SIZE: (u32, u32) = (1200, 800);
/// Size of each bar chart of the error each GEMM adds.
pub const SITES_SIZE: (u32, u32) = (1200, 600);
/// Size of each per-channel max |x| chart (the activation of the top GEMM's site).
pub const CHANNELS_SIZE: (u32, u32) = (1200, 600);
/// Size of each per-rank chart (loss and step time of every rank of a multi-rank run).
pub const RANKS_SIZE: (u32, u32) = (1200, 800);

/// The font family every chart uses: DejaVu Sans, registered from the bytes in the binary.
/// Sizes are even: plotters' ab_glyph renderer places each glyph at size/2 truncated, so an odd
/// size lifts small glyphs such as '.' by a pixel relative to the others.
pub const FONT: &str = "sans-serif";
pub const TITLE_PX: u32 = 26;
pub const LABEL_PX: u32 = 18;
pub const TICK_PX: u32 = 16;
pub const LEGEND_PX: u32 = 16;

/// Okabe & Ito (2008): distinguishable under protanopia, deuteranopia and tritanopia.
pub mod palette {
    use plotters::style::RGBColor;
    pub const BLACK: RGBColor = RGBColor(0, 0, 0);
    pub const ORANGE: RGBColor = RGBColor(230, 159, 0);
    pub const SKY_BLUE: RGBColor = RGBColor(86, 180, 233);
    pub const GREEN: RGBColor = RGBColor(0, 158, 115);
    pub const YELLOW: RGBColor = RGBColor(240, 228, 66);
    pub const BLUE: RGBColor = RGBColor(0, 114, 178);
    pub const VERMILLION: RGBColor = RGBColor(213, 94, 0);
    pub const PURPLE: RGBColor = RGBColor(204, 121, 167);
    /// Runs other than the baseline (which is black), in order.
    pub const RUNS: [RGBColor; 6] = [BLUE, VERMILLION, GREEN, PURPLE, ORANGE, SKY_BLUE];
    pub const GREY: RGBColor = RGBColor(120, 120, 120);
    pub const LIGHT_GREY: RGBColor = RGBColor(225, 225, 225);
    /// Cells that hold NaN or ±∞.
    pub const NONFINITE: RGBColor = RGBColor(160, 160, 160);

    /// Colour of the i-th run (not the baseline).
    pub fn run(i: usize) -> RGBColor {
        RUNS[i % RUNS.len()]
    }

    /// One colour per role, the same in every chart.
    pub fn role(role: &str) -> RGBColor {
        match role {
            "activation" => BLUE,
            "weight" => GREEN,
            "gradient" => VERMILLION,
            "output" => SKY_BLUE,
            "dgrad" => PURPLE,
            _ => ORANGE,
        }
    }
}

/// A perceptually uniform colour map, sampled at evenly spaced anchors and interpolated.
#[derive(Clone, Copy, Debug)]
pub enum ColorMap {
    Viridis,
    Cividis,
}

const VIRIDIS: [(u8, u8, u8); 9] =
    [(68, 1, 84), (72, 40, 120), (62, 74, 137), (49, 104, 142), (38, 130, 142), (31, 158, 137), (53, 183, 121), (109, 205, 89), (253, 231, 37)];
const CIVIDIS: [(u8, u8, u8); 9] =
    [(0, 34, 78), (18, 53, 112), (59, 73, 108), (87, 93, 109), (112, 113, 115), (138, 134, 120), (165, 156, 116), (195, 179, 105), (254, 232, 56)];

impl ColorMap {
    /// The colour at t ∈ [0, 1] (clamped).
    pub fn at(self, t: f64) -> RGBColor {
        let lut = match self {
            ColorMap::Viridis => &VIRIDIS,
            ColorMap::Cividis => &CIVIDIS,
        };
        let t = if t.is_finite() { t.clamp(0.0, 1.0) } else { 0.0 };
        let x = t * (lut.len() - 1) as f64;
        let i = (x.floor() as usize).min(lut.len() - 2);
        let f = x - i as f64;
        let mix = |a: u8, b: u8| (a as f64 + (b as f64 - a as f64) * f).round() as u8;
        let (a, b) = (lut[i], lut[i + 1]);
        RGBColor(mix(a.0, b.0), mix(a.1, b.1), mix(a.2, b.2))
    }
}

/// Registers DejaVu Sans (regular and bold) under [`FONT`] once per process; no system font is
/// looked up.
pub fn register_fonts() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // The bytes are DejaVu's own TTFs: parsing them cannot fail short of a broken crate.
        let _ = plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular());
        let _ = plotters::style::register_font(FONT, FontStyle::Bold, dejavu::sans::bold());
    });
}

/// One written chart, as listed in `report.json` and shown in `index.html`.
#[derive(Clone, Debug, Serialize)]
pub struct Chart {
    /// File name inside the output directory.
    pub file: String,
    /// `loss`, `heatmap-cosine`, `heatmap-underflow`, `heatmap-saturated`, `amax`, `histogram`,
    /// `sites`, `channels`.
    pub kind: &'static str,
    /// The run it shows (None for the loss chart, which shows them all).
    pub run: Option<String>,
    pub width: u32,
    pub height: u32,
    pub title: String,
    /// What it shows and how to read it, a sentence or two (the page's caption and alt text).
    pub caption: String,
}

/// A drawing error: plotters' own message.
pub type DrawError = Box<dyn std::error::Error + Send + Sync>;

/// Wraps a plotters error (whose backend error type is not `'static` in general) into a message.
pub fn draw_err<E: std::fmt::Debug>(e: E) -> DrawError {
    format!("{e:?}").into()
}

/// A file-name-safe form of a run name: letters, digits, `-` and `_`, others as `_`.
pub fn slug(name: &str) -> String {
    let s: String = name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect();
    let s = s.trim_matches('_').to_string();
    if s.is_empty() { "run".to_string() } else { s }
}

/// Writes the PNG at `path` (creating nothing else) through `draw`, which gets the root area.
pub fn png<F>(path: &Path, size: (u32, u32), draw: F) -> Result<(), DrawError>
where
    F: FnOnce(&plotters::drawing::DrawingArea<plotters::prelude::BitMapBackend, plotters::coord::Shift>) -> Result<(), DrawError>,
{
    use plotters::prelude::*;
    register_fonts();
    let root = BitMapBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE).map_err(draw_err)?;
    draw(&root)?;
    root.present().map_err(draw_err)?;
    Ok(())
}

/// A number for a tick or a note: short, with an exponent only when it must.
pub fn short(x: f64) -> String {
    if !x.is_finite() {
        return format!("{x}");
    }
    let a = x.abs();
    if a == 0.0 {
        "0".into()
    } else if !(1e-3..1e4).contains(&a) {
        format!("{x:.1e}")
    } else if a >= 100.0 {
        format!("{x:.0}")
    } else if a >= 10.0 {
        format!("{x:.1}")
    } else if a >= 1.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.3}")
    }
}

/// A fraction as a percentage with sensible digits.
pub fn percent(f: f64) -> String {
    let p = 100.0 * f;
    if p == 0.0 {
        "0%".into()
    } else if p.abs() < 0.01 {
        "<0.01%".into()
    } else if p.abs() < 10.0 {
        format!("{p:.2}%")
    } else {
        format!("{p:.1}%")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_maps_run_from_dark_to_bright() {
        for m in [ColorMap::Viridis, ColorMap::Cividis] {
            let lum = |c: RGBColor| 0.2126 * c.0 as f64 + 0.7152 * c.1 as f64 + 0.0722 * c.2 as f64;
            let l: Vec<f64> = (0..=20).map(|i| lum(m.at(i as f64 / 20.0))).collect();
            assert!(l.windows(2).all(|w| w[1] > w[0] - 1.0), "{m:?} luminance must not fall: {l:?}");
            assert!(l[20] - l[0] > 150.0, "{m:?} spans dark to bright");
        }
    }

    #[test]
    fn slugs_are_file_names() {
        assert_eq!(slug("tiny-delayed-s0"), "tiny-delayed-s0");
        assert_eq!(slug("/tmp/runs/a b"), "tmp_runs_a_b");
        assert_eq!(slug("///"), "run");
    }
}
