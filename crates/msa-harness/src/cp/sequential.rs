//! Every rank in turn on one executor, the collectives done in place: the all-gather is the
//! concatenation of the ranks' owned rows (device copies on the GPU), the reduce-scatter the
//! f32 sum of the ranks' scattered key gradients in rank order, split rank-major. The whole
//! per-rank path (row maps, local calls, scatter, reduction) without a transport: what the CPU
//! test and the single-GPU `msa run --cp N --cp-transport sequential` check.

use std::time::Instant;

use msa_workloads::CpPlan;

use super::{
    assemble, ms_since, rank_call, CommTime, CpResult, Gathered, KeyGrads, RankExecutor, RankInputs,
};
use crate::backend::RunOptions;
use crate::error::Result;

/// The CP run of `ranks` (from [`RankInputs::split`] of `plan`) on `e`, one rank after another.
pub fn run_sequential<'a, E: RankExecutor<'a>>(
    e: &E,
    plan: &CpPlan,
    ranks: &'a [RankInputs],
    opts: &RunOptions,
) -> Result<CpResult> {
    // Each rank's owned rows as it holds them, then the all-gather.
    let mut owned = Vec::with_capacity(ranks.len());
    for r in ranks {
        let ki = r.index.as_ref().map(|i| e.upload(&i.ki)).transpose()?;
        owned.push((e.upload(&r.k)?, e.upload(&r.v)?, ki));
    }
    e.synchronize()?;
    let t0 = Instant::now();
    let k = e.concat(&owned.iter().map(|o| &o.0).collect::<Vec<_>>())?;
    let v = e.concat(&owned.iter().map(|o| &o.1).collect::<Vec<_>>())?;
    let ki = match owned
        .iter()
        .map(|o| o.2.as_ref())
        .collect::<Option<Vec<_>>>()
    {
        Some(parts) if !parts.is_empty() => Some(e.concat(&parts)?),
        _ => None,
    };
    e.synchronize()?;
    let all_gather_ms = ms_since(t0);
    drop(owned);
    let gathered = Gathered {
        k: &k,
        v: &v,
        ki: ki.as_ref(),
    };

    let (mut kv_build_ms, mut staging_ms, mut reduce_ms) = (0.0, 0.0, 0.0);
    let mut locals = Vec::with_capacity(ranks.len());
    let mut rank_times = Vec::with_capacity(ranks.len());
    let mut sum: Option<KeyGrads> = None;
    for r in ranks {
        let res = rank_call(e, plan, r, &gathered, opts)?;
        kv_build_ms += res.kv_build_ms;
        staging_ms += res.key_staging_ms;
        let t0 = Instant::now();
        let segs = plan.kv_rows(r.rank);
        match &mut sum {
            Some(sum) => sum.scatter_add(&res.keys, &segs),
            None => sum = Some(KeyGrads::scattered(&res.keys, &segs, plan.total_tokens())),
        }
        reduce_ms += ms_since(t0);
        locals.push(res.outputs);
        rank_times.push(res.times);
    }
    let t0 = Instant::now();
    let sum = sum.unwrap_or_default();
    let reduced: Vec<KeyGrads> = (0..plan.cp_size())
        .map(|r| sum.part(r, plan.rank_tokens()))
        .collect();
    reduce_ms += ms_since(t0);
    let (outputs, key_sums) = assemble(plan, &locals, &reduced);
    Ok(CpResult {
        outputs,
        key_sums,
        rank_times,
        comm: vec![
            CommTime {
                what: "all_gather (copies)",
                ms: all_gather_ms,
            },
            CommTime {
                what: "kv_build (row gather)",
                ms: kv_build_ms,
            },
            CommTime {
                what: "key_grads to host f32",
                ms: staging_ms,
            },
            CommTime {
                what: "scatter + reduce (host f32)",
                ms: reduce_ms,
            },
        ],
    })
}
