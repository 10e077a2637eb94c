//! One call of the training contract on the GPU from host tensors (what `msa run` and
//! `msa attention` do): upload, prepare, forward, backward, indexer, KL, download. Each stage
//! is synchronized so its time is its own.

use std::sync::Arc;

use super::{BackwardOptions, CudaMsa, DeviceLayout, KlInputs};
use crate::backend::{kl_indexer_lse, timed, RunOptions, RunResult};
use crate::error::Result;
use crate::io::{AttentionFile, Outputs};

/// `r` once the stream has drained, so a stage's time covers its kernels.
fn sync<T>(m: &CudaMsa, r: T) -> Result<T> {
    m.synchronize()?;
    Ok(r)
}

pub fn run(m: &CudaMsa, p: &AttentionFile, opts: &RunOptions) -> Result<RunResult> {
    // Host selections are rejected here, before anything reaches the device.
    msa_plan::topk::validate_topk(&p.layout, &p.topk_indices)?;
    let mut times = Vec::new();
    let (layout, q, k, v) = timed(&mut times, "upload", || {
        let layout = Arc::new(DeviceLayout::new(m, p.layout.clone())?);
        sync(
            m,
            (layout, m.upload(&p.q)?, m.upload(&p.k)?, m.upload(&p.v)?),
        )
    })?;
    let meta = timed(&mut times, "prepare", || {
        let topk = m.upload(&p.topk_indices)?;
        sync(m, m.prepare(&layout, topk)?)
    })?;
    let fwd = timed(&mut times, "forward", || {
        sync(m, m.forward(&meta, &q, &k, &v)?)
    })?;
    let mut o = Outputs::default();
    if let (true, Some(dout)) = (opts.backward, &p.dout) {
        let dout = m.upload(dout)?;
        let bw = BackwardOptions {
            deterministic: opts.deterministic,
        };
        let g = timed(&mut times, "backward", || {
            sync(
                m,
                m.backward(&meta, &q, &k, &v, &dout, &fwd.out, &fwd.lse, bw)?,
            )
        })?;
        o.dq = Some(m.download(&g.dq)?);
        o.dk = Some(m.download(&g.dk)?);
        o.dv = Some(m.download(&g.dv)?);
    }
    let mut kl_lse = None;
    if let Some(index) = &p.index {
        let qi = m.upload(&index.qi)?;
        let ki = m.upload(&index.ki)?;
        if opts.indexer {
            let (topk, lse) = timed(&mut times, "indexer", || {
                sync(m, m.indexer_forward(&layout, &qi, &ki)?)
            })?;
            o.indexer_topk = Some(m.download(&topk)?);
            o.indexer_lse = Some(m.download(&lse)?);
        }
        if opts.kl {
            let ilse = timed(&mut times, "kl_index_lse", || kl_indexer_lse(p))?;
            let ilse_dev = m.upload(&ilse)?;
            let inputs = KlInputs {
                q: &q,
                k: &k,
                teacher_lse: &fwd.lse,
                qi: &qi,
                ki: &ki,
                indexer_lse: &ilse_dev,
            };
            let (dqi, dki) = timed(&mut times, "kl_backward", || {
                sync(m, m.kl_backward(&meta, &inputs, opts.loss_coeff)?)
            })?;
            o.dqi = Some(m.download(&dqi)?);
            o.dki = Some(m.download(&dki)?);
            kl_lse = Some(ilse);
        }
    }
    o.out = Some(m.download(&fwd.out)?);
    o.lse = Some(m.download(&fwd.lse)?);
    Ok(RunResult {
        outputs: o,
        times,
        kl_indexer_lse: kl_lse,
    })
}
