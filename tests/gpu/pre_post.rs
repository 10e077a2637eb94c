//! The backward's pre/postprocess kernels against host references: delta within the fp32
//! summation bound of an f64 reference, and the bf16 casts of dQ and of the gathered dK/dV pools
//! bit for bit equal to `half::bf16::from_f32` (round to nearest even).

use half::bf16;
use msa::cuda::{CudaMsa, Poison};
use msa_harness::check::{compare, CheckLine, CheckReport};
use msa_plan::testing::{layout_from_documents, SplitMix64};
use msa_plan::topology::{BLOCK_SIZE, HEAD_DIM, NUM_KV_HEADS, NUM_Q_HEADS};
use msa_plan::VarlenLayout;
use serde_json::json;

use crate::harness;
use crate::prepare::{device_layout, fetch, Sweep};

/// Unit roundoff of fp32.
const U32: f64 = 1.0 / (1u64 << 24) as f64;
/// Roundings on any path of the device sum: 7 sequential fma (the first product is exact) and
/// 4 butterfly levels; the error is at most gamma_11 · Σ|products| < 12u · Σ|products|.
const DELTA_ROUNDINGS: f64 = 12.0;

/// Layouts for the elementwise kernels: one token, a document below one block, and CP
/// fragments with shared, partial and padding physical blocks.
fn layouts() -> Vec<(&'static str, VarlenLayout)> {
    vec![
        ("one_token", VarlenLayout::documents(&[0, 1]).unwrap()),
        (
            "below_one_block",
            VarlenLayout::documents(&[0, 37]).unwrap(),
        ),
        (
            "cp_fragments",
            layout_from_documents(
                &[
                    vec![(10, 50), (200, 260), (700, 1300)],
                    vec![],
                    vec![(0, 5)],
                    vec![(0, 129), (1000, 2049)],
                ],
                false,
            ),
        ),
        (
            "documents",
            VarlenLayout::documents(&[0, 1000, 1001, 3000]).unwrap(),
        ),
    ]
}

/// A random finite f32: random bits (every exponent, subnormals, infinities; NaN payloads
/// become infinities) or a moderate value, alternately.
fn random_f32(rng: &mut SplitMix64, i: usize) -> f32 {
    let bits = rng.next_u64() as u32;
    if i.is_multiple_of(2) {
        let nan = bits & 0x7f80_0000 == 0x7f80_0000 && bits & 0x007f_ffff != 0;
        f32::from_bits(if nan { bits & 0xff80_0000 } else { bits })
    } else {
        (bits as f32 / u32::MAX as f32 - 0.5) * 8.0
    }
}

/// Values where rounding to bf16 is decided: exact ties with both parities of the kept last bit,
/// just below/above ties, the largest finite values (they round to infinity), subnormals, zeros.
fn special_f32() -> Vec<f32> {
    let mut v = vec![
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MAX,
        f32::MIN,
        f32::MIN_POSITIVE,
        -f32::MIN_POSITIVE,
        f32::from_bits(1),
        f32::from_bits(0x8000_0001),
        f32::from_bits(0x007f_ffff),
        1.0,
        -1.0,
    ];
    for hi in [0x3f80u32, 0x3f81, 0x7f7f, 0x0000, 0x0001, 0xbf80, 0xbf81] {
        for lo in [0x7fffu32, 0x8000, 0x8001, 0xffff] {
            v.push(f32::from_bits(hi << 16 | lo));
        }
    }
    v
}

fn bf16_bits(values: &[f32]) -> Vec<u16> {
    values
        .iter()
        .map(|&x| bf16::from_f32(x).to_bits())
        .collect()
}

fn download_bits(msa: &CudaMsa, name: &str, buf: &cudarc::driver::CudaSlice<bf16>) -> Vec<u16> {
    fetch(msa, name, buf).iter().map(|x| x.to_bits()).collect()
}

