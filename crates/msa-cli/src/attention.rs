//! `msa attention`: the attention of tensors in a safetensors file (MSA's tensor names), with
//! the gradients when `dout` is present and the indexer when `qi`/`ki` are.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args as ClapArgs;
use msa_harness::backend::RunOptions;
use msa_harness::io::{read_inputs_within, write_outputs};
use msa_harness::memory::{CallShape, MemoryLimit};
use msa_harness::{output_path, Result};

use crate::args::BackendArg;

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Inputs: q, k, v, topk_indices, cu_seqlens_q, cu_seqlens_k [, fragment_indices, dout, qi, ki].
    #[arg(long)]
    pub inputs: PathBuf,
    /// Outputs: out, lse [, dq, dk, dv] [, indexer_topk, indexer_lse].
    #[arg(long)]
    pub outputs: PathBuf,
    /// Where the call runs.
    #[arg(long, value_enum, default_value_t = BackendArg::Auto)]
    pub backend: BackendArg,
    /// Bitwise-repeatable backward.
    #[arg(long)]
    pub deterministic: bool,
    /// Replace an existing outputs file (a regular file only: never a device, FIFO, link or
    /// directory, never the inputs).
    #[arg(long)]
    pub force: bool,
}

pub fn run(a: &Args, limit: &MemoryLimit) -> Result<ExitCode> {
    // Refused before any work; the writer checks again before it renames its file into place.
    output_path::refuse_input(&a.outputs, &a.inputs)?;
    output_path::check(&a.outputs, a.force)?;
    let p = read_inputs_within(&a.inputs, limit)?;
    let shape = CallShape::of(&p.layout);
    limit.check(shape.run_bytes(), || {
        format!("the call of {} ({shape})", a.inputs.display())
    })?;
    let backend = a.backend.open(false)?;
    eprintln!(
        "{}: T {}, Tk {}, {} fragments; backward {}, indexer {}; backend {}",
        a.inputs.display(),
        p.layout.total_q(),
        p.layout.total_k(),
        p.layout.batch(),
        p.dout.is_some(),
        p.index.is_some(),
        backend.name()
    );
    let opts = RunOptions {
        backward: true,
        indexer: true,
        kl: false,
        deterministic: a.deterministic,
        loss_coeff: 1.0,
    };
    let result = backend.run(&p, &opts)?;
    for st in &result.times {
        eprintln!("  {:<14} {:>10.2} ms", st.stage, st.ms);
    }
    write_outputs(&a.outputs, &result.outputs, a.force)?;
    eprintln!("wrote {}", a.outputs.display());
    Ok(ExitCode::SUCCESS)
}
