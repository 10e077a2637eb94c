//! Context parallelism (docs/cp.md): one MSA call over a pack, spread over CP ranks with
//! TransformerEngine's KV all-gather. Per rank: all-gather k, v (and ki), build the rank's
//! packed K/V from the gathered rows ([`CpPlan::kv_rows`]), the local call (prepare, forward,
//! backward, indexer, selection LSE, KL), then scatter the packed key gradients (dk, dv, dki)
//! into full-length f32 buffers in gathered order and reduce-scatter them, so each rank gets the
//! key gradients of its own chunks, summed in f32 and rounded to bf16 once.
//!
//! The per-rank call is written once, in [`rank_call`], over a [`RankExecutor`]; the collective
//! is the driver's: [`run_sequential`] runs every rank in turn on one executor (all-gather =
//! concatenation, reduce-scatter = sum in rank order, then split), `nccl::run_nccl` (feature
//! `msa`) one thread per GPU over NCCL.

#[cfg(feature = "msa")]
pub mod nccl;
mod sequential;

use std::time::Instant;

use half::bf16;
use msa_plan::topology::TOPK_BLOCKS;
use msa_plan::topology::{HEAD_DIM, INDEX_DIM, NUM_INDEX_HEADS, NUM_KV_HEADS, NUM_Q_HEADS};
use msa_plan::VarlenLayout;
use msa_workloads::{
    add_rows, case_seed, copy_grouped, copy_rows, make_topk_in, CpPlan, InputMode, Inputs, Pattern,
    Segment,
};
use serde::Serialize;

pub use sequential::run_sequential;

use crate::backend::{call, Attention, CallHost, Executor, Index, RunOptions, StageTime};
use crate::error::{HarnessError, Result};
use crate::io::{CallInputs, IndexTensors, Outputs};

/// Row widths of the tensors a rank moves.
const Q_ROW: usize = NUM_Q_HEADS * HEAD_DIM;
const KV_ROW: usize = NUM_KV_HEADS * HEAD_DIM;
const QI_ROW: usize = NUM_INDEX_HEADS * INDEX_DIM;
const KI_ROW: usize = INDEX_DIM;

/// What the per-rank call needs of an executor beyond one call's stages.
pub trait RankExecutor<'a>: Executor<'a> {
    /// A key gradient (dk, dv or dki) of the packed key rows as the stage leaves it: the CPU
    /// reference's unrounded f32 sums; the kernels' bf16 (their epilogue rounds dK/dV, so a
    /// GPU rank's share is rounded once before the f32 reduction).
    type KeyGrad;

    /// `rows` rows of `width` elements: `segs` of `src` (a gather; every row is written).
    fn gather_rows(
        &self,
        src: &Self::Bf16,
        width: usize,
        segs: &[Segment],
        rows: usize,
    ) -> Result<Self::Bf16>;
    /// The tensors one after the other: the all-gather of one process.
    fn concat(&self, parts: &[&Self::Bf16]) -> Result<Self::Bf16>;
    /// `(dq, dk, dv)` as [`Executor::backward`], dk and dv unrounded where the executor has them.
    #[allow(clippy::too_many_arguments)]
    fn backward_keys(
        &self,
        meta: &Self::Metadata,
        attn: &Attention<'_, Self::Bf16>,
        dout: &Self::Bf16,
        out: &Self::Bf16,
        lse: &Self::F32,
        deterministic: bool,
    ) -> Result<(Self::Bf16, Self::KeyGrad, Self::KeyGrad)>;
    /// `(dqi, dki)` as [`Executor::kl_backward`], dki unrounded where the executor has it.
    fn kl_backward_keys(
        &self,
        meta: &Self::Metadata,
        attn: &Attention<'_, Self::Bf16>,
        index: &Index<'_, Self::Bf16>,
        teacher_lse: &Self::F32,
        indexer_lse: &Self::F32,
        loss_coeff: f32,
    ) -> Result<(Self::Bf16, Self::KeyGrad)>;
    /// A key gradient in host f32, for the reduction.
    fn key_grad_f32(&self, x: Self::KeyGrad) -> Result<Vec<f32>>;
}

