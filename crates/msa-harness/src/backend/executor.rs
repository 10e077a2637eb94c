//! The call sequence of the training contract, written once over the stages of an [`Executor`].

use std::time::Instant;

use half::bf16;
use msa_plan::VarlenLayout;

use crate::error::Result;
use crate::io::{CallInputs, Outputs};
use crate::Stage;

/// What to compute beyond the forward.
#[derive(Debug, Clone, Copy)]
pub struct RunOptions {
    /// Backward when `dout` is present.
    pub backward: bool,
    /// Indexer forward when `qi`/`ki` are present.
    pub indexer: bool,
    /// Selection LSE and KL backward when `qi`/`ki` are present.
    pub kl: bool,
    /// Bitwise-repeatable backward.
    pub deterministic: bool,
    pub loss_coeff: f32,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            backward: true,
            indexer: false,
            kl: false,
            deterministic: false,
            loss_coeff: 1.0,
        }
    }
}

/// Wall time of one stage; GPU stages are synchronized, so this is device time plus launch
/// overhead.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StageTime {
    pub stage: Stage,
    pub ms: f64,
}

/// Outputs of one call plus per-stage times and the index LSE the KL backward was given.
#[derive(Debug, Clone)]
pub struct RunResult {
    pub outputs: Outputs,
    pub times: Vec<StageTime>,
    pub kl_indexer_lse: Option<Vec<f32>>,
}

/// The attention tensors of a call where an executor computes.
pub struct Attention<'t, B> {
    pub q: &'t B,
    pub k: &'t B,
    pub v: &'t B,
}

/// The index tensors of a call where an executor computes.
pub struct Index<'t, B> {
    pub qi: &'t B,
    pub ki: &'t B,
}

