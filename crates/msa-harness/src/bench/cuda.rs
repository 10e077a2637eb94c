//! Device-timed repeats of each stage on one uploaded case: a pair of CUDA events around every
//! call, read after the last one, so host gaps inside a call (the checked prepare's one
//! synchronization) count and host work between calls does not.
//!
//! The tables (stage `tables`, before the backward) take tens of µs on the device, less than the
//! host needs to enqueue them (output allocations, argument checks, the launches); a training
//! step enqueues them ahead of the device. Their timed calls therefore start behind a spacer (a
//! memset of [`SPACER_BYTES`] enqueued before the start event), so the host has enqueued the call
//! before the device reaches it and the events see device time only. The spacer also evicts L2,
//! as a training step's forward does before the tables are built.
//!
//! The unchecked prepare (stage `prepare`) takes a few µs, about what a timing event adds at the
//! start of a timed range: the gap before the first kernel after a start event is ~3 µs longer
//! than between two kernels (docs/perf/schedule.md, "Session 27", from CUPTI traces). So the
//! stage is timed as what it adds to the forward that follows it in a training step: each timed
//! call of prepare then forward is paired with one of the forward alone on metadata prepared
//! before its start event, and the stage's times are the differences.

use std::sync::Arc;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaSlice};
use half::bf16;

use msa::cuda::{BackwardOptions, CudaMsa, DeviceLayout, KlInputs};

use super::{BenchOptions, StageTimes};
use crate::error::{HarnessError, Result};
use crate::io::CallInputs;
use crate::Stage;

/// `warmup` untimed calls of `call`, then `iters` timed ones; `setup` runs before each call,
/// outside its events (per-call inputs such as a fresh selection upload).
fn time<S, R>(
    m: &CudaMsa,
    opts: &BenchOptions,
    mut setup: impl FnMut() -> msa::Result<S>,
    mut call: impl FnMut(S) -> msa::Result<R>,
) -> msa::Result<Vec<f64>> {
    let event = || m.context().new_event(Some(CUevent_flags::CU_EVENT_DEFAULT));
    for _ in 0..opts.warmup {
        call(setup()?)?;
    }
    let mut pairs: Vec<(CudaEvent, CudaEvent)> = Vec::with_capacity(opts.iters);
    for _ in 0..opts.iters {
        let s = setup()?;
        let (start, end) = (event()?, event()?);
        start.record(m.stream())?;
        let r = call(s)?;
        end.record(m.stream())?;
        // Outputs are freed stream-ordered after the end event, so the pool reuses them.
        drop(r);
        pairs.push((start, end));
    }
    m.synchronize()?;
    pairs
        .iter()
        .map(|(a, b)| Ok(a.elapsed_ms(b)? as f64))
        .collect()
}

/// What the unchecked prepare adds to the forward after it: `warmup` untimed pairs, then `iters`
/// pairs of timed calls, prepare then forward and the forward alone, in alternation; the
/// differences. Every call starts behind the spacer, with the selection written again on the
/// device after it (in a training step the indexer has just written it, so it sits in L2); the
/// forward alone runs on metadata prepared from it before the start event, so both forwards read
/// a selection the validation has just read.
fn time_in_step(
    m: &CudaMsa,
    opts: &BenchOptions,
    layout: &Arc<DeviceLayout>,
    topk: &[i32],
    spacer: &mut CudaSlice<u8>,
    (q, k, v): (&CudaSlice<bf16>, &CudaSlice<bf16>, &CudaSlice<bf16>),
) -> msa::Result<Vec<f64>> {
    let written = m.upload(topk)?;
    let event = || m.context().new_event(Some(CUevent_flags::CU_EVENT_DEFAULT));
    let mut pairs: Vec<[(CudaEvent, CudaEvent); 2]> = Vec::with_capacity(opts.iters);
    let mut timed = |with_prepare: bool| -> msa::Result<(CudaEvent, CudaEvent)> {
        m.stream().memset_zeros(spacer)?;
        let selection = m.stream().clone_dtod(&written)?;
        let (start, end) = (event()?, event()?);
        let meta = if with_prepare {
            start.record(m.stream())?;
            m.prepare_forward_unchecked(layout, selection)?
        } else {
            let meta = m.prepare_forward_unchecked(layout, selection)?;
            start.record(m.stream())?;
            meta
        };
        let out = m.forward(&meta, q, k, v)?;
        end.record(m.stream())?;
        drop((out, meta));
        Ok((start, end))
    };
    for i in 0..opts.warmup + opts.iters {
        let pair = [timed(true)?, timed(false)?];
        if i >= opts.warmup {
            pairs.push(pair);
        }
    }
    m.synchronize()?;
    pairs
        .iter()
        .map(|[(a, b), (c, d)]| Ok((a.elapsed_ms(b)? - c.elapsed_ms(d)?) as f64))
        .collect()
}

