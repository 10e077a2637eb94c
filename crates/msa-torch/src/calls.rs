//! The integer-level calls of the extension (feature `kernels`): every tensor is a [`View`],
//! `(device address, element count)` as Python gives them (`t.data_ptr(), t.numel()`), the
//! stream a `cudaStream_t` as an integer. Each call builds the `msa::raw` views and calls the raw
//! layer, which checks every length and alignment against the call's [`Sizes`] before any launch.
//! Nothing here holds the GIL or knows Python: `python.rs` wraps these.

use half::bf16;
use msa::raw::{
    self, AttentionInputs, BackwardInputs, BackwardPath, CallShape, DevSlice, DevSliceMut, Elem,
    ForwardOutputs, Gradients, KernelSet, KlInputs, Layout, LayoutOutputs, Metadata,
    PrepareOutputs, Sizes, Stream,
};
use msa::{MsaError, Result};

/// One tensor: `(data_ptr, numel)`.
pub type View = (u64, usize);

/// The layout tensors in the order every call takes them.
pub const LAYOUT_NAMES: [&str; 6] = [
    "cu_seqlens_q",
    "cu_seqlens_k",
    "fragment_first",
    "query_fragment",
    "block_key_start",
    "block_key_count",
];

/// The metadata tensors (the selection, then prepare's outputs) in the order every call takes
/// them.
pub const METADATA_NAMES: [&str; 13] = [
    "topk_indices",
    "error_word",
    "row_ptr",
    "q_indices",
    "qsplit",
    "split_counts",
    "scheduler_metadata",
    "work_count",
    "phys_row_ptr",
    "phys_q_indices",
    "phys_valid",
    "document_workspace_starts",
    "query_offsets",
];

fn argument(name: &'static str, expected: impl Into<String>, got: impl Into<String>) -> MsaError {
    MsaError::Tensor {
        name,
        expected: expected.into(),
        got: got.into(),
    }
}

/// The kernel set named `sm90a` or `sm80`.
pub fn kernel_set(name: &str) -> Result<KernelSet> {
    match name {
        "sm90a" => Ok(KernelSet::Sm90a),
        "sm80" => Ok(KernelSet::Sm80),
        other => Err(argument(
            "kernels",
            "\"sm90a\" or \"sm80\"",
            format!("{other:?}"),
        )),
    }
}

/// The name of a kernel set.
pub fn kernel_set_name(kernels: KernelSet) -> &'static str {
    match kernels {
        KernelSet::Sm90a => "sm90a",
        KernelSet::Sm80 => "sm80",
    }
}

/// The backward path named `sm90`, `sm80_atomic`, `deterministic` or `sm80_deterministic`.
pub fn backward_path(name: &str) -> Result<BackwardPath> {
    match name {
        "sm90" => Ok(BackwardPath::Sm90),
        "sm80_atomic" => Ok(BackwardPath::Sm80Atomic),
        "deterministic" => Ok(BackwardPath::Deterministic),
        "sm80_deterministic" => Ok(BackwardPath::Sm80Deterministic),
        other => Err(argument(
            "backward path",
            "\"sm90\", \"sm80_atomic\", \"deterministic\" or \"sm80_deterministic\"",
            format!("{other:?}"),
        )),
    }
}

/// The name of a backward path.
pub fn backward_path_name(path: BackwardPath) -> &'static str {
    match path {
        BackwardPath::Sm90 => "sm90",
        BackwardPath::Sm80Atomic => "sm80_atomic",
        BackwardPath::Deterministic => "deterministic",
        BackwardPath::Sm80Deterministic => "sm80_deterministic",
    }
}