#[test]
fn delta_matches_an_f64_reference_within_fp32_summation() {
    let msa = harness::device();
    let mut sweep = Sweep::new("pre_post_delta");
    for (name, layout) in layouts() {
        let t = layout.total_q();
        let rows = t * NUM_Q_HEADS;
        let mut rng = SplitMix64::new(0xDE17A + t as u64);
        let mut out = Vec::with_capacity(rows * HEAD_DIM);
        let mut dout = Vec::with_capacity(rows * HEAD_DIM);
        for row in 0..rows {
            // Per row: a scale 2^-20..2^20 for each tensor; every eighth row cancels (dout = ±out).
            let so = (2f32).powi(rng.below(41) as i32 - 20);
            let sd = (2f32).powi(rng.below(41) as i32 - 20);
            for d in 0..HEAD_DIM {
                let o = bf16::from_f32((rng.next_u64() as u32 as f32 / u32::MAX as f32 - 0.5) * so);
                let g = if row % 8 == 0 {
                    if d % 2 == 0 {
                        o
                    } else {
                        -o
                    }
                } else {
                    bf16::from_f32((rng.next_u64() as u32 as f32 / u32::MAX as f32 - 0.5) * sd)
                };
                out.push(o);
                dout.push(g);
            }
        }
        let dl = device_layout(msa, &layout);
        let out_d = msa.upload(&out).unwrap();
        let dout_d = msa.upload(&dout).unwrap();
        let mut delta = msa.output::<f32>(rows).unwrap();
        msa.backward_delta_into(&dl, &out_d, &dout_d, &mut delta, None)
            .unwrap_or_else(|e| panic!("{name}: delta: {e}"));
        let got = fetch(msa, "delta", &delta);
        // The norm variant: the same delta bit for bit, and |dout| per row within fp32 summation
        // (128 squares, a root) of an f64 reference; the dQ grid allows x 1.0001.
        let mut delta2 = msa.output::<f32>(rows).unwrap();
        let mut norm = msa.output::<f32>(rows).unwrap();
        msa.backward_delta_into(&dl, &out_d, &dout_d, &mut delta2, Some(&mut norm))
            .unwrap_or_else(|e| panic!("{name}: delta and norm: {e}"));
        let got2 = fetch(msa, "delta", &delta2);
        let norms = fetch(msa, "dout_norm", &norm);
        let same = got
            .iter()
            .zip(&got2)
            .filter(|(a, b)| a.to_bits() == b.to_bits())
            .count();
        let mut norm_worst = 0f64;
        for row in 0..rows {
            let exact = dout[row * HEAD_DIM..][..HEAD_DIM]
                .iter()
                .map(|g| g.to_f64() * g.to_f64())
                .sum::<f64>()
                .sqrt();
            let rel = if exact == 0.0 {
                norms[row].abs() as f64
            } else {
                (norms[row] as f64 - exact).abs() / exact
            };
            norm_worst = if rel.is_nan() {
                f64::INFINITY
            } else {
                norm_worst.max(rel)
            };
        }
        let (mut worst, mut worst_row, mut bad) = (0f64, 0usize, 0usize);
        for row in 0..rows {
            let (mut exact, mut magnitude) = (0f64, 0f64);
            for d in 0..HEAD_DIM {
                let p = out[row * HEAD_DIM + d].to_f64() * dout[row * HEAD_DIM + d].to_f64();
                exact += p;
                magnitude += p.abs();
            }
            let bound = DELTA_ROUNDINGS * U32 * magnitude;
            let err = (got[row] as f64 - exact).abs();
            let ratio = if !got[row].is_finite() {
                f64::INFINITY
            } else if err == 0.0 {
                0.0
            } else {
                err / bound
            };
            if ratio > 1.0 {
                bad += 1;
            }
            if ratio > worst || ratio.is_nan() {
                (worst, worst_row) = (ratio, row);
            }
        }
        let mut report = CheckReport::default();
        report.push(CheckLine {
            tensor: "delta".into(),
            metric: "err/bound",
            value: worst,
            limit: 1.0,
            passed: bad == 0,
            detail: format!(
                "bound {DELTA_ROUNDINGS}u·Σ|out·dout|; {bad} of {rows} rows over; worst row {worst_row} \
                 (t {}, h {}): device {:e}",
                worst_row / NUM_Q_HEADS,
                worst_row % NUM_Q_HEADS,
                got[worst_row]
            ),
        });
        report.push(CheckLine {
            tensor: "delta (norm variant)".into(),
            metric: "rows bitwise equal",
            value: same as f64,
            limit: rows as f64,
            passed: same == rows,
            detail: format!("{same} of {rows}"),
        });
        report.push(CheckLine {
            tensor: "dout_norm".into(),
            metric: "max relative error",
            value: norm_worst,
            limit: 2e-5,
            passed: norm_worst <= 2e-5,
            detail: "against an f64 sum of squares".into(),
        });
        sweep.record(name, &report, json!({ "total_q": t }));
    }
    sweep.finish();
}

