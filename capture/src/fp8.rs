//! Exact FP8 emulation: the numeric truth of fp8scope.
//!
//! Two formats are supported, as used by FP8 training on Hopper:
//!
//! * [`Fp8Format::E4M3`] — the `fn` variant (finite, NaN only): bias 7, 3 mantissa bits,
//!   max 448, no infinities, NaN at `0x7F`/`0xFF`.
//! * [`Fp8Format::E5M2`] — IEEE-like: bias 15, 2 mantissa bits, max 57344, ±Inf at
//!   `0x7C`/`0xFC`, NaN at `0x7D..=0x7F` and `0xFD..=0xFF`.
//!
//! [`encode`] is bit-identical to the GPU instruction `cvt.rn.satfinite.{e4m3,e5m2}x2.f32`
//! (checked on an H200 against 2,162,688 inputs, see the tests):
//!
//! * round to nearest, ties to even;
//! * saturate: any finite |x| above the format's max, and ±Inf, give ±max;
//! * subnormals are produced (no flush to zero); -0 stays -0 (`0x80`);
//! * **every NaN input gives `0x7F`, in both formats, whatever its sign** — this is what the
//!   hardware does ([`CANONICAL_NAN`]). Note that `ml_dtypes` differs here: it keeps the sign and
//!   uses `0x7E` (quiet NaN) for E5M2.
//!
//! [`decode`] is exact (every FP8 value is an f32) and uses a 256-entry table per format.
//!
//! Scaling follows the Transformer Engine convention: the FP8 code of `x` is
//! `encode(x * scale)` (an f32 multiply, then the cast), and the value it stands for is
//! `decode(code) / scale`.

use fp8scope_schemas::quant::{ElementFormat, FormatSpec};
use rayon::prelude::*;
use std::sync::LazyLock;

/// An 8-bit floating-point format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fp8Format {
    /// 1 sign, 4 exponent, 3 mantissa bits; finite-only (`fn`) variant, max 448.
    E4M3,
    /// 1 sign, 5 exponent, 2 mantissa bits; IEEE-like with infinities, max 57344.
    E5M2,
}

/// The code that [`encode`] gives for every NaN input, in both formats (the H200's answer).
pub const CANONICAL_NAN: u8 = 0x7F;

/// Bit-level description of a format, used by the encoder.
#[derive(Clone, Copy)]
struct Params {
    /// Number of explicit mantissa bits.
    mbits: u32,
    /// Exponent bias.
    bias: u32,
    /// Code (without sign) of the largest finite value.
    max_code: u8,
    /// f32 bits of the largest finite value.
    max_bits: u32,
    /// f32 bits of the smallest normal value.
    min_normal_bits: u32,
    /// 2^(23 + log2(min_subnormal)): adding it to a value below the smallest normal rounds that
    /// value (ties to even, by the FPU) to a multiple of the smallest subnormal.
    magic: f32,
}

impl Params {
    /// The encoder's bit constants, derived from the quantization contract's entry.
    const fn of(spec: &FormatSpec) -> Params {
        let min_subnormal = match spec.min_subnormal {
            Some(v) => v as f32,
            None => panic!("an FP8 format has subnormals"),
        };
        // magic = 2^23 · min_subnormal: its f32 ulp is the smallest subnormal.
        Params {
            mbits: spec.mantissa_bits,
            bias: spec.bias as u32,
            max_code: spec.max_code,
            max_bits: (spec.max_finite as f32).to_bits(),
            min_normal_bits: (spec.min_normal as f32).to_bits(),
            magic: min_subnormal * 8_388_608.0,
        }
    }
}

const E4M3_PARAMS: Params = Params::of(ElementFormat::E4M3.spec());
const E5M2_PARAMS: Params = Params::of(ElementFormat::E5M2.spec());

impl Fp8Format {
    /// Both formats, E4M3 first.
    pub const ALL: [Fp8Format; 2] = [Fp8Format::E4M3, Fp8Format::E5M2];

    /// The format's entry in the quantization contract.
    pub fn element(self) -> ElementFormat {
        match self {
            Fp8Format::E4M3 => ElementFormat::E4M3,
            Fp8Format::E5M2 => ElementFormat::E5M2,
        }
    }

    /// The format's constants, from the quantization contract.
    pub fn spec(self) -> &'static FormatSpec {
        self.element().spec()
    }

    /// The FP8 format of a contract element format (None for E2M1 and E8M0).
    pub fn of_element(e: ElementFormat) -> Option<Fp8Format> {
        match e {
            ElementFormat::E4M3 => Some(Fp8Format::E4M3),
            ElementFormat::E5M2 => Some(Fp8Format::E5M2),
            ElementFormat::E2M1 | ElementFormat::E8M0 => None,
        }
    }

    /// Where round-to-nearest leaves the finite range (464 for E4M3, 61440 for E5M2): a
    /// non-saturating cast turns |x·scale| at or above it into [`Self::overflow_code`].
    pub fn overflow_threshold(self) -> f32 {
        self.spec().overflow_threshold() as f32
    }

    /// The code (positive sign) of a non-saturating overflow: NaN `0x7F` (E4M3), Inf `0x7C` (E5M2).
    pub fn overflow_code(self) -> u8 {
        self.spec().overflow_code().unwrap_or(CANONICAL_NAN)
    }

    #[inline(always)]
    fn params(self) -> &'static Params {
        match self {
            Fp8Format::E4M3 => &E4M3_PARAMS,
            Fp8Format::E5M2 => &E5M2_PARAMS,
        }
    }

    /// Largest finite value: 448 (E4M3) or 57344 (E5M2).
    pub fn max(self) -> f32 {
        f32::from_bits(self.params().max_bits)
    }

    /// Smallest positive normal value: 2^-6 (E4M3) or 2^-14 (E5M2).
    pub fn min_normal(self) -> f32 {
        f32::from_bits(self.params().min_normal_bits)
    }

    /// Smallest positive subnormal value: 2^-9 (E4M3) or 2^-16 (E5M2).
    pub fn min_subnormal(self) -> f32 {
        self.spec().min_subnormal.unwrap_or(0.0) as f32
    }

    /// Code (positive sign) of the largest finite value: `0x7E` (E4M3) or `0x7B` (E5M2).
    pub fn max_code(self) -> u8 {
        self.params().max_code
    }

    /// Number of explicit mantissa bits: 3 (E4M3) or 2 (E5M2).
    pub fn mantissa_bits(self) -> u32 {
        self.params().mbits
    }

    /// Exponent bias: 7 (E4M3) or 15 (E5M2).
    pub fn bias(self) -> i32 {
        self.params().bias as i32
    }

    /// Lower-case name, as used on the command line and in recorded files.
    pub fn name(self) -> &'static str {
        self.spec().name
    }

    /// Parses a name, case-insensitively: `e4m3` (also `e4m3fn`) or `e5m2`.
    pub fn parse(s: &str) -> Option<Self> {
        ElementFormat::parse(s).and_then(Fp8Format::of_element)
    }

    /// True if `code` is a NaN code of this format (either sign).
    pub fn is_nan_code(self, code: u8) -> bool {
        self.spec().nan_codes.contains(&(code & 0x7F))
    }

    /// True if `code` is ±Inf (E5M2 only; E4M3 has no infinities).
    pub fn is_inf_code(self, code: u8) -> bool {
        self.spec().inf_code == Some(code & 0x7F)
    }
}