/// Every size of a call by name: the shape's integers, each [`Sizes`] field (element counts),
/// and the workspace bytes of each kernel set and backward path (`forward_workspace_bytes_sm90a`,
/// `backward_workspace_bytes_deterministic`, ...). Prepare's scratch is not here: the kernel
/// library sizes it ([`prepare_workspace_bytes`]).
pub fn size_entries(shape: &CallShape) -> Vec<(&'static str, usize)> {
    let Sizes {
        cu_seqlens,
        batch: _,
        query_fragment,
        block_keys,
        selection,
        error_word,
        row_ptr,
        split_counts,
        target_q_per_cta,
        work_capacity,
        scheduler_metadata,
        work_count,
        phys_row_ptr,
        queries,
        keys,
        query_heads,
        pool,
        task_build,
        grid_launch,
        index_queries,
        index_keys,
        index_lse,
        forward_sm90_bytes: _,
        backward_sm90_bytes: _,
        backward_sm90_det_bytes: _,
        indexer_workspace_bytes,
        kl_workspace_bytes,
    } = shape.sizes().clone();
    let s = shape.sizes();
    vec![
        ("total_q", shape.total_q()),
        ("total_k", shape.total_k()),
        ("batch", shape.batch()),
        ("total_rows", shape.total_rows()),
        ("max_seqlen_k", shape.max_seqlen_k()),
        ("has_fragments", usize::from(shape.has_fragments())),
        ("sm_count", shape.sm_count()),
        ("max_blocks", shape.max_blocks()),
        ("padded_kv_blocks", shape.padded_kv_blocks()),
        ("workspace_rows", shape.workspace_rows()),
        ("cu_seqlens", cu_seqlens),
        ("query_fragment", query_fragment),
        ("block_keys", block_keys),
        ("selection", selection),
        ("error_word", error_word),
        ("row_ptr", row_ptr),
        ("split_counts", split_counts),
        ("target_q_per_cta", target_q_per_cta),
        ("work_capacity", work_capacity),
        ("scheduler_metadata", scheduler_metadata),
        ("work_count", work_count),
        ("phys_row_ptr", phys_row_ptr),
        ("queries", queries),
        ("keys", keys),
        ("query_heads", query_heads),
        ("pool", pool),
        ("task_build_capacity", task_build.map_or(0, |t| t.capacity)),
        ("grid_launch", grid_launch),
        ("index_queries", index_queries),
        ("index_keys", index_keys),
        ("index_lse", index_lse),
        (
            "forward_workspace_bytes_sm90a",
            s.forward_workspace_bytes(KernelSet::Sm90a),
        ),
        (
            "forward_workspace_bytes_sm80",
            s.forward_workspace_bytes(KernelSet::Sm80),
        ),
        (
            "backward_workspace_bytes_sm90",
            s.backward_workspace_bytes(BackwardPath::Sm90),
        ),
        (
            "backward_workspace_bytes_sm80_atomic",
            s.backward_workspace_bytes(BackwardPath::Sm80Atomic),
        ),
        (
            "backward_workspace_bytes_deterministic",
            s.backward_workspace_bytes(BackwardPath::Deterministic),
        ),
        (
            "backward_workspace_bytes_sm80_deterministic",
            s.backward_workspace_bytes(BackwardPath::Sm80Deterministic),
        ),
        ("indexer_workspace_bytes", indexer_workspace_bytes),
        ("kl_workspace_bytes", kl_workspace_bytes),
    ]
}

/// A read-only view of `v`.
///
/// # Safety
/// As [`DevSlice::new`].
unsafe fn ro<T: Elem>(v: View) -> DevSlice<T> {
    // SAFETY: the caller's contract.
    unsafe { DevSlice::new(v.0, v.1) }
}

/// A writable view of `v`.
///
/// # Safety
/// As [`DevSliceMut::new`].
unsafe fn rw<T: Elem>(v: View) -> DevSliceMut<T> {
    // SAFETY: the caller's contract.
    unsafe { DevSliceMut::new(v.0, v.1) }
}

fn exactly<'a, const N: usize>(
    what: &'static str,
    names: &[&str; N],
    views: &'a [View],
) -> Result<&'a [View; N]> {
    views.try_into().map_err(|_| {
        argument(
            what,
            format!("{N} tensors ({})", names.join(", ")),
            format!("{} tensors", views.len()),
        )
    })
}

/// The layout of `views` ([`LAYOUT_NAMES`] order).
///
/// # Safety
/// Each view must be device memory of its length (see [`DevSlice::new`]).
unsafe fn layout(views: &[View]) -> Result<Layout> {
    let [cq, ck, ff, qf, bks, bkc] = *exactly("layout", &LAYOUT_NAMES, views)?;
    // SAFETY: the caller's contract, per view.
    unsafe {
        Ok(Layout {
            cu_seqlens_q: ro(cq),
            cu_seqlens_k: ro(ck),
            fragment_first: ro(ff),
            query_fragment: ro(qf),
            block_key_start: ro(bks),
            block_key_count: ro(bkc),
        })
    }
}

