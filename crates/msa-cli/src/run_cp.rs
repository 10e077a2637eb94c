//! `msa run --cp N`: each selected pack split over N context-parallel ranks (MSA's chunk
//! dispatch with cp = N, docs/cp.md), every rank's local call with K/V (and KI) all-gathered and
//! the key gradients reduce-scattered, the assembled outputs checked against the single call
//! over the whole pack on the same backend; communication timed beside the kernels.

use std::process::ExitCode;
use std::time::Instant;

use clap::ValueEnum;
use half::bf16;
use msa_harness::backend::{Backend, CpuReference, RunOptions, StageTime};
use msa_harness::check::{against_outputs, CheckReport};
use msa_harness::cp::{pack_call, run_sequential, CpResult, RankInputs};
use msa_harness::io::Outputs;
use msa_harness::memory::{CallShape, MemoryLimit};
use msa_harness::{HarnessError, Result};
use msa_workloads::{truncate_pack, CpConfig, CpPlan, InputMode, Pattern};

use crate::json::{self, JsonLines};
use crate::run::Args;

/// How CP ranks exchange K/V and key gradients.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CpTransport {
    /// `nccl` on the GPU backend, `sequential` on the CPU.
    Auto,
    /// One thread per GPU, rank r on device r, NCCL all-gather / reduce-scatter (needs N GPUs
    /// and the NCCL library: set MSA_NCCL_LIB to libnccl.so.2 when it is not on the loader's
    /// path).
    Nccl,
    /// Every rank in turn on one device (or the CPU): the all-gather by device copies, the
    /// reduce-scatter as an f32 sum on the host. The whole per-rank path without a transport.
    Sequential,
}

/// The per-stage time of the CP run: summed over ranks when they run in turn, the slowest rank
/// when they run at once.
fn stage_times(rank_times: &[Vec<StageTime>], parallel: bool) -> Vec<StageTime> {
    let mut out: Vec<StageTime> = rank_times[0].clone();
    for st in &mut out {
        let each = rank_times
            .iter()
            .filter_map(|t| t.iter().find(|x| x.stage == st.stage).map(|x| x.ms));
        st.ms = if parallel {
            each.fold(0.0, f64::max)
        } else {
            each.sum()
        };
    }
    out
}

/// Share of elements equal bit for bit, per tensor both outputs have.
fn bitwise_shares(a: &Outputs, e: &Outputs) -> Vec<(&'static str, f64)> {
    fn share<T: PartialEq>(a: &[T], e: &[T]) -> f64 {
        let same = a.iter().zip(e).filter(|(x, y)| x == y).count();
        same as f64 / a.len().max(1) as f64
    }
    let b = |x: &Option<Vec<bf16>>| {
        x.as_ref()
            .map(|v| v.iter().map(|y| y.to_bits()).collect::<Vec<_>>())
    };
    let f = |x: &Option<Vec<f32>>| {
        x.as_ref()
            .map(|v| v.iter().map(|y| y.to_bits()).collect::<Vec<_>>())
    };
    let mut out = Vec::new();
    for (name, x, y) in [
        ("out", b(&a.out), b(&e.out)),
        ("dq", b(&a.dq), b(&e.dq)),
        ("dk", b(&a.dk), b(&e.dk)),
        ("dv", b(&a.dv), b(&e.dv)),
        ("dqi", b(&a.dqi), b(&e.dqi)),
        ("dki", b(&a.dki), b(&e.dki)),
    ] {
        if let (Some(x), Some(y)) = (x, y) {
            out.push((name, share(&x, &y)));
        }
    }
    for (name, x, y) in [
        ("lse", f(&a.lse), f(&e.lse)),
        ("indexer_lse", f(&a.indexer_lse), f(&e.indexer_lse)),
    ] {
        if let (Some(x), Some(y)) = (x, y) {
            out.push((name, share(&x, &y)));
        }
    }
    if let (Some(x), Some(y)) = (&a.indexer_topk, &e.indexer_topk) {
        out.push(("indexer_topk", share(x, y)));
    }
    out
}

fn run_split(
    backend: &Backend,
    transport: CpTransport,
    plan: &CpPlan,
    ranks: &[RankInputs],
    opts: &RunOptions,
) -> Result<CpResult> {
    match (transport, backend) {
        (CpTransport::Sequential, Backend::Cpu) => run_sequential(&CpuReference, plan, ranks, opts),
        #[cfg(feature = "msa")]
        (CpTransport::Sequential, Backend::Cuda(m)) => run_sequential(m, plan, ranks, opts),
        #[cfg(feature = "msa")]
        (CpTransport::Nccl, Backend::Cuda(_)) => {
            msa_harness::cp::nccl::run_nccl(plan, ranks, opts, true)
        }
        (CpTransport::Nccl | CpTransport::Auto, _) => {
            unreachable!("the caller resolves the transport and refuses NCCL on the CPU")
        }
    }
}