/// The host inputs of one rank: the rows of the pack's tensors at its tokens (its chunks,
/// ascending). `k`, `v` and `ki` are the rows the rank owns and contributes to the all-gather,
/// not its packed K/V.
#[derive(Debug, Clone)]
pub struct RankInputs {
    pub rank: usize,
    /// The rank's layout (its fragments; K/V packed per document prefix).
    pub layout: VarlenLayout,
    /// `[Tr, 64, 128]`
    pub q: Vec<bf16>,
    /// `[Tr, 4, 128]`
    pub k: Vec<bf16>,
    /// `[Tr, 4, 128]`
    pub v: Vec<bf16>,
    /// `[4, Tr, 16]`: the pack's selection rows of the rank's queries (document-local blocks,
    /// the same in the rank's layout).
    pub topk: Vec<i32>,
    /// `[Tr, 64, 128]`
    pub dout: Option<Vec<bf16>>,
    /// qi `[Tr, 4, 128]`, ki `[Tr, 128]` (owned rows).
    pub index: Option<IndexTensors>,
}

impl RankInputs {
    /// Every rank's inputs, cut from the inputs `p` of the single call over the pack.
    pub fn split(plan: &CpPlan, p: &CallInputs) -> Result<Vec<Self>> {
        let pack = plan.pack_layout()?;
        if p.layout != pack {
            return Err(HarnessError::Cp(format!(
                "the inputs are not of the split pack ({} queries, {} keys, {} documents; the \
                 pack has {} tokens in {} documents, no fragments)",
                p.layout.total_q(),
                p.layout.total_k(),
                p.layout.batch(),
                plan.total_tokens(),
                pack.batch()
            )));
        }
        let n = plan.rank_tokens();
        let rows = |x: &[bf16], width: usize, segs: &[Segment]| {
            let mut out = vec![bf16::ZERO; n * width];
            copy_rows(x, &mut out, width, segs);
            out
        };
        Ok(plan
            .ranks()
            .iter()
            .map(|rc| {
                let segs = plan.local_rows(rc.rank());
                RankInputs {
                    rank: rc.rank(),
                    layout: rc.layout().clone(),
                    q: rows(&p.q, Q_ROW, &segs),
                    k: rows(&p.k, KV_ROW, &segs),
                    v: rows(&p.v, KV_ROW, &segs),
                    topk: copy_grouped(&p.topk_indices, NUM_KV_HEADS, TOPK_BLOCKS, &segs, n),
                    dout: p.dout.as_ref().map(|d| rows(d, Q_ROW, &segs)),
                    index: p.index.as_ref().map(|i| IndexTensors {
                        qi: rows(&i.qi, QI_ROW, &segs),
                        ki: rows(&i.ki, KI_ROW, &segs),
                    }),
                }
            })
            .collect())
    }
}

/// The all-gathered k, v (and ki) a rank reads: every rank's owned rows, rank 0 first.
pub struct Gathered<'g, B> {
    pub k: &'g B,
    pub v: &'g B,
    pub ki: Option<&'g B>,
}

/// Key gradients in f32: a rank's packed key rows before the reduction, or key rows after it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KeyGrads {
    pub dk: Option<Vec<f32>>,
    pub dv: Option<Vec<f32>>,
    pub dki: Option<Vec<f32>>,
}

impl KeyGrads {
    /// `(tensor, row width)` of each present gradient.
    fn each_mut(&mut self) -> [(&mut Option<Vec<f32>>, usize); 3] {
        [
            (&mut self.dk, KV_ROW),
            (&mut self.dv, KV_ROW),
            (&mut self.dki, KI_ROW),
        ]
    }

    /// Zeroed full-length buffers (`rows` key rows) for the gradients `like` has.
    fn zeros_like(like: &KeyGrads, rows: usize) -> Self {
        let z = |x: &Option<Vec<f32>>, w: usize| x.as_ref().map(|_| vec![0f32; rows * w]);
        Self {
            dk: z(&like.dk, KV_ROW),
            dv: z(&like.dv, KV_ROW),
            dki: z(&like.dki, KI_ROW),
        }
    }

    /// `self[inverse(segs)] += packed`: a rank's packed key rows added at their gathered rows
    /// (`segs` = [`CpPlan::kv_rows`]).
    pub fn scatter_add(&mut self, packed: &KeyGrads, segs: &[Segment]) {
        let inv: Vec<Segment> = segs.iter().map(|s| s.inverse()).collect();
        let src = [&packed.dk, &packed.dv, &packed.dki];
        for ((dst, w), src) in self.each_mut().into_iter().zip(src) {
            if let (Some(dst), Some(src)) = (dst, src) {
                add_rows(src, dst, w, &inv);
            }
        }
    }

    /// The scattered buffers for one rank's packed gradients: full length, zero where the
    /// rank's K holds no row (what the rank hands to the reduce-scatter).
    pub fn scattered(packed: &KeyGrads, segs: &[Segment], rows: usize) -> Self {
        let mut full = Self::zeros_like(packed, rows);
        full.scatter_add(packed, segs);
        full
    }