/// The metadata of `views` ([`METADATA_NAMES`] order).
///
/// # Safety
/// As [`layout`].
unsafe fn metadata(views: &[View]) -> Result<Metadata> {
    let [topk, ew, rp, qi, qs, sc, sm, wc, prp, pqi, pv, dws, qo] =
        *exactly("metadata", &METADATA_NAMES, views)?;
    // SAFETY: the caller's contract, per view.
    unsafe {
        Ok(Metadata {
            topk: ro(topk),
            error_word: ro(ew),
            row_ptr: ro(rp),
            q_indices: ro(qi),
            qsplit: ro(qs),
            split_counts: ro(sc),
            scheduler_metadata: ro(sm),
            work_count: ro(wc),
            phys_row_ptr: ro(prp),
            phys_q_indices: ro(pqi),
            phys_valid: ro(pv),
            document_workspace_starts: ro(dws),
            query_offsets: ro(qo),
        })
    }
}

/// `raw::build_layout`: `out` = fragment_first, query_fragment, block_key_start,
/// block_key_count.
///
/// # Safety
/// Every view must be device memory of its length of the current CUDA context that stays
/// allocated until the launches ran; `stream` a live stream of that context; the cu_seqlens
/// (and fragment_indices) must form the layout `shape` describes (`raw::build_layout`).
pub unsafe fn build_layout(
    shape: &CallShape,
    cu_seqlens_q: View,
    cu_seqlens_k: View,
    fragment_indices: Option<View>,
    out: [View; 4],
    stream: usize,
) -> Result<()> {
    let [ff, qf, bks, bkc] = out;
    // SAFETY: the caller's contract.
    unsafe {
        let mut out = LayoutOutputs {
            fragment_first: rw(ff),
            query_fragment: rw(qf),
            block_key_start: rw(bks),
            block_key_count: rw(bkc),
        };
        raw::build_layout(
            shape,
            ro(cu_seqlens_q),
            ro(cu_seqlens_k),
            fragment_indices.map(|f| ro(f)),
            &mut out,
            Stream::from_addr(stream),
        )
    }
}

/// `raw::prepare_workspace_bytes`.
pub fn prepare_workspace_bytes(shape: &CallShape) -> Result<usize> {
    raw::prepare_workspace_bytes(shape)
}

/// `raw::prepare` (unchecked): `out` holds prepare's 12 outputs ([`METADATA_NAMES`] after the
/// selection).
///
/// # Safety
/// As [`build_layout`]; `layout` must be `build_layout`'s arrays of `shape`.
pub unsafe fn prepare(
    shape: &CallShape,
    layout_views: &[View],
    topk: View,
    out: &[View],
    workspace: View,
    stream: usize,
) -> Result<()> {
    let names: &[&str; 12] = METADATA_NAMES[1..].try_into().expect("12 names");
    let [ew, rp, qi, qs, sc, sm, wc, prp, pqi, pv, dws, qo] =
        *exactly("prepare outputs", names, out)?;
    // SAFETY: the caller's contract.
    unsafe {
        let layout = layout(layout_views)?;
        let mut out = PrepareOutputs {
            error_word: rw(ew),
            row_ptr: rw(rp),
            q_indices: rw(qi),
            qsplit: rw(qs),
            split_counts: rw(sc),
            scheduler_metadata: rw(sm),
            work_count: rw(wc),
            phys_row_ptr: rw(prp),
            phys_q_indices: rw(pqi),
            phys_valid: rw(pv),
            document_workspace_starts: rw(dws),
            query_offsets: rw(qo),
        };
        raw::prepare(
            shape,
            &layout,
            ro(topk),
            &mut out,
            rw(workspace),
            Stream::from_addr(stream),
        )
    }
}

/// `raw::validate_prepare`: synchronizes `stream` and reads the error word.
///
/// # Safety
/// As [`build_layout`]; never while `stream` is being captured.
pub unsafe fn validate_prepare(shape: &CallShape, error_word: View, stream: usize) -> Result<()> {
    // SAFETY: the caller's contract.
    unsafe { raw::validate_prepare(shape, ro(error_word), Stream::from_addr(stream)) }
}

/// The read-only views of the attention: q, k, v (bf16).
pub type Qkv = [View; 3];