impl std::fmt::Display for Fp8Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Rounds `x` to the nearest FP8 value (ties to even) and returns its code, saturating to ±max
/// like `cvt.rn.satfinite` (±Inf gives ±max), keeping subnormals and the sign of zero. Every NaN
/// gives [`CANONICAL_NAN`] (`0x7F`).
#[inline]
pub fn encode(fmt: Fp8Format, x: f32) -> u8 {
    let p = fmt.params();
    let bits = x.to_bits();
    let sign = (bits >> 24) & 0x80;
    let abs = bits & 0x7FFF_FFFF;
    // Written without branches (selects only) so that loops over slices vectorise.
    //
    // Normal range: round the f32 mantissa to `mbits` bits, ties to even, on the integer bits;
    // a carry moves into the exponent, which is what rounding must do. The result cannot pass
    // max since this path is only taken for abs <= max, and max's discarded bits are zero.
    let shift = 23 - p.mbits;
    let half_minus_one = (1u32 << (shift - 1)) - 1;
    let odd = (abs >> shift) & 1;
    let normal = ((abs + half_minus_one + odd) >> shift).wrapping_sub((127 - p.bias) << p.mbits);
    // Subnormal range (and zero): adding `magic` makes the f32 ulp equal to the smallest FP8
    // subnormal, so the FPU's round-to-nearest-even does the rounding; the bit difference is
    // the number of subnormal steps (the value 2^mbits lands on the smallest normal's code).
    // The input is clamped so that the (then unused) sum stays finite for large inputs.
    let small = f32::from_bits(abs.min(p.min_normal_bits));
    let sub = (small + p.magic).to_bits().wrapping_sub(p.magic.to_bits());
    let mut code = if abs >= p.min_normal_bits { normal } else { sub };
    // Finite overflow or infinity: saturate.
    code = if abs > p.max_bits { u32::from(p.max_code) } else { code };
    code |= sign;
    // Every NaN: the canonical NaN, sign dropped.
    code = if abs > 0x7F80_0000 { u32::from(CANONICAL_NAN) } else { code };
    code as u8
}

fn build_decode_table(fmt: Fp8Format) -> [f32; 256] {
    let p = fmt.params();
    let mut table = [0.0f32; 256];
    for (code, slot) in table.iter_mut().enumerate() {
        let code = code as u8;
        let sign_bit = u32::from(code >> 7) << 31;
        let mag = u32::from(code & 0x7F);
        let exp = mag >> p.mbits;
        let man = mag & ((1 << p.mbits) - 1);
        let value = if fmt.is_nan_code(code) {
            f32::from_bits(sign_bit | 0x7FC0_0000)
        } else if fmt.is_inf_code(code) {
            f32::from_bits(sign_bit | 0x7F80_0000)
        } else if exp == 0 {
            // Subnormal: man * min_subnormal, exact (small integer times a power of two).
            let v = man as f32 * fmt.min_subnormal();
            f32::from_bits(sign_bit | v.to_bits())
        } else {
            let f32_exp = exp + 127 - p.bias;
            f32::from_bits(sign_bit | (f32_exp << 23) | (man << (23 - p.mbits)))
        };
        *slot = value;
    }
    table
}

static DECODE_E4M3: LazyLock<[f32; 256]> = LazyLock::new(|| build_decode_table(Fp8Format::E4M3));
static DECODE_E5M2: LazyLock<[f32; 256]> = LazyLock::new(|| build_decode_table(Fp8Format::E5M2));

/// The 256 decoded values of a format, indexed by code.
pub fn decode_table(fmt: Fp8Format) -> &'static [f32; 256] {
    match fmt {
        Fp8Format::E4M3 => &DECODE_E4M3,
        Fp8Format::E5M2 => &DECODE_E5M2,
    }
}

/// The exact value of an FP8 code. E4M3: `0x7F`/`0xFF` are NaN, there are no infinities.
/// E5M2: `0x7C`/`0xFC` are ±Inf, `0x7D..=0x7F`/`0xFD..=0xFF` NaN. NaN keeps the code's sign.
#[inline]
pub fn decode(fmt: Fp8Format, b: u8) -> f32 {
    decode_table(fmt)[b as usize]
}

/// The FP8 code of `x` under `scale`: `encode(fmt, x * scale)`, the product being an f32
/// multiply (rounded to f32 before the cast, as on the GPU).
#[inline]
pub fn cast(fmt: Fp8Format, x: f32, scale: f32) -> u8 {
    encode(fmt, x * scale)
}