/// Where a call's tensors live and how each stage computes them: the CPU reference on host
/// memory or the kernels on device memory. `'a` is the lifetime of the host inputs, which the
/// CPU borrows instead of copying.
pub trait Executor<'a> {
    /// A bf16 tensor (inputs, out, gradients).
    type Bf16;
    /// An f32 tensor (LSEs).
    type F32;
    /// An i32 tensor (the indexer's selection).
    type I32;
    type Layout;
    /// A validated selection and what the later stages derive from it.
    type Metadata;

    fn upload(&self, host: &'a [bf16]) -> Result<Self::Bf16>;
    fn layout(&self, host: &'a VarlenLayout) -> Result<Self::Layout>;
    /// Validate `topk` (`[4, T, 16]`): the metadata of the forward.
    fn prepare(&self, layout: &Self::Layout, topk: &'a [i32]) -> Result<Self::Metadata>;
    /// Add what the backward and the KL backward read to `meta` (the device's CSR tables;
    /// nothing on the CPU, whose reference reads the selection).
    fn build_tables(&self, meta: &mut Self::Metadata) -> Result<()>;
    /// `(out, lse)`.
    fn forward(
        &self,
        meta: &Self::Metadata,
        attn: &Attention<'_, Self::Bf16>,
    ) -> Result<(Self::Bf16, Self::F32)>;
    /// `[dq, dk, dv]` from the forward's `out` and `lse`.
    fn backward(
        &self,
        meta: &Self::Metadata,
        attn: &Attention<'_, Self::Bf16>,
        dout: &Self::Bf16,
        out: &Self::Bf16,
        lse: &Self::F32,
        deterministic: bool,
    ) -> Result<[Self::Bf16; 3]>;
    /// `(indexer_topk, indexer_lse)`.
    fn indexer(
        &self,
        layout: &Self::Layout,
        index: &Index<'_, Self::Bf16>,
    ) -> Result<(Self::I32, Self::F32)>;
    /// The index LSE over the token sets of `meta`'s selection (the KL backward's input).
    fn selection_lse(
        &self,
        meta: &Self::Metadata,
        index: &Index<'_, Self::Bf16>,
    ) -> Result<Self::F32>;
    /// `(dqi, dki)`.
    fn kl_backward(
        &self,
        meta: &Self::Metadata,
        attn: &Attention<'_, Self::Bf16>,
        index: &Index<'_, Self::Bf16>,
        teacher_lse: &Self::F32,
        indexer_lse: &Self::F32,
        loss_coeff: f32,
    ) -> Result<(Self::Bf16, Self::Bf16)>;
    /// Wait for every stage enqueued so far, so that a stage's time is its own.
    fn synchronize(&self) -> Result<()>;
    fn download_bf16(&self, x: Self::Bf16) -> Result<Vec<bf16>>;
    fn download_f32(&self, x: Self::F32) -> Result<Vec<f32>>;
    fn download_i32(&self, x: Self::I32) -> Result<Vec<i32>>;
}

/// `f` as `stage`, timed until the executor has finished it.
fn timed<'a, E: Executor<'a>, T>(
    e: &E,
    times: &mut Vec<StageTime>,
    stage: Stage,
    f: impl FnOnce() -> Result<T>,
) -> Result<T> {
    let t0 = Instant::now();
    let r = f()?;
    e.synchronize()?;
    times.push(StageTime {
        stage,
        ms: t0.elapsed().as_secs_f64() * 1e3,
    });
    Ok(r)
}

/// The whole call on `e`: what `msa run`, `msa attention` and the GPU suite execute.
pub fn run<'a, E: Executor<'a>>(e: &E, p: &'a CallInputs, opts: &RunOptions) -> Result<RunResult> {
    let host = CallHost {
        layout: &p.layout,
        q: &p.q,
        topk: &p.topk_indices,
        dout: p.dout.as_deref(),
        qi: p.index.as_ref().map(|i| i.qi.as_slice()),
    };
    let keys = || {
        let ki = p.index.as_ref().map(|i| e.upload(&i.ki)).transpose()?;
        Ok((e.upload(&p.k)?, e.upload(&p.v)?, ki))
    };
    let backward = |meta: &E::Metadata,
                    attn: &Attention<'_, E::Bf16>,
                    dout: &E::Bf16,
                    out: &E::Bf16,
                    lse: &E::F32| {
        let [dq, dk, dv] = e.backward(meta, attn, dout, out, lse, opts.deterministic)?;
        Ok((dq, dk, dv))
    };
    let kl =
        |meta: &E::Metadata,
         attn: &Attention<'_, E::Bf16>,
         index: &Index<'_, E::Bf16>,
         lse: &E::F32,
         ilse: &E::F32| { e.kl_backward(meta, attn, index, lse, ilse, opts.loss_coeff) };
    let mut c = call(e, host, opts, keys, backward, kl)?;
    let o = &mut c.result.outputs;
    o.dk = c.dk.map(|x| e.download_bf16(x)).transpose()?;
    o.dv = c.dv.map(|x| e.download_bf16(x)).transpose()?;
    o.dki = c.dki.map(|x| e.download_bf16(x)).transpose()?;
    Ok(c.result)
}

/// The host inputs of [`call`] other than the key tensors.
pub(crate) struct CallHost<'a> {
    pub layout: &'a VarlenLayout,
    pub q: &'a [bf16],
    pub topk: &'a [i32],
    pub dout: Option<&'a [bf16]>,
    pub qi: Option<&'a [bf16]>,
}

/// A call's outputs (key gradients left out) and its key gradients as the stages left them.
pub(crate) struct Called<G> {
    pub result: RunResult,
    pub dk: Option<G>,
    pub dv: Option<G>,
    pub dki: Option<G>,
}

/// The call sequence, written once: `keys` brings k, v (and ki, when the call has an index) to
/// the device inside the upload stage, `backward` and `kl` run those stages and say what their
/// key gradients are. [`run`] uploads the keys and downloads their gradients rounded; a CP rank
/// builds them from all-gathered rows and keeps the gradients unrounded
/// (`crate::cp::rank_call`).
pub(crate) fn call<'a, E: Executor<'a>, G>(
    e: &E,
    host: CallHost<'a>,
    opts: &RunOptions,
    keys: impl FnOnce() -> Result<(E::Bf16, E::Bf16, Option<E::Bf16>)>,
    backward: impl FnOnce(
        &E::Metadata,
        &Attention<'_, E::Bf16>,
        &E::Bf16,
        &E::Bf16,
        &E::F32,
    ) -> Result<(E::Bf16, G, G)>,
    kl: impl FnOnce(
        &E::Metadata,
        &Attention<'_, E::Bf16>,
        &Index<'_, E::Bf16>,
        &E::F32,
        &E::F32,
    ) -> Result<(E::Bf16, G)>,
) -> Result<Called<G>> {
    let mut times = Vec::new();
    let (layout, q, (k, v, ki)) = timed(e, &mut times, Stage::Upload, || {
        Ok((e.layout(host.layout)?, e.upload(host.q)?, keys()?))
    })?;
    let attn = Attention {
        q: &q,
        k: &k,
        v: &v,
    };
    let mut meta = timed(e, &mut times, Stage::Prepare, || {
        e.prepare(&layout, host.topk)
    })?;
    let (out, lse) = timed(e, &mut times, Stage::Forward, || e.forward(&meta, &attn))?;
    let backward_runs = opts.backward && host.dout.is_some();
    let kl_runs = opts.kl && host.qi.is_some() && ki.is_some();
    if backward_runs || kl_runs {
        timed(e, &mut times, Stage::Tables, || e.build_tables(&mut meta))?;
    }
    let mut o = Outputs::default();
    let (mut dk, mut dv, mut dki) = (None, None, None);
    if let (true, Some(dout)) = (opts.backward, host.dout) {
        let dout = e.upload(dout)?;
        let stage = if opts.deterministic {
            Stage::BackwardDeterministic
        } else {
            Stage::Backward
        };
        let (dq, gk, gv) = timed(e, &mut times, stage, || {
            backward(&meta, &attn, &dout, &out, &lse)
        })?;
        o.dq = Some(e.download_bf16(dq)?);
        (dk, dv) = (Some(gk), Some(gv));
    }
    let mut kl_indexer_lse = None;
    if let (Some(qi), Some(ki)) = (host.qi, &ki) {
        let qi = e.upload(qi)?;
        let index = Index { qi: &qi, ki };
        if opts.indexer {
            let (topk, ilse) = timed(e, &mut times, Stage::Indexer, || e.indexer(&layout, &index))?;
            o.indexer_topk = Some(e.download_i32(topk)?);
            o.indexer_lse = Some(e.download_f32(ilse)?);
        }
        if opts.kl {
            let ilse = timed(e, &mut times, Stage::SelectionLse, || {
                e.selection_lse(&meta, &index)
            })?;
            let (dqi, gki) = timed(e, &mut times, Stage::Kl, || {
                kl(&meta, &attn, &index, &lse, &ilse)
            })?;
            o.dqi = Some(e.download_bf16(dqi)?);
            dki = Some(gki);
            kl_indexer_lse = Some(e.download_f32(ilse)?);
        }
    }
    o.out = Some(e.download_bf16(out)?);
    o.lse = Some(e.download_f32(lse)?);
    Ok(Called {
        result: RunResult {
            outputs: o,
            times,
            kl_indexer_lse,
        },
        dk,
        dv,
        dki,
    })
}