/// `raw::forward` with the kernel set named `kernels`; `out` = (out, lse).
///
/// # Safety
/// As [`build_layout`]; `meta` must be [`prepare`]'s outputs for `layout` on a validated
/// selection.
#[allow(clippy::too_many_arguments)]
pub unsafe fn forward(
    shape: &CallShape,
    layout_views: &[View],
    meta_views: &[View],
    qkv: Qkv,
    out: [View; 2],
    kernels: &str,
    workspace: View,
    stream: usize,
) -> Result<()> {
    let kernels = kernel_set(kernels)?;
    let [q, k, v] = qkv;
    // SAFETY: the caller's contract.
    unsafe {
        let layout = layout(layout_views)?;
        let meta = metadata(meta_views)?;
        let inputs = AttentionInputs {
            q: ro::<bf16>(q),
            k: ro(k),
            v: ro(v),
        };
        let mut outputs = ForwardOutputs {
            out: rw(out[0]),
            lse: rw(out[1]),
        };
        raw::forward(
            shape,
            &layout,
            meta.topk,
            &inputs,
            &mut outputs,
            kernels,
            rw(workspace),
            Stream::from_addr(stream),
        )
    }
}

/// `raw::backward` on the path named `path`; `inputs` = (dout, out, lse), `grads` = (dq, dk, dv).
///
/// # Safety
/// As [`forward`].
#[allow(clippy::too_many_arguments)]
pub unsafe fn backward(
    shape: &CallShape,
    layout_views: &[View],
    meta_views: &[View],
    qkv: Qkv,
    inputs: [View; 3],
    grads: [View; 3],
    path: &str,
    workspace: View,
    stream: usize,
) -> Result<()> {
    let path = backward_path(path)?;
    let [q, k, v] = qkv;
    let [dout, out, lse] = inputs;
    // SAFETY: the caller's contract.
    unsafe {
        let layout = layout(layout_views)?;
        let meta = metadata(meta_views)?;
        let inputs = BackwardInputs {
            q: ro(q),
            k: ro(k),
            v: ro(v),
            dout: ro(dout),
            out: ro(out),
            lse: ro(lse),
        };
        let mut grads = Gradients {
            dq: rw(grads[0]),
            dk: rw(grads[1]),
            dv: rw(grads[2]),
        };
        raw::backward(
            shape,
            &layout,
            &meta,
            &inputs,
            &mut grads,
            path,
            rw(workspace),
            Stream::from_addr(stream),
        )
    }
}

/// `raw::indexer_forward`: (qi, ki) → (topk, lse).
///
/// # Safety
/// As [`build_layout`].
pub unsafe fn indexer_forward(
    shape: &CallShape,
    layout_views: &[View],
    index: [View; 2],
    out: [View; 2],
    workspace: View,
    stream: usize,
) -> Result<()> {
    // SAFETY: the caller's contract.
    unsafe {
        let layout = layout(layout_views)?;
        raw::indexer_forward(
            shape,
            &layout,
            ro(index[0]),
            ro(index[1]),
            &mut rw(out[0]),
            &mut rw(out[1]),
            rw(workspace),
            Stream::from_addr(stream),
        )
    }
}

/// `raw::selection_lse`: the index LSE over the token sets of `topk`.
///
/// # Safety
/// As [`build_layout`].
pub unsafe fn selection_lse(
    shape: &CallShape,
    layout_views: &[View],
    topk: View,
    index: [View; 2],
    lse: View,
    stream: usize,
) -> Result<()> {
    // SAFETY: the caller's contract.
    unsafe {
        let layout = layout(layout_views)?;
        raw::selection_lse(
            shape,
            &layout,
            ro(topk),
            ro(index[0]),
            ro(index[1]),
            &mut rw(lse),
            Stream::from_addr(stream),
        )
    }
}

