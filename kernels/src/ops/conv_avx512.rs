//! AVX-512 forms of the convolution's two hot loops, for `f32` on CPUs that have AVX-512F and AVX-512DQ.
//!
//! Each computes exactly what its portable twin in `conv.rs` computes, in the same order: every output of
//! the correlation is one fused multiply-add chain over (source channel, tap), and every weight-gradient
//! lane sums the positions `q ≡ lane (mod 8)` in increasing `q`. Only the register blocking is wider, so
//! the results are bit-identical to the AVX2 and scalar paths (the conv tests compare them on every shape
//! where this path applies).
//!
//! * [`correlate_rows8`]: eight output channels × 32 positions in sixteen 512-bit accumulators (the AVX2
//!   path holds four channels × 16 positions: with 32 registers there is room for twice as many chains
//!   per loaded run of input). Where rows are whole registers (`w` a multiple of 16) or half registers
//!   (8×8 planes, two rows a register) it writes straight into the destination planes: no junk positions
//!   and no copy out of a tile buffer; elsewhere it takes the padded-width layout, junk included, as one
//!   row into a tile.
//! * [`weight_grad_taps3x3`]: all nine taps of a 3×3 kernel for a block of four output channels at once.
//!   A 512-bit register holds the eight lane partial sums of two output channels for one tap, so one
//!   load of eight input positions (broadcast to both halves) feeds two channels, and the output
//!   gradient is read once for all nine taps instead of once per kernel row.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use super::real::LANES;

/// Whether this CPU can run the functions of this module.
pub fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx512dq")
}

/// Positions per 512-bit register.
const WIDTH: usize = 16;

/// Eight output channels of a correlation, `out[j][p] = Σ_s Σ_t packed[s][t][j] · src[s][tap_t(p)]`, the
/// sum a fused multiply-add chain in (s, t) order from 0 as in `correlate_block`, written straight into
/// the destination planes, for a correlation that keeps the plane's size and whose rows are whole
/// registers (`w` a multiple of 16) or, with `HALVES`, half registers (`w` = 8, `h` even): register `v` holds the 16 positions from `p = 16·v`, and its two halves of
/// eight read the padded plane from `(q / w)·wp + q mod w` for `q = p` and `q = p + 8` (one contiguous run
/// when the row is whole registers, two rows' runs otherwise). So every output is the same chain over the
/// same padded values as in the padded-width layout and gets the same bits, without that layout's junk
/// positions (2 of every `w + 2`; at 8×8, 32 of 96 computed positions) and without the copy out of a tile
/// buffer. With `(h, w) = (1, q_round)` and `wp = q_round` it computes the padded-width layout itself,
/// junk included, into a tile of `q_round` per channel.
///
/// `src` holds `n_src` padded planes of `plane` elements (row width `wp`); `out` 8 planes of `h·w`
/// elements; `packed` is `[n_src][taps.len()][8]`. With `accumulate` each output is added to what `out`
/// holds (`out + sum`).
///
/// # Safety
/// The CPU must support AVX-512F and AVX-512DQ ([`available`]).
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512dq")]
pub unsafe fn correlate_rows8<const HALVES: bool>(
    src: &[f32],
    plane: usize,
    wp: usize,
    (h, w): (usize, usize),
    taps: &[usize],
    packed: &[f32],
    out: &mut [f32],
    accumulate: bool,
) {
    const N: usize = 8;
    const HALF: usize = WIDTH / 2;
    let kk = taps.len();
    let n_src = src.len() / plane;
    let out_plane = h * w;
    let vectors = out_plane / WIDTH;
    if HALVES {
        assert!(w == HALF && h.is_multiple_of(2) && wp >= w, "rows are half registers, in pairs");
    } else {
        assert!(w.is_multiple_of(WIDTH) && wp >= w, "rows are whole registers");
    }
    assert!(
        taps.iter().all(|&t| (h - 1) * wp + w + t <= plane),
        "every tap's run of every row stays inside its plane"
    );
    assert_eq!(packed.len(), n_src * kk * N, "packed weights");
    assert!(out.len() >= N * out_plane, "output planes");
    let (src, packed, out) = (src.as_ptr(), packed.as_ptr(), out.as_mut_ptr());
    // Where the half register of positions from q reads the padded plane.
    let base = |q: usize| (q / w) * wp + q % w;
    // SAFETY (both loads): a half register's run of 8 from base(q) + tap stays in its row's run of w,
    // which ends at (h − 1)·wp + w + tap ≤ plane at most (asserted), inside the plane `run` points into.
    let load = |run: *const f32, v: usize| unsafe {
        if HALVES {
            let lo = _mm256_loadu_ps(run.add(base(v * WIDTH)));
            let hi = _mm256_loadu_ps(run.add(base(v * WIDTH + HALF)));
            _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1)
        } else {
            _mm512_loadu_ps(run.add(base(v * WIDTH)))
        }
    };
    // SAFETY: row j of out has out_plane ≥ p + 16 elements.
    let finish = |j: usize, p: usize, acc: __m512| unsafe {
        let at = out.add(j * out_plane + p);
        let value = if accumulate { _mm512_add_ps(_mm512_loadu_ps(at), acc) } else { acc };
        _mm512_storeu_ps(at, value);
    };
    let mut v = 0;
    // Two registers of positions per channel while they fit, then one.
    while v + 2 <= vectors {
        let mut acc = [_mm512_setzero_ps(); 2 * N];
        for s in 0..n_src {
            for t in 0..kk {
                // SAFETY: plane s of src, shifted by a tap (see `load`); (s·kk + t)·8 + 7 < packed.len()
                // (asserted).
                unsafe {
                    let run = src.add(s * plane + taps[t]);
                    let (r0, r1) = (load(run, v), load(run, v + 1));
                    let w = packed.add((s * kk + t) * N);
                    for j in 0..N {
                        let wv = _mm512_set1_ps(*w.add(j));
                        acc[2 * j] = _mm512_fmadd_ps(wv, r0, acc[2 * j]);
                        acc[2 * j + 1] = _mm512_fmadd_ps(wv, r1, acc[2 * j + 1]);
                    }
                }
            }
        }
        for j in 0..N {
            finish(j, v * WIDTH, acc[2 * j]);
            finish(j, (v + 1) * WIDTH, acc[2 * j + 1]);
        }
        v += 2;
    }
    if v < vectors {
        let mut acc = [_mm512_setzero_ps(); N];
        for s in 0..n_src {
            for t in 0..kk {
                // SAFETY: as above.
                unsafe {
                    let r0 = load(src.add(s * plane + taps[t]), v);
                    let w = packed.add((s * kk + t) * N);
                    for j in 0..N {
                        acc[j] = _mm512_fmadd_ps(_mm512_set1_ps(*w.add(j)), r0, acc[j]);
                    }
                }
            }
        }
        for j in 0..N {
            finish(j, v * WIDTH, acc[j]);
        }
    }
}