/// What happened in one cast of a tensor to FP8.
///
/// Input classes partition the tensor: `zeros + nonzero + nan + inf == len`, where `nonzero`
/// counts finite non-zero inputs. `underflow` (a subset of `nonzero`) and `saturated` are about
/// the scaled value `y = x * scale`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CastStats {
    /// max |x| over the finite inputs (before scaling); 0 if there are none.
    pub amax: f32,
    /// Inputs with x != 0 (and not NaN) whose code is ±0: lost to underflow.
    pub underflow: u64,
    /// Inputs whose scaled value y is not NaN and |y| > max (finite overflow, or ±Inf, including
    /// a finite x whose product overflowed f32): clamped to ±max.
    pub saturated: u64,
    /// NaN inputs.
    pub nan: u64,
    /// ±Inf inputs.
    pub inf: u64,
    /// Inputs equal to ±0.
    pub zeros: u64,
    /// Finite non-zero inputs.
    pub nonzero: u64,
}

impl CastStats {
    /// Counts one input by its class (NaN, ±Inf, ±0, finite non-zero); returns whether it is finite
    /// and non-zero. Branch-free, so the casts' loops stay straight-line.
    #[inline(always)]
    pub fn count_input(&mut self, v: f32) -> bool {
        let a = v.abs();
        let finite_nonzero = a > 0.0 && a < f32::INFINITY;
        self.nan += u64::from(a.is_nan());
        self.inf += u64::from(a == f32::INFINITY);
        self.zeros += u64::from(a == 0.0);
        self.nonzero += u64::from(finite_nonzero);
        finite_nonzero
    }

    /// Counts one element of an FP8 cast: input `v`, its scaled value `y`, its `code`, and the
    /// format's `max`: the input's class, underflow (a finite non-zero input coded ±0), saturation
    /// (|y| > max) and the amax of the finite inputs.
    #[inline(always)]
    pub fn count_fp8(&mut self, v: f32, y: f32, code: u8, max: f32) {
        let finite_nonzero = self.count_input(v);
        self.underflow += u64::from(finite_nonzero && code & 0x7F == 0);
        self.saturated += u64::from(y.abs() > max);
        let a = v.abs();
        let finite_a = if a < f32::INFINITY { a } else { 0.0 };
        self.amax = if finite_a > self.amax { finite_a } else { self.amax };
    }

    /// Total number of inputs counted.
    pub fn len(&self) -> u64 {
        self.zeros + self.nonzero + self.nan + self.inf
    }

    /// True if no input was counted.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Combines the statistics of two disjoint parts of a tensor. Exact and order-independent.
    pub fn merge(self, o: CastStats) -> CastStats {
        CastStats {
            amax: if o.amax > self.amax { o.amax } else { self.amax },
            underflow: self.underflow + o.underflow,
            saturated: self.saturated + o.saturated,
            nan: self.nan + o.nan,
            inf: self.inf + o.inf,
            zeros: self.zeros + o.zeros,
            nonzero: self.nonzero + o.nonzero,
        }
    }
}

/// Slices longer than this are cut into chunks of this size and cast in parallel.
pub const PAR_CHUNK: usize = 1 << 16;

fn quantize_serial(fmt: Fp8Format, x: &[f32], scale: f32, out: &mut [u8]) -> CastStats {
    let max = fmt.max();
    let mut s = CastStats::default();
    // Branch-free counting (comparisons with NaN are false), so the loop stays straight-line.
    for (&v, o) in x.iter().zip(out.iter_mut()) {
        let y = v * scale;
        let code = encode(fmt, y);
        *o = code;
        s.count_fp8(v, y, code, max);
    }
    s
}

/// Casts every element: `out[i] = cast(fmt, x[i], scale)`, and returns the [`CastStats`].
/// Large slices are done in parallel in chunks of [`PAR_CHUNK`]; the codes and statistics are
/// identical to a serial loop.
///
/// # Panics
/// If `out.len() != x.len()`.
pub fn quantize(fmt: Fp8Format, x: &[f32], scale: f32, out: &mut [u8]) -> CastStats {
    assert_eq!(x.len(), out.len(), "fp8::quantize: input and output lengths differ");
    if x.len() <= PAR_CHUNK {
        return quantize_serial(fmt, x, scale, out);
    }
    x.par_chunks(PAR_CHUNK).zip(out.par_chunks_mut(PAR_CHUNK)).map(|(xc, oc)| quantize_serial(fmt, xc, scale, oc)).reduce(CastStats::default, CastStats::merge)
}

/// The values the codes stand for: `out[i] = decode(fmt, q[i]) / scale`. This is a division
/// (not a multiply by 1/scale), matching the `x / scale` semantics of dequantisation.
///
/// # Panics
/// If `out.len() != q.len()`.
pub fn dequantize(fmt: Fp8Format, q: &[u8], scale: f32, out: &mut [f32]) {
    assert_eq!(q.len(), out.len(), "fp8::dequantize: input and output lengths differ");
    let table = decode_table(fmt);
    let run = |qc: &[u8], oc: &mut [f32]| {
        for (&b, o) in qc.iter().zip(oc.iter_mut()) {
            *o = table[b as usize] / scale;
        }
    };
    if q.len() <= PAR_CHUNK {
        run(q, out);
    } else {
        q.par_chunks(PAR_CHUNK).zip(out.par_chunks_mut(PAR_CHUNK)).for_each(|(qc, oc)| run(qc, oc));
    }
}

fn amax_serial(x: &[f32]) -> f32 {
    let mut m = 0.0f32;
    for &v in x {
        let a = v.abs();
        // NaN fails the comparison; infinities are excluded explicitly.
        if a > m && a != f32::INFINITY {
            m = a;
        }
    }
    m
}