/// `raw::kl_backward`; `inputs` = (q, k, teacher_lse, qi, ki, indexer_lse), `grads` = (dqi,
/// dki).
///
/// # Safety
/// As [`forward`].
#[allow(clippy::too_many_arguments)]
pub unsafe fn kl_backward(
    shape: &CallShape,
    layout_views: &[View],
    meta_views: &[View],
    inputs: [View; 6],
    loss_coeff: f32,
    grads: [View; 2],
    workspace: View,
    stream: usize,
) -> Result<()> {
    let [q, k, tl, qi, ki, il] = inputs;
    // SAFETY: the caller's contract.
    unsafe {
        let layout = layout(layout_views)?;
        let meta = metadata(meta_views)?;
        let inputs = KlInputs {
            q: ro(q),
            k: ro(k),
            teacher_lse: ro(tl),
            qi: ro(qi),
            ki: ro(ki),
            indexer_lse: ro(il),
        };
        raw::kl_backward(
            shape,
            &layout,
            &meta,
            &inputs,
            loss_coeff,
            &mut rw(grads[0]),
            &mut rw(grads[1]),
            rw(workspace),
            Stream::from_addr(stream),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> CallShape {
        // Two documents of 300 and 77 keys, every key a query: rows 3 + 1.
        CallShape::new(377, 377, 2, 4, 300, false, 132).expect("shape")
    }

    #[test]
    fn names_round_trip() {
        for k in [KernelSet::Sm90a, KernelSet::Sm80] {
            assert_eq!(kernel_set(kernel_set_name(k)).unwrap(), k);
        }
        for p in [
            BackwardPath::Sm90,
            BackwardPath::Sm80Atomic,
            BackwardPath::Deterministic,
            BackwardPath::Sm80Deterministic,
        ] {
            assert_eq!(backward_path(backward_path_name(p)).unwrap(), p);
        }
        assert!(kernel_set("sm100").is_err());
        assert!(backward_path("atomic").is_err());
    }

    #[test]
    fn sizes_name_every_tensor() {
        let s = shape();
        let entries: std::collections::HashMap<_, _> = size_entries(&s).into_iter().collect();
        assert_eq!(entries["selection"], 4 * 377 * 16);
        assert_eq!(entries["row_ptr"], 4 * 5);
        assert_eq!(entries["queries"], 377 * 64 * 128);
        assert_eq!(entries["keys"], 377 * 4 * 128);
        assert_eq!(entries["padded_kv_blocks"], (377 + 3 * 128 - 1) / 128);
        assert_eq!(
            entries["scheduler_metadata"],
            entries["work_capacity"] * msa_plan::schedule::WORK_WORDS
        );
        assert_eq!(entries["forward_workspace_bytes_sm80"], 0);
        assert!(entries["backward_workspace_bytes_deterministic"] >= 377 * 64 * 4);
        let names: std::collections::HashSet<_> =
            size_entries(&s).into_iter().map(|(n, _)| n).collect();
        assert_eq!(names.len(), size_entries(&s).len(), "names are unique");
    }

    #[test]
    fn wrong_counts_and_lengths_are_argument_errors_before_any_launch() {
        let s = shape();
        let sz = s.sizes().clone();
        // Five layout views instead of six.
        // SAFETY: rejected before any view is used.
        let e =
            unsafe { selection_lse(&s, &[(0, 0); 5], (0, 0), [(0, 0); 2], (0, 0), 0) }.unwrap_err();
        assert!(e.to_string().contains("6 tensors"), "{e}");
        assert_eq!(crate::error_kind(&e), crate::ErrorKind::Argument);
        // A q one element short: the raw layer names it. Addresses are never dereferenced.
        let layout = [
            (256, sz.cu_seqlens),
            (512, sz.cu_seqlens),
            (768, sz.batch),
            (1024, sz.query_fragment),
            (4096, sz.block_keys),
            (8192, sz.block_keys),
        ];
        let meta = [
            (1 << 20, sz.selection),
            (2 << 20, sz.error_word),
            (3 << 20, sz.row_ptr),
            (4 << 20, sz.selection),
            (5 << 20, sz.selection),
            (6 << 20, sz.split_counts),
            (7 << 20, sz.scheduler_metadata),
            (8 << 20, sz.work_count),
            (9 << 20, sz.phys_row_ptr),
            (10 << 20, sz.selection),
            (11 << 20, sz.selection),
            (12 << 20, sz.batch),
            (13 << 20, sz.batch),
        ];
        let qkv = [
            (20 << 20, sz.queries - 1),
            (40 << 20, sz.keys),
            (60 << 20, sz.keys),
        ];
        let out = [(80 << 20, sz.queries), (100 << 20, sz.query_heads)];
        // SAFETY: rejected before any launch.
        let e = unsafe { forward(&s, &layout, &meta, qkv, out, "sm80", (0, 0), 0) }.unwrap_err();
        assert!(
            matches!(e, MsaError::Tensor { name: "q", .. }),
            "{e}: expected q's length error"
        );
        // An unknown kernel set name.
        // SAFETY: rejected before any launch.
        let e = unsafe { forward(&s, &layout, &meta, qkv, out, "sm70", (0, 0), 0) }.unwrap_err();
        assert_eq!(crate::error_kind(&e), crate::ErrorKind::Argument);
    }
}