    /// Rows `[rank·n, (rank+1)·n)`: a rank's part of a reduce-scatter.
    pub fn part(&self, rank: usize, n: usize) -> Self {
        let cut = |x: &Option<Vec<f32>>, w: usize| {
            x.as_ref()
                .map(|x| x[rank * n * w..(rank + 1) * n * w].to_vec())
        };
        Self {
            dk: cut(&self.dk, KV_ROW),
            dv: cut(&self.dv, KV_ROW),
            dki: cut(&self.dki, KI_ROW),
        }
    }
}

/// The results of one rank's local call.
pub struct RankResult {
    /// `out`, `lse`, `dq`, `indexer_topk`, `indexer_lse`, `dqi` of the rank's queries (its
    /// local rows); no key gradient.
    pub outputs: Outputs,
    /// dk, dv, dki of the rank's packed key rows.
    pub keys: KeyGrads,
    /// The local call's stages.
    pub times: Vec<StageTime>,
    /// Building the packed K/V (and KI) from the gathered rows.
    pub kv_build_ms: f64,
    /// Bringing the key gradients to host f32.
    pub key_staging_ms: f64,
}

fn ms_since(t0: Instant) -> f64 {
    t0.elapsed().as_secs_f64() * 1e3
}

/// One rank's local call, given the all-gathered k, v (and ki): its packed K/V from the gathered
/// rows, then the stages of [`crate::backend::run`] on its layout.
pub fn rank_call<'a, E: RankExecutor<'a>>(
    e: &E,
    plan: &CpPlan,
    r: &'a RankInputs,
    gathered: &Gathered<'_, E::Bf16>,
    opts: &RunOptions,
) -> Result<RankResult> {
    let segs = plan.kv_rows(r.rank);
    let tk = r.layout.total_k();
    let t0 = Instant::now();
    let k = e.gather_rows(gathered.k, KV_ROW, &segs, tk)?;
    let v = e.gather_rows(gathered.v, KV_ROW, &segs, tk)?;
    let ki = match (&r.index, gathered.ki) {
        (Some(_), Some(ki)) => Some(e.gather_rows(ki, KI_ROW, &segs, tk)?),
        (None, _) => None,
        (Some(_), None) => return Err(HarnessError::Cp("ki was not all-gathered".into())),
    };
    e.synchronize()?;
    let kv_build_ms = ms_since(t0);

    let host = CallHost {
        layout: &r.layout,
        q: &r.q,
        topk: &r.topk,
        dout: r.dout.as_deref(),
        qi: r.index.as_ref().map(|i| i.qi.as_slice()),
    };
    let backward =
        |meta: &E::Metadata,
         attn: &Attention<'_, E::Bf16>,
         dout: &E::Bf16,
         out: &E::Bf16,
         lse: &E::F32| { e.backward_keys(meta, attn, dout, out, lse, opts.deterministic) };
    // The KL loss is a mean over a call's queries (`loss_coeff / (4·T)`, T local): a rank's
    // share of the pack's mean is `loss_coeff · T_r / T`, so that the ranks' dki sum to the
    // single call's (exactly so for a power-of-two CP size).
    let share = opts.loss_coeff * r.layout.total_q() as f32 / plan.total_tokens() as f32;
    let kl =
        |meta: &E::Metadata,
         attn: &Attention<'_, E::Bf16>,
         index: &Index<'_, E::Bf16>,
         lse: &E::F32,
         ilse: &E::F32| { e.kl_backward_keys(meta, attn, index, lse, ilse, share) };
    let c = call(e, host, opts, || Ok((k, v, ki)), backward, kl)?;
    let t0 = Instant::now();
    let f32s = |g: Option<E::KeyGrad>| g.map(|g| e.key_grad_f32(g)).transpose();
    let keys = KeyGrads {
        dk: f32s(c.dk)?,
        dv: f32s(c.dv)?,
        dki: f32s(c.dki)?,
    };
    let key_staging_ms = ms_since(t0);
    Ok(RankResult {
        outputs: c.result.outputs,
        keys,
        times: c.result.times,
        kv_build_ms,
        key_staging_ms,
    })
}

/// Time of one kind of data movement, summed over ranks.
#[derive(Debug, Clone, Serialize)]
pub struct CommTime {
    pub what: &'static str,
    pub ms: f64,
}