/// max |x| over the finite elements: NaN and ±Inf are ignored (they are counted separately in
/// [`CastStats`]), so one bad element does not destroy the scale. 0 for an empty slice or one
/// with no finite non-zero element.
pub fn amax(x: &[f32]) -> f32 {
    if x.len() <= PAR_CHUNK {
        return amax_serial(x);
    }
    x.par_chunks(PAR_CHUNK).map(amax_serial).reduce(|| 0.0, |a, b| if b > a { b } else { a })
}

/// 2^e as an f32, exact for e in -149..=127, 0 below and +Inf above.
fn exp2i(e: i32) -> f32 {
    if e > 127 {
        f32::INFINITY
    } else if e >= -126 {
        f32::from_bits(((e + 127) as u32) << 23)
    } else if e >= -149 {
        f32::from_bits(1u32 << (e + 149))
    } else {
        0.0
    }
}

/// The Transformer Engine scale for a tensor of this amax: `(max / amax) / 2^margin`, in f32.
/// If `amax` is 0, negative or not finite the scale is 1.0 (as TE does for a tensor without a
/// usable amax). The result is clamped into `[f32::MIN_POSITIVE, f32::MAX]` so that it is always
/// finite and non-zero (a tiny amax would otherwise give +Inf).
pub fn scale_for_amax(fmt: Fp8Format, amax: f32, margin: i32) -> f32 {
    if !(amax.is_finite() && amax > 0.0) {
        return 1.0;
    }
    let s = (fmt.max() / amax) / exp2i(margin);
    if s.is_nan() {
        // Only reachable as inf/inf (tiny amax and a huge negative margin): treat as overflow.
        return f32::MAX;
    }
    s.clamp(f32::MIN_POSITIVE, f32::MAX)
}

fn check_block_shapes(len: usize, rows: usize, cols: usize, tile_rows: usize, tile_cols: usize, q_len: usize, scales_len: usize) -> (usize, usize) {
    assert!(tile_rows > 0 && tile_cols > 0, "fp8: tile sizes must be positive");
    let n = rows.checked_mul(cols).expect("fp8: rows * cols overflows usize");
    assert_eq!(len, n, "fp8: data length is not rows * cols");
    assert_eq!(q_len, n, "fp8: code buffer length is not rows * cols");
    let (tr, tc) = block_grid(rows, cols, tile_rows, tile_cols);
    assert_eq!(scales_len, tr * tc, "fp8: scale buffer length is not the number of tiles");
    (tr, tc)
}

/// Number of tiles down and across for a `rows x cols` matrix cut into `tile_rows x tile_cols`
/// tiles (edge tiles partial). Multiply them for the length of the scale buffer.
pub fn block_grid(rows: usize, cols: usize, tile_rows: usize, tile_cols: usize) -> (usize, usize) {
    (rows.div_ceil(tile_rows.max(1)), cols.div_ceil(tile_cols.max(1)))
}

/// Block-scaled cast (DeepSeek-V3 style): the row-major `rows x cols` matrix `x` is cut into
/// `tile_rows x tile_cols` tiles (1x128 for activations and gradients, 128x128 for weights;
/// edge tiles are partial). Each tile gets its own scale `scale_for_amax(fmt, amax(tile),
/// margin)`, written row-major over tiles to `out_scales`, and its elements are cast with it
/// into `out_q` (same layout as `x`). The statistics cover the whole matrix (`amax` is that of
/// the matrix). Rows of tiles are done in parallel; the result does not depend on it.
///
/// Note: the scale multiplies (`x * scale`, TE convention); DeepSeek's reference kernels divide
/// by `amax / 448` instead, which can differ in the last bit of the f32 product.
///
/// # Panics
/// If a tile size is 0 or a buffer length does not match the shape (see [`block_grid`]).
#[allow(clippy::too_many_arguments)]
pub fn quantize_block(
    fmt: Fp8Format,
    x: &[f32],
    rows: usize,
    cols: usize,
    tile_rows: usize,
    tile_cols: usize,
    margin: i32,
    out_q: &mut [u8],
    out_scales: &mut [f32],
) -> CastStats {
    let (_, tiles_across) = check_block_shapes(x.len(), rows, cols, tile_rows, tile_cols, out_q.len(), out_scales.len());
    if x.is_empty() {
        return CastStats::default();
    }
    let band = tile_rows * cols;
    let do_band = |(xb, (qb, sb)): (&[f32], (&mut [u8], &mut [f32]))| -> CastStats {
        let band_rows = xb.len() / cols;
        let mut stats = CastStats::default();
        for (t, scale_slot) in sb.iter_mut().enumerate().take(tiles_across) {
            let c0 = t * tile_cols;
            let c1 = (c0 + tile_cols).min(cols);
            let mut a = 0.0f32;
            for r in 0..band_rows {
                let m = amax_serial(&xb[r * cols + c0..r * cols + c1]);
                if m > a {
                    a = m;
                }
            }
            let scale = scale_for_amax(fmt, a, margin);
            *scale_slot = scale;
            for r in 0..band_rows {
                let s = quantize_serial(fmt, &xb[r * cols + c0..r * cols + c1], scale, &mut qb[r * cols + c0..r * cols + c1]);
                stats = stats.merge(s);
            }
        }
        stats
    };
    x.par_chunks(band).zip(out_q.par_chunks_mut(band).zip(out_scales.par_chunks_mut(tiles_across))).map(do_band).reduce(CastStats::default, CastStats::merge)
}