/// A run of images for [`weight_grad_taps3x3`]: image `i`'s padded input plane starts at
/// `planes[i·plane_stride]`, and its block's interleaved output gradient (`[q_round / 8][4][8]`, zero on
/// junk positions) at `dy[i·dy_stride]`.
pub struct TapImages<'a> {
    pub planes: &'a [f32],
    pub plane_stride: usize,
    pub dy: &'a [f32],
    pub dy_stride: usize,
    pub images: usize,
    pub q_round: usize,
}

/// Adds a run of images' contributions, image after image, to the lane partial sums of the weight
/// gradient of a block of four output channels, for one input channel `c` and all nine taps of a 3×3
/// kernel: `lanes[(j·cin_g + c)·9 + t][l] += Σ_{q ≡ l mod 8, increasing} dy[j][q] · plane[q + taps[t]]`,
/// each step one fused multiply-add, as in `tap_row_partials`. The partial sums stay in registers for the
/// whole run.
///
/// `lanes` is the block's `[4][cin_g][9][8]` partial sums.
///
/// # Safety
/// The CPU must support AVX-512F and AVX-512DQ ([`available`]).
#[target_feature(enable = "avx512f,avx512dq")]
pub unsafe fn weight_grad_taps3x3(
    run: TapImages<'_>,
    taps: &[usize; 9],
    lanes: &mut [f32],
    c: usize,
    cin_g: usize,
) {
    const N: usize = 4;
    const KK: usize = 9;
    let TapImages { planes, plane_stride, dy, dy_stride, images, q_round } = run;
    assert_eq!(LANES, 8, "a 256-bit half holds one set of lane sums");
    assert_eq!(q_round % LANES, 0, "positions are whole lane groups");
    assert!(images > 0, "a run has images");
    let last = images - 1;
    assert!(
        taps.iter().all(|&t| last * plane_stride + t + q_round <= planes.len()),
        "every tap's run of every image stays inside its plane"
    );
    assert!(last * dy_stride + N * q_round <= dy.len(), "interleaved output gradient");
    assert!(c < cin_g && lanes.len() >= N * cin_g * KK * LANES, "lane sums");
    let lane_at = |j: usize, t: usize| ((j * cin_g + c) * KK + t) * LANES;
    let (planes, dy, lanes) = (planes.as_ptr(), dy.as_ptr(), lanes.as_mut_ptr());
    // aT_P: the low half holds channel 2P's lanes of tap T, the high half channel 2P + 1's. Named
    // registers rather than an array: with an array LLVM spilled accumulators to the stack in the loop.
    // SAFETY (every load and store of lanes): lane_at(j, t) + 8 ≤ N·cin_g·9·8 ≤ lanes.len() (asserted).
    let load = |t: usize, p: usize| unsafe {
        let lo = _mm256_loadu_ps(lanes.add(lane_at(2 * p, t)));
        let hi = _mm256_loadu_ps(lanes.add(lane_at(2 * p + 1, t)));
        _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1)
    };
    let (mut a0_0, mut a0_1, mut a1_0, mut a1_1, mut a2_0, mut a2_1) =
        (load(0, 0), load(0, 1), load(1, 0), load(1, 1), load(2, 0), load(2, 1));
    let (mut a3_0, mut a3_1, mut a4_0, mut a4_1, mut a5_0, mut a5_1) =
        (load(3, 0), load(3, 1), load(4, 0), load(4, 1), load(5, 0), load(5, 1));
    let (mut a6_0, mut a6_1, mut a7_0, mut a7_1, mut a8_0, mut a8_1) =
        (load(6, 0), load(6, 1), load(7, 0), load(7, 1), load(8, 0), load(8, 1));
    for i in 0..images {
        let plane = planes.wrapping_add(i * plane_stride);
        let dy = dy.wrapping_add(i * dy_stride);
        let x: [*const f32; KK] = std::array::from_fn(|t| plane.wrapping_add(taps[t]));
        let mut q0 = 0;
        while q0 < q_round {
            // SAFETY: i < images and q0 + 8 ≤ q_round, so the block's 32 interleaved values at q0 lie in dy and
            // every tap's eight positions lie in image i's plane (asserted above).
            unsafe {
                let d = dy.add((q0 / LANES) * N * LANES);
                let (d01, d23) = (_mm512_loadu_ps(d), _mm512_loadu_ps(d.add(2 * LANES)));
                macro_rules! tap {
                    ($t:literal, $a0:ident, $a1:ident) => {
                        let xb = _mm512_broadcast_f32x8(_mm256_loadu_ps(x[$t].add(q0)));
                        $a0 = _mm512_fmadd_ps(d01, xb, $a0);
                        $a1 = _mm512_fmadd_ps(d23, xb, $a1);
                    };
                }
                tap!(0, a0_0, a0_1);
                tap!(1, a1_0, a1_1);
                tap!(2, a2_0, a2_1);
                tap!(3, a3_0, a3_1);
                tap!(4, a4_0, a4_1);
                tap!(5, a5_0, a5_1);
                tap!(6, a6_0, a6_1);
                tap!(7, a7_0, a7_1);
                tap!(8, a8_0, a8_1);
            }
            q0 += LANES;
        }
    }
    let store = |t: usize, p: usize, acc: __m512| unsafe {
        _mm256_storeu_ps(lanes.add(lane_at(2 * p, t)), _mm512_castps512_ps256(acc));
        _mm256_storeu_ps(lanes.add(lane_at(2 * p + 1, t)), _mm512_extractf32x8_ps(acc, 1));
    };
    let sums = [
        a0_0, a0_1, a1_0, a1_1, a2_0, a2_1, a3_0, a3_1, a4_0, a4_1, a5_0, a5_1, a6_0, a6_1, a7_0, a7_1, a8_0,
        a8_1,
    ];
    for (i, acc) in sums.into_iter().enumerate() {
        store(i / 2, i % 2, acc);
    }
}
