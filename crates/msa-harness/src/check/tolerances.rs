//! The MSA v1 test tolerances (docs/contract.md §7) and one line of a check report.

use serde::Serialize;

/// Limits every check applies; the defaults are MSA's own.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Tolerances {
    /// `assert_close` on O (bf16 → f32): |a − e| ≤ atol + rtol·|e|.
    pub out_atol: f64,
    pub out_rtol: f64,
    /// LSE, compared where finite; equal infinities agree.
    pub lse_atol: f64,
    pub lse_rtol: f64,
    /// Flattened cosine similarity of dq, dk, dv (and dqi, dki).
    pub grad_cosine: f64,
    /// Relative L2 error ‖a − e‖₂ / ‖e‖₂ of the same gradients: the cosine cannot see a
    /// gradient's scale (dq × 1000 has cosine 1), this does. Not an MSA limit: the project's
    /// own (docs/contract.md §7.2).
    pub grad_l2_rel: f64,
    /// Indexer LSE against the LSE of the selection actually made.
    pub indexer_lse_atol: f64,
    /// A selected non-local block may score this much below the 15th best.
    pub indexer_rank_slack: f64,
}

impl Default for Tolerances {
    fn default() -> Self {
        Self {
            out_atol: 3e-2,
            out_rtol: 3e-2,
            lse_atol: 1e-3,
            lse_rtol: 1e-3,
            grad_cosine: 0.99,
            grad_l2_rel: 1e-2,
            indexer_lse_atol: 2e-3,
            indexer_rank_slack: 5e-3,
        }
    }
}

impl Tolerances {
    /// MSA's limits tightened tenfold (1 − cosine a hundredfold). The v1 kernels meet them on
    /// every recorded H200 run with at least 2x margin (docs/gpu/2026-11-30-h200), so the GPU
    /// suite uses them: a precision regression shows long before MSA's own limits would.
    ///
    /// The relative L2 limit is only halved (5e-3): a bf16 output against an f32 reference
    /// carries its rounding (2⁻⁹ relative per element), and the worst recorded gradient is at
    /// 2.7e-3 (dv, real_cases case1009/r1/recent16), so a tenfold tighter limit would fail
    /// correct kernels.
    pub fn strict() -> Self {
        Self {
            out_atol: 3e-3,
            out_rtol: 3e-3,
            lse_atol: 1e-4,
            lse_rtol: 1e-4,
            grad_cosine: 0.9999,
            grad_l2_rel: 5e-3,
            indexer_lse_atol: 2e-4,
            indexer_rank_slack: 5e-4,
        }
    }
}

/// One measured quantity against its limit.
#[derive(Debug, Clone, Serialize)]
pub struct CheckLine {
    pub tensor: String,
    pub metric: &'static str,
    pub value: f64,
    pub limit: f64,
    pub passed: bool,
    /// What the number means when it fails (worst index, counts).
    pub detail: String,
}

/// Every line of one comparison.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CheckReport {
    pub lines: Vec<CheckLine>,
}

impl CheckReport {
    pub fn passed(&self) -> bool {
        self.lines.iter().all(|l| l.passed)
    }

    pub fn push(&mut self, line: CheckLine) {
        self.lines.push(line);
    }

    pub fn extend(&mut self, other: CheckReport) {
        self.lines.extend(other.lines);
    }

    /// Append several lines (e.g. both lines of [`gradient`](super::compare::gradient)).
    pub fn push_all(&mut self, lines: impl IntoIterator<Item = CheckLine>) {
        self.lines.extend(lines);
    }

    /// A fixed-width table, one line per check.
    pub fn table(&self) -> String {
        let mut s = String::new();
        for l in &self.lines {
            s.push_str(&format!(
                "  {:<14} {:<18} {:>12.4e}  limit {:>9.3e}  {}{}\n",
                l.tensor,
                l.metric,
                l.value,
                l.limit,
                if l.passed { "ok" } else { "FAIL" },
                if l.detail.is_empty() {
                    String::new()
                } else {
                    format!("  ({})", l.detail)
                }
            ));
        }
        s
    }
}
