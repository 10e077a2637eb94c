//! One process, one thread per GPU, NCCL collectives (cudarc's `nccl`, loaded at run time):
//! rank r runs on device r. Each thread all-gathers k, v (and ki) with `ncclAllGather`, runs
//! [`rank_call`], scatters its key gradients into full-length f32 buffers on the host and
//! reduce-scatters them on the device with `ncclReduceScatter` (sum), so it ends with the f32
//! key gradients of its own chunks.

use std::time::Instant;

use cudarc::driver::CudaSlice;
use cudarc::nccl::safe::{Comm, Id, ReduceOp};
use half::bf16;
use msa::cuda::CudaMsa;
use msa_workloads::CpPlan;

use super::{
    assemble, ms_since, rank_call, CommTime, CpResult, Gathered, KeyGrads, RankInputs, KI_ROW,
    KV_ROW,
};
use crate::backend::{RunOptions, StageTime};
use crate::error::{HarnessError, Result};
use crate::io::Outputs;

/// Whether cudarc's loader finds the NCCL library (it tries `libnccl.so`, `libnccl.so.13`,
/// `libnccl.so.12`, … on the loader's path, but not `libnccl.so.2`, the name pip's
/// `nvidia-nccl-cu*` wheels ship: see docs/cp.md).
pub fn nccl_loadable() -> bool {
    // SAFETY: dlopen of the candidate names; nothing is called in the library.
    unsafe { cudarc::nccl::sys::is_culib_present() }
}

fn nccl(what: &str, e: cudarc::nccl::result::NcclError) -> HarnessError {
    HarnessError::Cp(format!("NCCL {what}: {e:?}"))
}

/// What one rank's thread returns.
struct RankRun {
    outputs: Outputs,
    reduced: KeyGrads,
    times: Vec<StageTime>,
    /// all-gather, kv build, key staging, host scatter, reduce-scatter (ms).
    comm: [f64; 5],
}

/// The CP run of `ranks` (from [`super::RankInputs::split`] of `plan`) on devices
/// `0..cp_size`, one thread each, with NCCL communicators of world size `cp_size` (1 included:
/// the collectives are then copies). `poison` as [`crate::backend::Backend::cuda`].
pub fn run_nccl(
    plan: &CpPlan,
    ranks: &[RankInputs],
    opts: &RunOptions,
    poison: bool,
) -> Result<CpResult> {
    if !nccl_loadable() {
        return Err(HarnessError::Cp(
            "the NCCL library is not loadable (cudarc looks for libnccl.so and libnccl.so.{13,12,11,…} \
             on the loader's path)"
                .into(),
        ));
    }
    let world = plan.cp_size();
    // Every device is opened (and probed) before any rank joins the communicator, so a missing
    // GPU is an error here, not a rank waiting forever in ncclCommInitRank.
    let devices = (0..world)
        .map(|i| Ok(CudaMsa::new(i)?.with_poisoned_outputs(poison)))
        .collect::<Result<Vec<_>>>()?;
    let id = Id::new().map_err(|e| nccl("unique id", e))?;
    let runs: Vec<Result<RankRun>> = std::thread::scope(|s| {
        let threads: Vec<_> = devices
            .iter()
            .zip(ranks)
            .map(|(m, r)| s.spawn(move || rank_thread(m, plan, r, id, opts)))
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("a rank thread panicked"))
            .collect()
    });
    let runs = runs.into_iter().collect::<Result<Vec<_>>>()?;
    // Ranks run at once: a phase takes as long as its slowest rank.
    let slowest = |i: usize| runs.iter().map(|r| r.comm[i]).fold(0.0, f64::max);
    let comm = vec![
        CommTime {
            what: "all_gather (NCCL)",
            ms: slowest(0),
        },
        CommTime {
            what: "kv_build (row gather)",
            ms: slowest(1),
        },
        CommTime {
            what: "key_grads to host f32",
            ms: slowest(2),
        },
        CommTime {
            what: "scatter (host f32) + upload",
            ms: slowest(3),
        },
        CommTime {
            what: "reduce_scatter (NCCL)",
            ms: slowest(4),
        },
    ];
    let locals: Vec<Outputs> = runs.iter().map(|r| r.outputs.clone()).collect();
    let reduced: Vec<KeyGrads> = runs.iter().map(|r| r.reduced.clone()).collect();
    let (outputs, key_sums) = assemble(plan, &locals, &reduced);
    Ok(CpResult {
        outputs,
        key_sums,
        rank_times: runs.into_iter().map(|r| r.times).collect(),
        comm,
    })
}

/// `recv = all_gather(send)`, `world` times `send`'s length.
fn all_gather(
    m: &CudaMsa,
    comm: &Comm,
    host: &[bf16],
    world: usize,
) -> Result<(CudaSlice<bf16>, f64)> {
    let send = m.upload(host)?;
    let mut recv = m.zeros::<bf16>(host.len() * world)?;
    m.synchronize()?;
    let t0 = Instant::now();
    comm.all_gather(&send, &mut recv)
        .map_err(|e| nccl("all_gather", e))?;
    m.synchronize()?;
    Ok((recv, ms_since(t0)))
}

fn rank_thread(
    m: &CudaMsa,
    plan: &CpPlan,
    r: &RankInputs,
    id: Id,
    opts: &RunOptions,
) -> Result<RankRun> {
    let world = plan.cp_size();
    // ncclCommInitRank takes the device of the thread's current context.
    m.context().bind_to_thread()?;
    let comm = Comm::from_rank(m.stream().clone(), r.rank, world, id)
        .map_err(|e| nccl("communicator", e))?;
    let (k, k_ms) = all_gather(m, &comm, &r.k, world)?;
    let (v, v_ms) = all_gather(m, &comm, &r.v, world)?;
    let (ki, ki_ms) = match &r.index {
        Some(i) => {
            let (ki, ms) = all_gather(m, &comm, &i.ki, world)?;
            (Some(ki), ms)
        }
        None => (None, 0.0),
    };
    let gathered = Gathered {
        k: &k,
        v: &v,
        ki: ki.as_ref(),
    };
    let res = rank_call(m, plan, r, &gathered, opts)?;
    drop((k, v, ki));

    let t0 = Instant::now();
    let full = KeyGrads::scattered(&res.keys, &plan.kv_rows(r.rank), plan.total_tokens());
    let mut scatter_ms = ms_since(t0);
    let n = plan.rank_tokens();
    let mut reduce_ms = 0.0;
    let mut reduced = KeyGrads::default();
    for (src, width, dst) in [
        (&full.dk, KV_ROW, &mut reduced.dk),
        (&full.dv, KV_ROW, &mut reduced.dv),
        (&full.dki, KI_ROW, &mut reduced.dki),
    ] {
        let Some(src) = src else { continue };
        let t0 = Instant::now();
        let send = m.upload(src)?;
        let mut recv = m.zeros::<f32>(n * width)?;
        m.synchronize()?;
        scatter_ms += ms_since(t0);
        let t0 = Instant::now();
        comm.reduce_scatter(&send, &mut recv, &ReduceOp::Sum)
            .map_err(|e| nccl("reduce_scatter", e))?;
        m.synchronize()?;
        reduce_ms += ms_since(t0);
        *dst = Some(m.download(&recv)?);
    }
    Ok(RankRun {
        outputs: res.outputs,
        reduced,
        times: res.times,
        comm: [
            k_ms + v_ms + ki_ms,
            res.kv_build_ms,
            res.key_staging_ms,
            scatter_ms,
            reduce_ms,
        ],
    })
}
