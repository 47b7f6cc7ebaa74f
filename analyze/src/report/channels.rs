//! Per-channel max |x| of one dumped tensor (the activation of the site of `locate`'s top GEMM):
//! a bar per channel (a column of the tensor's row-major `shape`), the channel holding the largest
//! value in vermillion and labelled with its value and its ratio to the median channel, the others
//! blue. An outlier channel — the reason a per-tensor FP8 scale leaves every other channel with few
//! significant bits — stands out as one tall bar.
//!
//! The values come from the tensors table: element i of a dump row is element `offset + i·stride`
//! of the tensor, so its channel is that index modulo the tensor's column count; the maxima cover
//! only the dumped rows, which the chart and its caption state.

use super::{DrawError, FONT, LABEL_PX, TICK_PX, TITLE_PX, draw_err, palette, png};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::collections::BTreeSet;
use std::path::Path;

/// One dump row of a tensor: its shape, where its values sit, and the values.
#[derive(Clone, Debug)]
pub struct DumpRow {
    pub shape: Vec<i64>,
    pub offset: i64,
    pub stride: i64,
    pub values: Vec<f32>,
}

/// The per-channel maxima of a tensor's dumped values.
#[derive(Clone, Debug, PartialEq)]
pub struct ChannelAmax {
    /// `layers.1.fc1.activation at step 120`
    pub label: String,
    /// max |x| per channel over the dumped finite values; None for a channel no finite value of
    /// the dump fell in.
    pub amax: Vec<Option<f32>>,
    /// Distinct rows of the tensor the dump touched, and the tensor's rows.
    pub rows_seen: usize,
    pub rows: usize,
    /// Values dumped.
    pub values: usize,
}

impl ChannelAmax {
    /// Per-channel max |x| of `dumps` (rows of one tensor). None when there is no row, or a shape
    /// that is not [rows, cols] with cols > 0.
    pub fn of(label: String, dumps: &[DumpRow]) -> Option<ChannelAmax> {
        let shape = &dumps.first()?.shape;
        let (rows, cols) = match shape[..] {
            [r, c] if r > 0 && c > 0 => (r as usize, c as usize),
            _ => return None,
        };
        let mut amax: Vec<Option<f32>> = vec![None; cols];
        let mut seen = BTreeSet::new();
        let mut values = 0;
        for d in dumps.iter().filter(|d| d.shape == *shape) {
            for (i, &v) in d.values.iter().enumerate() {
                let idx = d.offset.max(0) as usize + i * d.stride.max(1) as usize;
                seen.insert(idx / cols);
                values += 1;
                if v.is_finite() {
                    let a = &mut amax[idx % cols];
                    *a = Some(a.map_or(v.abs(), |m| m.max(v.abs())));
                }
            }
        }
        Some(ChannelAmax { label, amax, rows_seen: seen.len(), rows, values })
    }

    /// The channel with the largest max |x| (the lowest on ties), with its value.
    pub fn top(&self) -> Option<(usize, f32)> {
        let mut best: Option<(usize, f32)> = None;
        for (c, a) in self.amax.iter().enumerate() {
            if let Some(a) = *a
                && best.is_none_or(|(_, b)| a > b)
            {
                best = Some((c, a));
            }
        }
        best
    }

    /// The median of the channels' maxima (channels without a value left out).
    pub fn median(&self) -> Option<f32> {
        let mut v: Vec<f32> = self.amax.iter().flatten().copied().collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(|a, b| a.total_cmp(b));
        let n = v.len();
        Some(if n % 2 == 1 { v[n / 2] } else { 0.5 * (v[n / 2 - 1] + v[n / 2]) })
    }

    /// "channel 33 holds the largest, 412, 12× the median channel's (34)".
    pub fn headline(&self) -> String {
        match (self.top(), self.median()) {
            (Some((c, a)), Some(m)) if m > 0.0 => {
                format!(
                    "channel {c} holds the largest, {}, {}× the median channel's ({})",
                    super::short(a as f64),
                    super::short(a as f64 / m as f64),
                    super::short(m as f64)
                )
            }
            (Some((c, a)), _) => format!("channel {c} holds the largest, {}", super::short(a as f64)),
            _ => "no finite value was dumped".into(),
        }
    }
}