/// The results of a CP run over the whole pack.
pub struct CpResult {
    /// Every output in pack order, key gradients rounded to bf16 once after the reduction.
    pub outputs: Outputs,
    /// The reduced key gradients in f32, pack order.
    pub key_sums: KeyGrads,
    /// Each rank's stages.
    pub rank_times: Vec<Vec<StageTime>>,
    /// The collectives and the row moves around them.
    pub comm: Vec<CommTime>,
}

/// Pack-order outputs from each rank's local outputs and its part of the reduced key
/// gradients (both in its local rows).
pub fn assemble(plan: &CpPlan, locals: &[Outputs], reduced: &[KeyGrads]) -> (Outputs, KeyGrads) {
    let (t, n, cp) = (plan.total_tokens(), plan.rank_tokens(), plan.cp_size());
    let inv: Vec<Vec<Segment>> = (0..cp)
        .map(|r| plan.local_rows(r).iter().map(|s| s.inverse()).collect())
        .collect();
    fn rows<T: Copy + Default>(
        parts: &[Option<&Vec<T>>],
        inv: &[Vec<Segment>],
        t: usize,
        width: usize,
    ) -> Option<Vec<T>> {
        let mut out = vec![T::default(); t * width];
        for (p, segs) in parts.iter().zip(inv) {
            copy_rows(p.as_ref()?, &mut out, width, segs);
        }
        Some(out)
    }
    // `[4, n, w]` per rank into `[4, t, w]`.
    fn grouped<T: Copy + Default>(
        parts: &[Option<&Vec<T>>],
        inv: &[Vec<Segment>],
        n: usize,
        t: usize,
        width: usize,
    ) -> Option<Vec<T>> {
        let mut out = vec![T::default(); NUM_KV_HEADS * t * width];
        for (p, segs) in parts.iter().zip(inv) {
            let p = p.as_ref()?;
            for (src, dst) in p
                .chunks_exact(n * width)
                .zip(out.chunks_exact_mut(t * width))
            {
                copy_rows(src, dst, width, segs);
            }
        }
        Some(out)
    }
    let of = |f: fn(&Outputs) -> Option<&Vec<bf16>>| -> Vec<Option<&Vec<bf16>>> {
        locals.iter().map(f).collect()
    };
    let keys = |f: fn(&KeyGrads) -> Option<&Vec<f32>>| -> Vec<Option<&Vec<f32>>> {
        reduced.iter().map(f).collect()
    };
    let sums = KeyGrads {
        dk: rows(&keys(|k| k.dk.as_ref()), &inv, t, KV_ROW),
        dv: rows(&keys(|k| k.dv.as_ref()), &inv, t, KV_ROW),
        dki: rows(&keys(|k| k.dki.as_ref()), &inv, t, KI_ROW),
    };
    let round = |x: &Option<Vec<f32>>| {
        x.as_ref()
            .map(|x| x.iter().map(|&v| bf16::from_f32(v)).collect())
    };
    let lse: Vec<_> = locals.iter().map(|o| o.lse.as_ref()).collect();
    let itopk: Vec<_> = locals.iter().map(|o| o.indexer_topk.as_ref()).collect();
    let ilse: Vec<_> = locals.iter().map(|o| o.indexer_lse.as_ref()).collect();
    let outputs = Outputs {
        out: rows(&of(|o| o.out.as_ref()), &inv, t, Q_ROW),
        lse: rows(&lse, &inv, t, NUM_Q_HEADS),
        dq: rows(&of(|o| o.dq.as_ref()), &inv, t, Q_ROW),
        dk: round(&sums.dk),
        dv: round(&sums.dv),
        indexer_topk: grouped(&itopk, &inv, n, t, TOPK_BLOCKS),
        indexer_lse: grouped(&ilse, &inv, n, t, 1),
        dqi: rows(&of(|o| o.dqi.as_ref()), &inv, t, QI_ROW),
        dki: round(&sums.dki),
    };
    (outputs, sums)
}

/// The single call over the whole pack of `plan` (no fragments): inputs drawn under `mode`
/// with the seed `case_seed(case_id, 0, seed)` and the pattern's selection, what a CP run
/// splits and what it must equal.
pub fn pack_call(
    plan: &CpPlan,
    case_id: u64,
    pattern: Pattern,
    seed: u64,
    mode: InputMode,
) -> Result<CallInputs> {
    let layout = plan.pack_layout()?;
    let s = case_seed(case_id, 0, seed);
    let topk = make_topk_in(&layout, pattern, s, mode);
    let mut inputs = Inputs::generate_in(&layout, s, mode);
    if mode == InputMode::Peaked {
        inputs.plant_peaks(&layout, &topk, s);
    }
    Ok(CallInputs::generated(layout, inputs, topk))
}