/// Inverse of [`quantize_block`]: `out[i] = decode(q[i]) / scale_of_its_tile`.
///
/// # Panics
/// If a tile size is 0 or a buffer length does not match the shape (see [`block_grid`]).
#[allow(clippy::too_many_arguments)]
pub fn dequantize_block(fmt: Fp8Format, q: &[u8], rows: usize, cols: usize, tile_rows: usize, tile_cols: usize, scales: &[f32], out: &mut [f32]) {
    let (_, tiles_across) = check_block_shapes(out.len(), rows, cols, tile_rows, tile_cols, q.len(), scales.len());
    let table = decode_table(fmt);
    for r in 0..rows {
        let srow = &scales[(r / tile_rows) * tiles_across..][..tiles_across];
        for c in 0..cols {
            let i = r * cols + c;
            out[i] = table[q[i] as usize] / srow[c / tile_cols];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_pcg::Pcg64Mcg;

    // ---------- an independent reference, in f64 ----------

    /// Every non-negative finite value of the format with its code, ascending, built from the
    /// textbook definition (f64 powers of two), not from the encoder's bit tricks.
    fn reference_values(fmt: Fp8Format) -> Vec<(f64, u8)> {
        let (ebits, mbits, bias): (u32, u32, i32) = match fmt {
            Fp8Format::E4M3 => (4, 3, 7),
            Fp8Format::E5M2 => (5, 2, 15),
        };
        let mut v = Vec::new();
        for e in 0..(1u32 << ebits) {
            for m in 0..(1u32 << mbits) {
                let code = ((e << mbits) | m) as u8;
                let special = match fmt {
                    Fp8Format::E4M3 => e == 15 && m == 7,
                    Fp8Format::E5M2 => e == 31,
                };
                if special {
                    continue;
                }
                let frac = m as f64 / (1u32 << mbits) as f64;
                let val = if e == 0 { frac * 2f64.powi(1 - bias) } else { (1.0 + frac) * 2f64.powi(e as i32 - bias) };
                v.push((val, code));
            }
        }
        v.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap());
        v
    }

    /// Nearest representable value, ties to the even code (even mantissa), saturating; NaN gives
    /// the canonical NaN.
    fn reference_encode(vals: &[(f64, u8)], x: f32) -> u8 {
        if x.is_nan() {
            return CANONICAL_NAN;
        }
        let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
        let a = (x as f64).abs();
        let (top, top_code) = vals[vals.len() - 1];
        if a >= top {
            return sign | top_code;
        }
        let hi = vals.partition_point(|&(v, _)| v < a); // vals[hi].0 >= a
        if vals[hi].0 == a {
            return sign | vals[hi].1;
        }
        let (lv, lc) = vals[hi - 1];
        let (hv, hc) = vals[hi];
        let (dl, dh) = (a - lv, hv - a);
        let code = if dl < dh {
            lc
        } else if dh < dl {
            hc
        } else if lc & 1 == 0 {
            lc
        } else {
            hc
        };
        sign | code
    }

    fn next_up(x: f32) -> f32 {
        if x.is_nan() || x == f32::INFINITY {
            return x;
        }
        if x == 0.0 {
            return f32::from_bits(1);
        }
        let b = x.to_bits();
        f32::from_bits(if x > 0.0 { b + 1 } else { b - 1 })
    }

    fn next_down(x: f32) -> f32 {
        -next_up(-x)
    }

    /// Every value within 3 f32 ulps of `v`, both signs.
    fn push_neighbourhood(out: &mut Vec<f32>, v: f32) {
        let mut lo = v;
        let mut hi = v;
        out.push(v);
        for _ in 0..3 {
            lo = next_down(lo);
            hi = next_up(hi);
            out.push(lo);
            out.push(hi);
        }
        let n = out.len();
        for i in n - 7..n {
            let x = out[i];
            out.push(-x);
        }
    }

    fn hard_inputs(fmt: Fp8Format, rng: &mut Pcg64Mcg) -> Vec<f32> {
        let vals = reference_values(fmt);
        let mut xs = Vec::new();
        // Every representable value, every midpoint between neighbours, and their neighbours.
        for w in vals.windows(2) {
            push_neighbourhood(&mut xs, w[0].0 as f32);
            push_neighbourhood(&mut xs, ((w[0].0 + w[1].0) / 2.0) as f32);
        }
        // Saturation boundary: max, max + half ulp (the first value that rounds past max),
        // and beyond; half of the smallest subnormal (rounds to 0 on the tie).
        let max = fmt.max() as f64;
        let ulp_max = max - vals[vals.len() - 2].0;
        for v in [max, max + ulp_max / 2.0, max + ulp_max, 2.0 * max, fmt.min_subnormal() as f64 / 2.0] {
            push_neighbourhood(&mut xs, v as f32);
        }
        for v in [0.0f32, f32::MIN_POSITIVE, f32::MAX, f32::INFINITY, f32::NAN, f32::from_bits(1)] {
            push_neighbourhood(&mut xs, v);
        }
        // Random bit patterns: every class of f32 (NaN payloads, subnormals, huge values).
        for _ in 0..500_000 {
            xs.push(f32::from_bits(rng.random::<u32>()));
        }
        // Random values spread over the format's range by exponent, with random mantissa.
        let (lo_e, hi_e) = match fmt {
            Fp8Format::E4M3 => (-12, 10),
            Fp8Format::E5M2 => (-19, 17),
        };
        for _ in 0..500_000 {
            let e = rng.random_range(lo_e..=hi_e);
            let m: u32 = rng.random::<u32>() & 0x007F_FFFF;
            let s: u32 = rng.random::<u32>() & 0x8000_0000;
            xs.push(f32::from_bits(s | (((e + 127) as u32) << 23) | m));
        }
        xs
    }

    #[test]
    fn fp8_format_constants() {
        let e4 = Fp8Format::E4M3;
        let e5 = Fp8Format::E5M2;
        assert_eq!(e4.max(), 448.0);
        assert_eq!(e5.max(), 57344.0);
        assert_eq!(e4.min_normal(), 2f32.powi(-6));
        assert_eq!(e5.min_normal(), 2f32.powi(-14));
        assert_eq!(e4.min_subnormal(), 2f32.powi(-9));
        assert_eq!(e5.min_subnormal(), 2f32.powi(-16));
        assert_eq!(decode(e4, e4.max_code()), 448.0);
        assert_eq!(decode(e5, e5.max_code()), 57344.0);
        for f in Fp8Format::ALL {
            assert_eq!(Fp8Format::parse(f.name()), Some(f));
            assert_eq!(Fp8Format::parse(&f.name().to_uppercase()), Some(f));
            // The params used by the encoder agree with the textbook table.
            let vals = reference_values(f);
            assert_eq!(vals.last().unwrap().0, f.max() as f64);
            assert_eq!(vals[1].0, f.min_subnormal() as f64);
            assert_eq!(vals[1usize << f.mantissa_bits()].0, f.min_normal() as f64);
            assert_eq!(f.magic(), f.min_subnormal() * 2f32.powi(23));
        }
        assert_eq!(Fp8Format::parse("e4m3fn"), Some(e4));
        assert_eq!(Fp8Format::parse("fp8"), None);
        assert_eq!(Fp8Format::parse(""), None);
    }

    impl Fp8Format {
        fn magic(self) -> f32 {
            self.params().magic
        }
    }

    #[test]
    fn fp8_all_codes_decode_and_reencode() {
        for fmt in Fp8Format::ALL {
            let vals = reference_values(fmt);
            let mut nan_codes = 0;
            let mut inf_codes = 0;
            for code in 0..=255u8 {
                let v = decode(fmt, code);
                if fmt.is_nan_code(code) {
                    nan_codes += 1;
                    assert!(v.is_nan(), "{fmt} {code:#04x} should decode to NaN");
                    assert_eq!(v.is_sign_negative(), code & 0x80 != 0);
                    // Any NaN re-encodes to the canonical NaN 0x7F, itself a NaN code.
                    assert_eq!(encode(fmt, v), CANONICAL_NAN);
                    assert!(fmt.is_nan_code(CANONICAL_NAN));
                    continue;
                }
                if fmt.is_inf_code(code) {
                    inf_codes += 1;
                    assert!(v.is_infinite() && v.is_sign_negative() == (code & 0x80 != 0));
                    // satfinite: ±Inf re-encodes to ±max, not to the infinity code.
                    assert_eq!(encode(fmt, v), (code & 0x80) | fmt.max_code());
                    continue;
                }
                // Exact value from the textbook table.
                let mag = code & 0x7F;
                let expect = vals.iter().find(|&&(_, c)| c == mag).unwrap().0;
                assert_eq!(v.abs() as f64, expect, "{fmt} {code:#04x}");
                assert_eq!(v.is_sign_negative(), code & 0x80 != 0, "{fmt} {code:#04x} sign");
                assert_eq!(encode(fmt, v), code, "{fmt} {code:#04x} does not round-trip");
            }
            match fmt {
                Fp8Format::E4M3 => assert_eq!((nan_codes, inf_codes), (2, 0)),
                Fp8Format::E5M2 => assert_eq!((nan_codes, inf_codes), (6, 2)),
            }
            assert_eq!(encode(fmt, -0.0), 0x80);
            assert_eq!(encode(fmt, 0.0), 0x00);
            // Positive finite codes decode in strictly increasing order.
            let last = if fmt == Fp8Format::E4M3 { 0x7E } else { 0x7B };
            for c in 1..=last {
                assert!(decode(fmt, c) > decode(fmt, c - 1));
            }
        }
    }

    #[test]
    fn fp8_encode_matches_reference_on_every_bf16() {
        for fmt in Fp8Format::ALL {
            let vals = reference_values(fmt);
            let mut matched = 0u32;
            for h in 0..=u16::MAX {
                let x = f32::from_bits(u32::from(h) << 16);
                let got = encode(fmt, x);
                let want = reference_encode(&vals, x);
                assert_eq!(got, want, "{fmt}: bf16 {h:#06x} ({x:e}): got {got:#04x}, want {want:#04x}");
                matched += 1;
            }
            assert_eq!(matched, 65536);
            eprintln!("{fmt}: {matched} of 65536 bf16 patterns match the f64 reference");
        }
    }

    #[test]
    fn fp8_encode_matches_reference_on_random_and_boundary_f32() {
        let mut rng = Pcg64Mcg::seed_from_u64(0x5eed_f8);
        for fmt in Fp8Format::ALL {
            let vals = reference_values(fmt);
            let xs = hard_inputs(fmt, &mut rng);
            assert!(xs.len() > 900_000, "only {} inputs", xs.len());
            let mut ties = 0u32;
            for &x in &xs {
                let got = encode(fmt, x);
                let want = reference_encode(&vals, x);
                assert_eq!(got, want, "{fmt}: {x:e} ({:#010x}): got {got:#04x}, want {want:#04x}", x.to_bits());
                // Count exact ties that were decided by the even rule.
                let a = x.abs() as f64;
                let hi = vals.partition_point(|&(v, _)| v < a);
                if hi > 0 && hi < vals.len() && vals[hi].0 != a && a - vals[hi - 1].0 == vals[hi].0 - a {
                    ties += 1;
                }
            }
            assert!(ties > 200, "{fmt}: only {ties} exact ties were exercised");
            eprintln!("{fmt}: {} of {} random/boundary f32 match the f64 reference ({ties} ties)", xs.len(), xs.len());
        }
    }

    /// Fixed expectations that pin the rules down independently of the reference.
    #[test]
    fn fp8_encode_known_cases() {
        use Fp8Format::*;
        // Saturation, including the exact tie max + ulp/2 and infinities.
        assert_eq!(encode(E4M3, 464.0), 0x7E);
        assert_eq!(encode(E4M3, 1e9), 0x7E);
        assert_eq!(encode(E4M3, f32::NEG_INFINITY), 0xFE);
        assert_eq!(encode(E5M2, 61440.0), 0x7B);
        assert_eq!(encode(E5M2, f32::INFINITY), 0x7B);
        assert_eq!(encode(E5M2, -f32::MAX), 0xFB);
        // Ties to even: 1 + 1/16 lies between 1 (0x38, even) and 1.125 (0x39).
        assert_eq!(encode(E4M3, 1.0625), 0x38);
        assert_eq!(encode(E4M3, 1.1875), 0x3A); // between 0x39 and 0x3A -> 0x3A (even)
        assert_eq!(encode(E4M3, next_up(1.0625)), 0x39);
        // Rounding up across an exponent boundary: 1.9375 -> 2.0.
        assert_eq!(encode(E4M3, 1.9375), 0x40);
        // Subnormals: 2^-10 is half the smallest subnormal -> 0 (tie to even); just above -> 1.
        assert_eq!(encode(E4M3, 2f32.powi(-10)), 0x00);
        assert_eq!(encode(E4M3, next_up(2f32.powi(-10))), 0x01);
        assert_eq!(encode(E4M3, -1.5 * 2f32.powi(-9)), 0x82); // tie 1|2 -> 2 (even)
        assert_eq!(encode(E5M2, 2f32.powi(-17)), 0x00);
        assert_eq!(encode(E5M2, 3.0 * 2f32.powi(-17)), 0x02); // 1.5 ulps: tie 1|2 -> 2
        // Largest subnormal rounding up into the smallest normal.
        assert_eq!(encode(E4M3, 7.5 * 2f32.powi(-9)), 0x08);
        // NaN, any sign or payload: 0x7F, as the H200 gives.
        for bits in [0x7FC0_0000u32, 0xFFC0_0000, 0x7F80_0001, 0xFFFF_FFFF] {
            assert_eq!(encode(E4M3, f32::from_bits(bits)), 0x7F);
            assert_eq!(encode(E5M2, f32::from_bits(bits)), 0x7F);
        }
    }

    fn fnv1a(bytes: impl Iterator<Item = u8>) -> u64 {
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        for b in bytes {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        h
    }

    /// Regression against the hardware: an H200 ran `cvt.rn.satfinite.{e4m3,e5m2}x2.f32` on every
    /// bf16 pattern (as f32) and on 2^21 f32 bit patterns from a xorshift64 generator (state
    /// 0x9E3779B97F4A7C15, shifts 13/7/17, high 32 bits); these are FNV-1a hashes of its output
    /// bytes. Any difference from the GPU changes a hash.
    #[test]
    fn fp8_encode_matches_h200_cvt_satfinite() {
        let mut s = 0x9E37_79B9_7F4A_7C15u64;
        let random: Vec<f32> = (0..1usize << 21)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                f32::from_bits((s >> 32) as u32)
            })
            .collect();
        let expected = [(Fp8Format::E4M3, 0xd8b2_feb6_74a3_1125u64, 0x5b83_6a83_523b_82f4u64), (Fp8Format::E5M2, 0x22c1_0a2b_6f34_bb85, 0xd2ec_6766_b3bf_38b0)];
        for (fmt, h_bf16, h_random) in expected {
            let bf16 = fnv1a((0..=u16::MAX).map(|h| encode(fmt, f32::from_bits(u32::from(h) << 16))));
            let rnd = fnv1a(random.iter().map(|&x| encode(fmt, x)));
            assert_eq!(bf16, h_bf16, "{fmt}: bf16 sweep differs from the H200");
            assert_eq!(rnd, h_random, "{fmt}: random f32 sweep differs from the H200");
        }
    }

    #[test]
    fn fp8_quantize_equals_serial_cast() {
        let mut rng = Pcg64Mcg::seed_from_u64(7);
        let n = 5 * PAR_CHUNK + 12_345;
        let x: Vec<f32> = (0..n)
            .map(|i| match i % 1000 {
                0 => f32::NAN,
                1 => f32::NEG_INFINITY,
                2 => 0.0,
                _ => (rng.random::<f32>() - 0.5) * 2f32.powi(rng.random_range(-30..20)),
            })
            .collect();
        for fmt in Fp8Format::ALL {
            let scale = scale_for_amax(fmt, amax(&x), 0) * 0.75;
            let mut q = vec![0u8; n];
            let stats = quantize(fmt, &x, scale, &mut q);
            let mut serial = vec![0u8; n];
            for (o, &v) in serial.iter_mut().zip(&x) {
                *o = cast(fmt, v, scale);
            }
            assert_eq!(q, serial, "{fmt}: parallel quantize differs from the serial loop");
            let serial_stats = quantize_serial(fmt, &x, scale, &mut serial);
            assert_eq!(stats, serial_stats);
            assert_eq!(stats.len(), n as u64);
            assert_eq!(stats.amax, amax_serial(&x));
            assert_eq!(amax(&x), amax_serial(&x));
            assert!(stats.saturated > 0 && stats.underflow > 0, "{stats:?}");

            // Dequantize: division by the scale.
            let mut back = vec![0f32; n];
            dequantize(fmt, &q, scale, &mut back);
            for i in 0..n {
                let d = decode(fmt, q[i]) / scale;
                assert!(back[i].to_bits() == d.to_bits() || (back[i].is_nan() && d.is_nan()));
            }
        }
    }

    #[test]
    fn fp8_cast_stats_counts() {
        let fmt = Fp8Format::E4M3;
        let scale = 2.0f32;
        let x = [
            0.0,               // zero
            -0.0,              // zero
            1.0,               // normal -> 2.0
            2f32.powi(-11),    // * 2 = 2^-10: tie to 0 -> underflow
            -1e-20,            // underflow (negative -> 0x80)
            2f32.powi(-10),    // * 2 = 2^-9: smallest subnormal, no underflow
            224.0,             // * 2 = 448: exactly max, not saturated
            225.0,             // * 2 = 450 > 448: saturated
            -1e6,              // saturated
            f32::MAX,          // product overflows f32 to inf: saturated, finite input
            f32::INFINITY,     // inf, saturated
            f32::NEG_INFINITY, // inf, saturated
            f32::NAN,          // nan
            -f32::NAN,         // nan
        ];
        let mut q = [0u8; 14];
        let s = quantize(fmt, &x, scale, &mut q);
        assert_eq!(s.zeros, 2);
        assert_eq!(s.underflow, 2);
        assert_eq!(s.saturated, 5);
        assert_eq!(s.nan, 2);
        assert_eq!(s.inf, 2);
        assert_eq!(s.nonzero, 8);
        assert_eq!(s.len(), 14);
        assert_eq!(s.amax, f32::MAX);
        assert_eq!(q, [0x00, 0x80, 0x40, 0x00, 0x80, 0x01, 0x7E, 0x7E, 0xFE, 0x7E, 0x7E, 0xFE, 0x7F, 0x7F]);
        // amax ignores NaN and Inf.
        assert_eq!(amax(&[1.0, f32::NAN, -3.0, f32::INFINITY]), 3.0);
        assert_eq!(amax(&[]), 0.0);
        assert_eq!(amax(&[f32::NAN]), 0.0);
    }

    #[test]
    fn fp8_scale_for_amax_rules() {
        let e4 = Fp8Format::E4M3;
        assert_eq!(scale_for_amax(e4, 448.0, 0), 1.0);
        assert_eq!(scale_for_amax(e4, 1.0, 0), 448.0);
        assert_eq!(scale_for_amax(e4, 1.0, 2), 112.0);
        assert_eq!(scale_for_amax(e4, 3.0, 1), (448.0f32 / 3.0) / 2.0);
        assert_eq!(scale_for_amax(Fp8Format::E5M2, 2.0, -1), 57344.0);
        for bad in [0.0, -1.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            assert_eq!(scale_for_amax(e4, bad, 0), 1.0, "amax {bad}");
        }
        // Tiny amax: 448 / 1e-40 overflows; clamped to f32::MAX.
        assert_eq!(scale_for_amax(e4, 1e-40, 0), f32::MAX);
        assert_eq!(scale_for_amax(e4, 1e-40, -300), f32::MAX);
        assert_eq!(scale_for_amax(e4, 1e30, 200), f32::MIN_POSITIVE);
        assert_eq!(exp2i(-149), f32::from_bits(1));
        assert_eq!(exp2i(127), 2f32.powi(127));
        assert_eq!(exp2i(-126), f32::MIN_POSITIVE);
    }

    /// quantize_block against a direct per-tile computation on a 256x300 matrix (300 is not a
    /// multiple of 128: the last column of tiles is 44 wide).
    #[test]
    fn fp8_quantize_block_matches_per_tile() {
        let (rows, cols) = (256usize, 300usize);
        let mut rng = Pcg64Mcg::seed_from_u64(11);
        let mut x: Vec<f32> = (0..rows * cols)
            .map(|i| {
                let r = i / cols;
                // Rows with very different magnitudes so tiles get different scales.
                (rng.random::<f32>() - 0.5) * 2f32.powi((r % 17) as i32 - 8)
            })
            .collect();
        // An all-zero tile (1x128 tile at row 5, tiles 0) and special values.
        for v in &mut x[5 * cols..5 * cols + 128] {
            *v = 0.0;
        }
        x[7 * cols + 3] = f32::NAN;
        x[9 * cols + 299] = f32::INFINITY;
        for fmt in Fp8Format::ALL {
            for (tr, tc) in [(1usize, 128usize), (128, 128)] {
                let (nr, nc) = block_grid(rows, cols, tr, tc);
                assert_eq!((nr, nc), (rows.div_ceil(tr), 3));
                let mut q = vec![0u8; rows * cols];
                let mut scales = vec![0f32; nr * nc];
                let stats = quantize_block(fmt, &x, rows, cols, tr, tc, 0, &mut q, &mut scales);

                let mut total = CastStats::default();
                let mut distinct = std::collections::BTreeSet::new();
                for ti in 0..nr {
                    for tj in 0..nc {
                        let (r0, r1) = (ti * tr, ((ti + 1) * tr).min(rows));
                        let (c0, c1) = (tj * tc, ((tj + 1) * tc).min(cols));
                        let mut tile = Vec::new();
                        for r in r0..r1 {
                            tile.extend_from_slice(&x[r * cols + c0..r * cols + c1]);
                        }
                        let scale = scale_for_amax(fmt, amax(&tile), 0);
                        assert_eq!(scales[ti * nc + tj].to_bits(), scale.to_bits(), "tile {ti},{tj}");
                        distinct.insert(scale.to_bits());
                        let mut tq = vec![0u8; tile.len()];
                        total = total.merge(quantize(fmt, &tile, scale, &mut tq));
                        let mut k = 0;
                        for r in r0..r1 {
                            for c in c0..c1 {
                                assert_eq!(q[r * cols + c], tq[k], "{fmt} ({r},{c})");
                                k += 1;
                            }
                        }
                    }
                }
                assert_eq!(stats, total);
                assert!(distinct.len() > 5, "tiles should have different scales");
                if tr == 1 {
                    assert_eq!(scales[5 * nc], 1.0, "an all-zero tile gets scale 1");
                }
                assert_eq!(stats.nan, 1);
                assert_eq!(stats.inf, 1);

                let mut back = vec![0f32; rows * cols];
                dequantize_block(fmt, &q, rows, cols, tr, tc, &scales, &mut back);
                let i = 200 * cols + 250;
                assert_eq!(back[i], decode(fmt, q[i]) / scales[(200 / tr) * nc + 250 / tc]);
            }
        }
    }

    #[test]
    #[should_panic(expected = "scale buffer length")]
    fn fp8_quantize_block_rejects_bad_scale_buffer() {
        let x = vec![0f32; 4 * 130];
        let mut q = vec![0u8; 4 * 130];
        let mut s = vec![0f32; 4]; // needs 4 * 2
        quantize_block(Fp8Format::E4M3, &x, 4, 130, 1, 128, 0, &mut q, &mut s);
    }
}