/// `msa run` with `--cp N`: the selected packs (each once, whatever `--rank`), each pattern and
/// input mode.
pub fn run(a: &Args, cp_size: usize, limit: &MemoryLimit) -> Result<ExitCode> {
    let tol = a.tolerances.tolerances();
    json::check(a.json.as_deref(), a.force, &[&a.cases.manifest_path()])?;
    let selection = a.cases.select()?;
    let backend = a.backend.open(true)?;
    let transport = match a.cp_transport {
        CpTransport::Auto if backend.is_cpu() => CpTransport::Sequential,
        CpTransport::Auto => CpTransport::Nccl,
        t => t,
    };
    if transport == CpTransport::Nccl && backend.is_cpu() {
        return Err(HarnessError::Cp(
            "the NCCL transport runs on the GPU backend (`--backend cuda`, a build with `msa`); \
             `--cp-transport sequential` runs the ranks in turn on the CPU"
                .into(),
        ));
    }
    // Before any work: the NCCL library may need this command to run again.
    #[cfg(feature = "msa")]
    if transport == CpTransport::Nccl && !backend.is_cpu() {
        crate::nccl_lib::ensure_loadable()?;
    }
    eprintln!(
        "backend: {}, CP {cp_size}, transport {}",
        backend.name(),
        transport.to_possible_value().unwrap().get_name()
    );
    let opts = RunOptions {
        backward: true,
        indexer: a.indexer,
        kl: a.kl,
        deterministic: a.deterministic,
        loss_coeff: a.loss_coeff,
    };
    let mut packs: Vec<(u64, Pattern)> = Vec::new();
    for s in &selection.specs {
        if !packs.contains(&(s.case_id, s.pattern)) {
            packs.push((s.case_id, s.pattern));
        }
    }
    let seed = a.cases.seed;
    let mut json = JsonLines::create(a.json.as_deref(), a.force)?;
    let (mut runs, mut failed) = (0, 0);
    for &(case_id, pattern) in &packs {
        let case = selection
            .listed
            .iter()
            .find(|c| c.case_id == case_id)
            .expect("the selection lists its cases");
        let cu = match a.pack_tokens {
            Some(n) => truncate_pack(&case.cu_seqlens, n)?,
            None => case.cu_seqlens.clone(),
        };
        let cfg = CpConfig {
            cp_size,
            chunk_size: CpConfig::default().chunk_size,
        };
        let plan = CpPlan::new(case_id, &cu, cfg)?;
        let layout = plan.pack_layout()?;
        // The pack's inputs and outputs, the ranks' copies of them, the CP outputs and the
        // f32 copies of the check: about twice one call's estimate (which counts the CPU
        // reference's f32 gradients too).
        let shape = CallShape::of(&layout);
        limit.check(2 * shape.run_bytes(), || {
            format!("CP run of case {case_id} ({shape})")
        })?;
        for inputs in &a.inputs {
            let mode = inputs.mode();
            runs += 1;
            let t0 = Instant::now();
            let name = format!(
                "case{case_id}/cp{cp_size}/{pattern}/s{seed}{}{}",
                a.pack_tokens.map_or(String::new(), |n| format!("/{n}tok")),
                match mode {
                    InputMode::Msa => String::new(),
                    m => format!("/{m}"),
                }
            );
            eprintln!(
                "{name}: building inputs ({} tokens) ...",
                plan.total_tokens()
            );
            let p = pack_call(&plan, case_id, pattern, seed, mode)?;
            eprintln!("{name}: single call on {} ...", backend.name());
            let single = backend.run(&p, &opts)?;
            let ranks = RankInputs::split(&plan, &p)?;
            drop(p);
            eprintln!("{name}: {cp_size} ranks ...");
            let cp = run_split(&backend, transport, &plan, &ranks, &opts)?;
            let report: CheckReport = against_outputs(&cp.outputs, &single.outputs, &tol)?;
            let passed = report.passed();
            failed += !passed as usize;
            println!(
                "{name} on {} (cp {cp_size}, {}) against the single call: {}",
                backend.name(),
                transport.to_possible_value().unwrap().get_name(),
                if passed { "PASS" } else { "FAIL" }
            );
            print!("{}", report.table());
            let shares = bitwise_shares(&cp.outputs, &single.outputs);
            println!(
                "  bitwise equal: {}",
                shares
                    .iter()
                    .map(|(n, s)| format!("{n} {:.3}%", s * 100.0))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            let parallel = transport == CpTransport::Nccl;
            let cp_times = stage_times(&cp.rank_times, parallel);
            let kernel_ms: f64 = cp_times
                .iter()
                .filter(|t| t.stage != msa_harness::Stage::Upload)
                .map(|t| t.ms)
                .sum();
            let comm_ms: f64 = cp.comm.iter().map(|c| c.ms).sum();
            println!(
                "  time {:<28} {:>10} {:>10}",
                "stage",
                "single",
                if parallel { "cp (max)" } else { "cp (sum)" }
            );
            for st in &cp_times {
                let one = single
                    .times
                    .iter()
                    .find(|x| x.stage == st.stage)
                    .map_or(f64::NAN, |x| x.ms);
                println!("  time {:<28} {one:>10.2} {:>10.2} ms", st.stage, st.ms);
            }
            for c in &cp.comm {
                println!("  comm {:<28} {:>10} {:>10.2} ms", c.what, "", c.ms);
            }
            println!("  cp local calls {kernel_ms:.2} ms, communication {comm_ms:.2} ms");
            println!("  total {:.1} s", t0.elapsed().as_secs_f64());
            json.write(|| {
                serde_json::json!({
                    "case": name, "cp": cp_size, "transport": transport.to_possible_value().unwrap().get_name(),
                    "inputs": mode.name(), "backend": backend.name(), "passed": passed,
                    "lines": report.lines, "single_times": single.times, "cp_times": cp_times,
                    "comm": cp.comm, "bitwise_equal": shares.iter().map(|(n, s)| (n.to_string(), *s)).collect::<std::collections::BTreeMap<_, _>>(),
                })
            })?;
        }
    }
    if runs > 1 {
        println!("{} of {runs} CP runs passed", runs - failed);
    }
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
