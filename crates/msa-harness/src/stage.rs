//! The stages of one call: what `msa run` times and `msa bench` repeats.

use std::fmt;

use msa_plan::flops::FlopModel;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stage {
    /// Host-to-device copies of the layout and the attention inputs (nothing on the CPU).
    Upload,
    /// `prepare`: the selection validated on the device, all the forward needs
    /// (`CudaMsa::prepare_forward`). On the GPU `msa bench` times what the unchecked call (error
    /// word written, not read: no host synchronization) adds to the forward after it, on a
    /// selection just written on the device (in L2, as after the indexer), as a training step
    /// runs it; `msa run` times the checked one.
    Prepare,
    /// `prepare` followed by the validation read (one host synchronization on the GPU): what
    /// `CudaMsa::prepare_forward` returns, the host's typed error included.
    PrepareChecked,
    /// The metadata's CSR tables (`CudaMsa::build_tables`), which the backward and the KL
    /// backward read: built once a call needs them, after the forward. Nothing on the CPU.
    Tables,
    Forward,
    /// Atomic backward: delta, device task build, KV-parallel main kernel, postprocess.
    Backward,
    /// Bitwise-repeatable backward.
    BackwardDeterministic,
    Indexer,
    /// The index LSE over the attention selection's token sets, the KL backward's
    /// `indexer_lse`.
    SelectionLse,
    /// KL backward (dqi, dki).
    Kl,
    /// The forward on the mma.sync (sm_80) kernels, also on Hopper: the reference path the
    /// sm_90a kernels replace, timed in the same run.
    ForwardSm80,
    /// The atomic backward on the mma.sync (sm_80) kernels.
    BackwardSm80,
    /// The deterministic backward on the mma.sync (sm_80) kernels (on Hopper the reference of
    /// the sm_90a deterministic mode that `backward_det` times).
    BackwardDeterministicSm80,
}

impl Stage {
    /// Every stage `msa bench` can time: the API's entry points, in call order.
    pub const BENCH: [Stage; 12] = [
        Stage::Prepare,
        Stage::PrepareChecked,
        Stage::Tables,
        Stage::Forward,
        Stage::Backward,
        Stage::BackwardDeterministic,
        Stage::Indexer,
        Stage::SelectionLse,
        Stage::Kl,
        Stage::ForwardSm80,
        Stage::BackwardSm80,
        Stage::BackwardDeterministicSm80,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Stage::Upload => "upload",
            Stage::Prepare => "prepare",
            Stage::PrepareChecked => "prepare_checked",
            Stage::Tables => "tables",
            Stage::Forward => "forward",
            Stage::Backward => "backward",
            Stage::BackwardDeterministic => "backward_det",
            Stage::Indexer => "indexer",
            Stage::SelectionLse => "selection_lse",
            Stage::Kl => "kl",
            Stage::ForwardSm80 => "forward_sm80",
            Stage::BackwardSm80 => "backward_sm80",
            Stage::BackwardDeterministicSm80 => "backward_det_sm80",
        }
    }

    /// Useful FLOPs of one call (MSA FLOP model); `None` for stages the model does not count.
    pub fn flops(self, model: &FlopModel) -> Option<f64> {
        match self {
            Stage::Upload
            | Stage::Prepare
            | Stage::PrepareChecked
            | Stage::Tables
            | Stage::SelectionLse => None,
            Stage::Forward | Stage::ForwardSm80 => Some(model.fwd),
            Stage::Backward
            | Stage::BackwardDeterministic
            | Stage::BackwardSm80
            | Stage::BackwardDeterministicSm80 => Some(model.bwd),
            Stage::Indexer => Some(model.indexer),
            Stage::Kl => Some(model.kl),
        }
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

/// Written by name, as printed.
impl serde::Serialize for Stage {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flops_follow_the_model() {
        let model = FlopModel {
            fwd: 2.0,
            bwd: 5.0,
            indexer: 1.0,
            kl: 3.0,
        };
        let flops: Vec<_> = Stage::BENCH.iter().map(|s| s.flops(&model)).collect();
        assert_eq!(
            flops,
            [
                None,
                None,
                None,
                Some(2.0),
                Some(5.0),
                Some(5.0),
                Some(1.0),
                None,
                Some(3.0),
                Some(2.0),
                Some(5.0),
                Some(5.0)
            ]
        );
        assert_eq!(Stage::Upload.flops(&model), None);
    }

    #[test]
    fn names_are_unique() {
        let mut names: Vec<_> = Stage::BENCH.iter().map(|s| s.name()).collect();
        names.push(Stage::Upload.name());
        let n = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), n);
    }
}