#[test]
fn dq_cast_rounds_like_the_host() {
    let msa = harness::device();
    let mut sweep = Sweep::new("pre_post_dq");
    for (name, layout) in layouts() {
        let n = layout.total_q() * NUM_Q_HEADS * HEAD_DIM;
        let mut rng = SplitMix64::new(0xD0 + n as u64);
        let mut accum: Vec<f32> = (0..n).map(|i| random_f32(&mut rng, i)).collect();
        for (slot, v) in accum.iter_mut().zip(special_f32()) {
            *slot = v;
        }
        let dl = device_layout(msa, &layout);
        let accum_d = msa.upload(&accum).unwrap();
        let mut dq = msa.output::<bf16>(n).unwrap();
        msa.backward_postprocess_dq_into(&dl, &accum_d, &mut dq)
            .unwrap_or_else(|e| panic!("{name}: dq cast: {e}"));
        let mut report = CheckReport::default();
        report.push(compare::bitwise(
            "dq",
            &download_bits(msa, "dq", &dq),
            &bf16_bits(&accum),
        ));
        sweep.record(name, &report, json!({ "elements": n }));
    }
    sweep.finish();
}

#[test]
fn dkv_gather_casts_every_packed_key_row_once() {
    let msa = harness::device();
    let row = NUM_KV_HEADS * HEAD_DIM;
    let mut sweep = Sweep::new("pre_post_dkv");
    for (name, layout) in layouts() {
        let ws_rows = layout.workspace_rows();
        let mut rng = SplitMix64::new(0xDC + ws_rows as u64);
        let mut pools: Vec<Vec<f32>> = (0..2)
            .map(|_| {
                (0..ws_rows * row)
                    .map(|i| random_f32(&mut rng, i))
                    .collect()
            })
            .collect();
        for (slot, v) in pools[0].iter_mut().zip(special_f32()) {
            *slot = v;
        }
        // Expected: packed row start[pb] + r takes pool row pb·128 + r; rows no block covers
        // would stay poisoned (there are none: every packed key lies in one physical block).
        let (start, count) = layout.physical_block_keys();
        let poison = <bf16 as Poison>::WORD as u16;
        let tk = layout.total_k();
        let expected: Vec<Vec<u16>> = pools
            .iter()
            .map(|pool| {
                let mut out = vec![poison; tk * row];
                for (pb, (&s, &c)) in start.iter().zip(&count).enumerate() {
                    for r in 0..c.max(0) as usize {
                        let src = (pb * BLOCK_SIZE + r) * row;
                        let dst = (s as usize + r) * row;
                        out[dst..dst + row].copy_from_slice(&bf16_bits(&pool[src..src + row]));
                    }
                }
                out
            })
            .collect();
        let dl = device_layout(msa, &layout);
        let dk_pool = msa.upload(&pools[0]).unwrap();
        let dv_pool = msa.upload(&pools[1]).unwrap();
        let mut dk = msa.output::<bf16>(tk * row).unwrap();
        let mut dv = msa.output::<bf16>(tk * row).unwrap();
        msa.backward_postprocess_dkv_into(&dl, &dk_pool, &dv_pool, &mut dk, &mut dv)
            .unwrap_or_else(|e| panic!("{name}: dkv gather: {e}"));
        let mut report = CheckReport::default();
        report.push(compare::bitwise(
            "dk",
            &download_bits(msa, "dk", &dk),
            &expected[0],
        ));
        report.push(compare::bitwise(
            "dv",
            &download_bits(msa, "dv", &dv),
            &expected[1],
        ));
        sweep.record(
            name,
            &report,
            json!({ "total_k": tk, "workspace_rows": ws_rows }),
        );
    }
    sweep.finish();
}