/// Bytes the spacer memset writes: ~0.1 ms of device time, more than the host needs to enqueue
/// one unchecked prepare.
const SPACER_BYTES: usize = 512 << 20;

/// The spacer buffer, allocated at its first use.
fn spacer_in<'s>(
    m: &CudaMsa,
    slot: &'s mut Option<CudaSlice<u8>>,
) -> msa::Result<&'s mut CudaSlice<u8>> {
    if slot.is_none() {
        *slot = Some(m.zeros::<u8>(SPACER_BYTES)?);
    }
    Ok(slot.as_mut().expect("allocated above"))
}

fn missing(stage: Stage, tensors: &'static str) -> HarnessError {
    HarnessError::MissingInputs { stage, tensors }
}

pub fn run(m: &CudaMsa, p: &CallInputs, opts: &BenchOptions) -> Result<Vec<StageTimes>> {
    m.keep_pool_memory()?;
    let layout = Arc::new(DeviceLayout::new(m, p.layout.clone())?);
    let (q, k, v) = (m.upload(&p.q)?, m.upload(&p.k)?, m.upload(&p.v)?);
    let meta = m.prepare(&layout, m.upload(&p.topk_indices)?)?;
    let fwd = m.forward(&meta, &q, &k, &v)?;
    let dout = p.dout.as_ref().map(|d| m.upload(d)).transpose()?;
    let index = match &p.index {
        Some(i) => Some((m.upload(&i.qi)?, m.upload(&i.ki)?)),
        None => None,
    };
    let none = || -> msa::Result<()> { Ok(()) };
    let mut spacer: Option<CudaSlice<u8>> = None;
    let mut out = Vec::with_capacity(opts.stages.len());
    for &stage in &opts.stages {
        let ms = match stage {
            Stage::Prepare => {
                let spacer = spacer_in(m, &mut spacer)?;
                time_in_step(m, opts, &layout, &p.topk_indices, spacer, (&q, &k, &v))?
            }
            Stage::Tables => {
                let spacer = spacer_in(m, &mut spacer)?;
                time(
                    m,
                    opts,
                    || {
                        // Each call starts from the forward's metadata, built outside the events.
                        let topk = m.upload(&p.topk_indices)?;
                        let meta = m.prepare_forward_unchecked(&layout, topk)?;
                        m.stream().memset_zeros(spacer)?;
                        Ok(meta)
                    },
                    |mut meta| m.build_tables(&mut meta),
                )?
            }
            Stage::PrepareChecked => time(
                m,
                opts,
                || m.upload(&p.topk_indices),
                |topk| m.prepare_forward(&layout, topk),
            )?,
            Stage::Forward | Stage::ForwardSm80 => {
                m.set_sm80_kernels(stage == Stage::ForwardSm80);
                let ms = time(m, opts, none, |()| m.forward(&meta, &q, &k, &v));
                m.set_sm80_kernels(false);
                ms?
            }
            Stage::Backward
            | Stage::BackwardDeterministic
            | Stage::BackwardSm80
            | Stage::BackwardDeterministicSm80 => {
                let dout = dout.as_ref().ok_or_else(|| missing(stage, "dout"))?;
                let sm80 = matches!(
                    stage,
                    Stage::BackwardSm80 | Stage::BackwardDeterministicSm80
                );
                let bw = BackwardOptions {
                    deterministic: matches!(
                        stage,
                        Stage::BackwardDeterministic | Stage::BackwardDeterministicSm80
                    ),
                };
                m.set_sm80_kernels(sm80);
                let ms = time(m, opts, none, |()| {
                    m.backward(&meta, &q, &k, &v, dout, &fwd.out, &fwd.lse, bw)
                });
                m.set_sm80_kernels(false);
                ms?
            }
            Stage::Indexer => {
                let (qi, ki) = index.as_ref().ok_or_else(|| missing(stage, "qi, ki"))?;
                time(m, opts, none, |()| m.indexer_forward(&layout, qi, ki))?
            }
            Stage::SelectionLse => {
                let (qi, ki) = index.as_ref().ok_or_else(|| missing(stage, "qi, ki"))?;
                time(m, opts, none, |()| m.selection_lse(&meta, qi, ki))?
            }
            Stage::Kl => {
                let (qi, ki) = index.as_ref().ok_or_else(|| missing(stage, "qi, ki"))?;
                let indexer_lse = m.selection_lse(&meta, qi, ki)?;
                let inputs = KlInputs {
                    q: &q,
                    k: &k,
                    teacher_lse: &fwd.lse,
                    qi,
                    ki,
                    indexer_lse: &indexer_lse,
                };
                time(m, opts, none, |()| m.kl_backward(&meta, &inputs, 1.0))?
            }
            Stage::Upload => {
                unreachable!("BenchOptions::check refuses stages outside Stage::BENCH")
            }
        };
        out.push(StageTimes { stage, ms });
    }
    Ok(out)
}