/// Draws the chart at `path` ([`super::CHANNELS_SIZE`]).
pub fn draw(path: &Path, run: &str, t: &ChannelAmax) -> Result<(), DrawError> {
    png(path, super::CHANNELS_SIZE, |root| {
        let title = format!("{run}: per-channel max|x| of {}", t.label);
        let root = root.titled(&title, (FONT, TITLE_PX - 2, FontStyle::Bold)).map_err(draw_err)?;
        let cols = t.amax.len();
        let top = t.top();
        let ymax = top.map(|(_, a)| a as f64).filter(|a| *a > 0.0).unwrap_or(1.0) * 1.15;
        let mut chart = ChartBuilder::on(&root)
            .margin(12)
            .margin_right(30)
            .x_label_area_size(50)
            .y_label_area_size(80)
            .build_cartesian_2d(-0.5f64..cols as f64 - 0.5, 0.0..ymax)
            .map_err(draw_err)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .light_line_style(palette::LIGHT_GREY.mix(0.5))
            .x_desc(format!("channel (column of the {}-column tensor)", cols))
            .y_desc(format!("max |x| over {} dumped row(s) of {}", t.rows_seen, t.rows))
            .axis_desc_style((FONT, LABEL_PX))
            .label_style((FONT, TICK_PX))
            .x_label_formatter(&|v| format!("{v:.0}"))
            .y_label_formatter(&|v| super::short(*v))
            .draw()
            .map_err(draw_err)?;
        let w = if cols > 200 { 0.5 } else { 0.4 };
        let bars = t.amax.iter().enumerate().filter_map(|(c, a)| {
            let a = (*a)? as f64;
            let col = if top.map(|x| x.0) == Some(c) { palette::VERMILLION } else { palette::BLUE };
            Some(Rectangle::new([(c as f64 - w, 0.0), (c as f64 + w, a)], col.filled()))
        });
        chart.draw_series(bars).map_err(draw_err)?;
        if let Some((c, a)) = top {
            // The label sits left of the bar when the bar is in the right half.
            let right = (c as f64) > cols as f64 / 2.0;
            let hpos = if right { HPos::Right } else { HPos::Left };
            let x = c as f64 + if right { -0.01 } else { 0.01 } * cols as f64;
            chart
                .draw_series(std::iter::once(Text::new(
                    t.headline(),
                    (x, (a as f64).max(0.0) * 1.05),
                    TextStyle::from((FONT, TICK_PX + 2).into_font()).color(&palette::BLACK).pos(Pos::new(hpos, VPos::Bottom)),
                )))
                .map_err(draw_err)?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(shape: [i64; 2], offset: i64, stride: i64, values: Vec<f32>) -> DumpRow {
        DumpRow { shape: shape.to_vec(), offset, stride, values }
    }

    #[test]
    fn channels_come_from_the_shape_and_each_value_s_offset_and_stride() {
        // A 4 × 3 tensor dumped as rows 0–1 (offset 0) and, strided, elements 7, 9, 11.
        let d = [row([4, 3], 0, 1, vec![1.0, -5.0, 2.0, 0.5, 4.0, -3.0]), row([4, 3], 7, 2, vec![-6.0, f32::NAN, 9.0])];
        let t = ChannelAmax::of("t".into(), &d).unwrap();
        // Element 7 is (2, 1), 9 is (3, 0) (NaN: skipped), 11 is (3, 2).
        assert_eq!(t.amax, vec![Some(1.0), Some(6.0), Some(9.0)]);
        assert_eq!((t.rows_seen, t.rows, t.values), (4, 4, 9));
        assert_eq!(t.top(), Some((2, 9.0)));
        assert_eq!(t.median(), Some(6.0));
        assert!(t.headline().starts_with("channel 2 holds the largest, 9.00, 1.50× the median"), "{}", t.headline());
    }

    #[test]
    fn ties_go_to_the_lowest_channel_and_bad_shapes_give_nothing() {
        let t = ChannelAmax::of("t".into(), &[row([1, 4], 0, 1, vec![3.0, -3.0, 1.0, f32::INFINITY])]).unwrap();
        assert_eq!(t.top(), Some((0, 3.0)));
        assert_eq!(t.amax[3], None);
        assert!(ChannelAmax::of("t".into(), &[]).is_none());
        assert!(ChannelAmax::of("t".into(), &[DumpRow { shape: vec![12], offset: 0, stride: 1, values: vec![1.0] }]).is_none());
    }

    #[test]
    fn the_chart_is_a_png_of_the_documented_size() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.png");
        let mut values: Vec<f32> = (0..4 * 64).map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0).collect();
        for r in 0..4 {
            values[r * 64 + 33] *= 40.0;
        }
        let t = ChannelAmax::of("layers.1.fc1.activation at step 120".into(), &[row([512, 64], 0, 1, values)]).unwrap();
        assert_eq!(t.top().map(|x| x.0), Some(33));
        draw(&path, "run", &t).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG");
        // IHDR: width and height, big-endian, at bytes 16..24.
        let (w, h) = (u32::from_be_bytes(bytes[16..20].try_into().unwrap()), u32::from_be_bytes(bytes[20..24].try_into().unwrap()));
        assert_eq!((w, h), super::super::CHANNELS_SIZE);
    }
}
