//! Host-side behaviour of the raw layer that needs no GPU: the shape rules, the sizes (against
//! the planner), the workspace carve, and the checks that reject a buffer before any launch.
//! Runs wherever `kernels` links (`cargo test -p msa --features kernels`).

use half::bf16;
use msa_plan::schedule::{balanced_target_q_per_cta, flat_schedule_capacity};
use msa_plan::{grid_launch_bound, task_build_buffer_sizes, PlanError, VarlenLayout};

use super::*;
use crate::MsaError;

const SMS: usize = 132;

fn layouts() -> Vec<VarlenLayout> {
    vec![
        VarlenLayout::documents(&[0, 1]).unwrap(),
        VarlenLayout::documents(&[0, 300, 429, 430, 1000]).unwrap(),
        VarlenLayout::new(&[0, 32, 64], &[0, 128, 256], Some(&[0, 0])).unwrap(),
        VarlenLayout::new(&[0, 0, 5], &[0, 100, 105], Some(&[0, 0])).unwrap(),
        VarlenLayout::new(
            &[0, 10, 20, 30, 40, 40],
            &[0, 130, 300, 300, 520, 900],
            Some(&[0, 0, 0, 3, 3]),
        )
        .unwrap(),
        VarlenLayout::documents(&[0, 3000, 3001, 5000]).unwrap(),
    ]
}

#[test]
fn sizes_follow_the_planner() {
    for l in layouts() {
        let shape = CallShape::from_layout(&l, SMS).unwrap();
        let s = shape.sizes();
        let (t, tk, b, r, p) = (
            l.total_q(),
            l.total_k(),
            l.batch(),
            l.total_rows(),
            l.padded_kv_blocks(),
        );
        assert_eq!(shape.padded_kv_blocks(), p);
        assert_eq!(shape.max_blocks(), l.max_blocks());
        assert_eq!(
            (s.cu_seqlens, s.batch, s.query_fragment, s.block_keys),
            (b + 1, b, t, p)
        );
        assert_eq!(s.selection, 4 * t * 16);
        assert_eq!(s.row_ptr, 4 * (r + 1));
        assert_eq!(s.phys_row_ptr, 4 * (p + 1));
        assert_eq!(s.split_counts, t * 4);
        let target = balanced_target_q_per_cta(t, SMS);
        let cap = flat_schedule_capacity(r, t, target);
        assert_eq!((s.target_q_per_cta, s.work_capacity), (target, cap));
        assert_eq!(s.scheduler_metadata, cap * 6);
        assert_eq!(
            (s.queries, s.keys, s.query_heads),
            (t * 8192, tk * 512, t * 64)
        );
        assert_eq!(s.pool, p * 128 * 512);
        assert_eq!(
            (s.index_queries, s.index_keys, s.index_lse),
            (t * 512, tk * 128, 4 * t)
        );
        let tb = task_build_buffer_sizes(t * 16, cap, t, p * 128).unwrap();
        assert_eq!(s.task_build, Some(tb));
        assert_eq!(s.grid_launch, grid_launch_bound(tb.capacity, SMS));
        assert!(s.forward_sm90_bytes > 0 && s.backward_sm90_bytes > 0);
        assert_eq!(s.forward_workspace_bytes(KernelSet::Sm80), 0);
        assert_eq!(
            s.forward_workspace_bytes(KernelSet::Sm90a),
            s.forward_sm90_bytes
        );
    }
}

#[test]
fn backward_workspace_parts_are_aligned_and_disjoint() {
    let l = VarlenLayout::documents(&[0, 300, 429, 430, 1000]).unwrap();
    let s = CallShape::from_layout(&l, SMS).unwrap().sizes().clone();
    let delta = (s.query_heads * 4).div_ceil(256) * 256;
    assert_eq!(
        s.backward_workspace_bytes(BackwardPath::Sm80Deterministic),
        delta
    );
    let sm90 = s.backward_carve(BackwardPath::Sm90);
    assert_eq!(sm90.sm90, delta);
    assert!(sm90.bytes >= delta + s.backward_sm90_bytes);
    // The deterministic path carves |dout| per row (the dQ grid's input) between delta and its scratch.
    let det = s.backward_carve(BackwardPath::Deterministic);
    assert_eq!(det.dout_norm, delta);
    assert_eq!(det.sm90, 2 * delta);
    assert!(s.backward_sm90_det_bytes > s.backward_sm90_bytes);
    assert!(det.bytes >= delta + s.backward_sm90_det_bytes);
    let c = s.backward_carve(BackwardPath::Sm80Atomic);
    let tb = s.task_build.unwrap();
    let parts = [
        (c.delta, s.query_heads * 4),
        (c.dq_accum, s.queries * 4),
        (c.dk_pool, s.pool * 4),
        (c.dv_pool, s.pool * 4),
        (c.task_scratch, tb.scratch_words * 4),
        (c.task_tables, tb.table_words * 4),
    ];
    for w in parts.windows(2) {
        assert!(w[0].0 + w[0].1 <= w[1].0, "{parts:?}");
    }
    for (at, _) in parts {
        assert_eq!(at % 256, 0);
    }
    let (last, len) = parts[5];
    assert!(last + len <= c.bytes);
}

#[test]
fn call_shape_rejects_integers_no_layout_has() {
    let shape = |t, tk, b, r, mk, frag| CallShape::new(t, tk, b, r, mk, frag, SMS);
    assert!(shape(0, 0, 1, 0, 0, false).is_ok(), "an empty call");
    assert!(matches!(
        shape(10, 10, 0, 1, 10, false),
        Err(PlanError::Shape {
            name: "cu_seqlens",
            ..
        })
    ));
    assert!(matches!(
        shape(10, 10, 1, 1, 11, false),
        Err(PlanError::Shape {
            name: "max_seqlen_k",
            ..
        })
    ));
    assert!(matches!(
        shape(10, 10, 1, 1, 0, false),
        Err(PlanError::Shape {
            name: "max_seqlen_k",
            ..
        })
    ));
    assert!(matches!(
        shape(10, 300, 1, 2, 300, false),
        Err(PlanError::Shape {
            name: "total_rows",
            ..
        })
    ));
    assert!(matches!(
        shape(10, 300, 1, 4, 300, false),
        Err(PlanError::Shape {
            name: "total_rows",
            ..
        })
    ));
    assert!(shape(10, 300, 1, 3, 300, false).is_ok());
    assert!(matches!(
        shape(20, 10, 1, 1, 10, false),
        Err(PlanError::Shape {
            name: "total_q",
            ..
        })
    ));
    assert!(
        shape(20, 10, 2, 2, 10, true).is_ok(),
        "fragments may repeat positions"
    );
    assert!(matches!(
        shape(1 << 25, 1 << 25, 1, 1 << 18, 1 << 25, false),
        Err(PlanError::Overflow { .. })
    ));
    assert!(matches!(
        CallShape::new(10, 10, 1, 1, 10, false, 0),
        Err(PlanError::Shape {
            name: "sm_count",
            ..
        })
    ));
    assert!(matches!(
        shape(1, (1 << 31) - 10, 1, 1, 1, false),
        Err(PlanError::Overflow { .. })
    ));
}

#[test]
fn backward_path_follows_msa() {
    use BackwardPath::*;
    assert_eq!(BackwardPath::select(false, KernelSet::Sm90a), Sm90);
    assert_eq!(BackwardPath::select(false, KernelSet::Sm80), Sm80Atomic);
    assert_eq!(BackwardPath::select(true, KernelSet::Sm90a), Deterministic);
    assert_eq!(
        BackwardPath::select(true, KernelSet::Sm80),
        Sm80Deterministic
    );
    assert!(Sm90.is_sm90a() && Deterministic.is_sm90a());
    assert!(!Sm80Atomic.is_sm90a() && !Sm80Deterministic.is_sm90a());
    assert_eq!(KernelSet::for_capability(9, 0), KernelSet::Sm90a);
    assert_eq!(KernelSet::for_capability(8, 0), KernelSet::Sm80);
    assert_eq!(KernelSet::for_capability(10, 0), KernelSet::Sm80);
}

/// Views of fake, 256-byte aligned, distinct addresses: only ever checked, never launched (each
/// test below expects a rejection before any launch).
struct Fake(u64);

impl Fake {
    fn next(&mut self, bytes: usize) -> u64 {
        let at = self.0;
        self.0 += (bytes.max(1) as u64).div_ceil(256) * 256;
        at
    }
    fn ro<T: Elem>(&mut self, len: usize) -> DevSlice<T> {
        let at = self.next(len * std::mem::size_of::<T>());
        // SAFETY: never launched.
        unsafe { DevSlice::new(at, len) }
    }
    fn rw<T: Elem>(&mut self, len: usize) -> DevSliceMut<T> {
        let at = self.next(len * std::mem::size_of::<T>());
        // SAFETY: never launched.
        unsafe { DevSliceMut::new(at, len) }
    }
}

fn fake_call(shape: &CallShape, f: &mut Fake) -> (Layout, Metadata) {
    let s = shape.sizes();
    let layout = Layout {
        cu_seqlens_q: f.ro(s.cu_seqlens),
        cu_seqlens_k: f.ro(s.cu_seqlens),
        fragment_first: f.ro(s.batch),
        query_fragment: f.ro(s.query_fragment),
        block_key_start: f.ro(s.block_keys),
        block_key_count: f.ro(s.block_keys),
    };
    let out = PrepareOutputs {
        error_word: f.rw(4),
        row_ptr: f.rw(s.row_ptr),
        q_indices: f.rw(s.selection),
        qsplit: f.rw(s.selection),
        split_counts: f.rw(s.split_counts),
        scheduler_metadata: f.rw(s.scheduler_metadata),
        work_count: f.rw(1),
        phys_row_ptr: f.rw(s.phys_row_ptr),
        phys_q_indices: f.rw(s.selection),
        phys_valid: f.rw(s.selection),
        document_workspace_starts: f.rw(s.batch),
        query_offsets: f.rw(s.batch),
    };
    let topk = f.ro(s.selection);
    (layout, out.metadata(topk))
}

fn tensor_error(r: crate::Result<()>) -> (&'static str, String, String) {
    match r {
        Err(MsaError::Tensor {
            name,
            expected,
            got,
        }) => (name, expected, got),
        other => panic!("expected a tensor error, got {other:?}"),
    }
}

#[test]
fn every_entry_point_checks_lengths_before_any_launch() {
    let l = VarlenLayout::new(&[0, 32, 64], &[0, 128, 256], Some(&[0, 0])).unwrap();
    let shape = CallShape::from_layout(&l, SMS).unwrap();
    let s = shape.sizes().clone();
    let mut f = Fake(1 << 32);
    let (layout, meta) = fake_call(&shape, &mut f);
    let stream = Stream::LEGACY;

    // Forward: a short q, then a misaligned lse, then a small workspace.
    let inputs = AttentionInputs {
        q: f.ro::<bf16>(s.queries - 1),
        k: f.ro(s.keys),
        v: f.ro(s.keys),
    };
    let mut out = ForwardOutputs {
        out: f.rw(s.queries),
        lse: f.rw(s.query_heads),
    };
    let ws = f.rw::<u8>(s.forward_sm90_bytes);
    // SAFETY: rejected before any launch.
    let r = unsafe {
        forward(
            &shape,
            &layout,
            meta.topk,
            &inputs,
            &mut out,
            KernelSet::Sm90a,
            ws,
            stream,
        )
    };
    let (name, expected, got) = tensor_error(r);
    assert_eq!(name, "q");
    assert_eq!(
        expected,
        format!("{} bf16 elements ([T, 64, 128])", s.queries)
    );
    assert_eq!(got, format!("{} elements", s.queries - 1));
    let inputs = AttentionInputs {
        q: f.ro(s.queries),
        ..inputs
    };
    // SAFETY: a misaligned view, rejected before any launch.
    let misaligned = unsafe { DevSliceMut::new(f.next(s.query_heads * 4) + 8, s.query_heads) };
    let mut out = ForwardOutputs {
        out: f.rw(s.queries),
        lse: misaligned,
    };
    let ws = f.rw::<u8>(s.forward_sm90_bytes);
    // SAFETY: rejected before any launch.
    let r = unsafe {
        forward(
            &shape,
            &layout,
            meta.topk,
            &inputs,
            &mut out,
            KernelSet::Sm90a,
            ws,
            stream,
        )
    };
    let (name, expected, _) = tensor_error(r);
    assert_eq!(
        (name, expected.as_str()),
        ("lse", "a 16-byte aligned device address")
    );
    let mut out = ForwardOutputs {
        out: f.rw(s.queries),
        lse: f.rw(s.query_heads),
    };
    let ws = f.rw::<u8>(s.forward_sm90_bytes - 1);
    // SAFETY: rejected before any launch.
    let r = unsafe {
        forward(
            &shape,
            &layout,
            meta.topk,
            &inputs,
            &mut out,
            KernelSet::Sm90a,
            ws,
            stream,
        )
    };
    assert_eq!(tensor_error(r).0, "forward workspace");

    // Backward: a wrong dk, then a workspace sized for another path.
    let binputs = BackwardInputs {
        q: inputs.q,
        k: inputs.k,
        v: inputs.v,
        dout: f.ro(s.queries),
        out: f.ro(s.queries),
        lse: f.ro(s.query_heads),
    };
    let mut grads = Gradients {
        dq: f.rw(s.queries),
        dk: f.rw(s.keys + 8),
        dv: f.rw(s.keys),
    };
    let path = BackwardPath::Sm80Atomic;
    let ws = f.rw::<u8>(s.backward_workspace_bytes(path));
    // SAFETY: rejected before any launch.
    let r = unsafe {
        backward(
            &shape, &layout, &meta, &binputs, &mut grads, path, ws, stream,
        )
    };
    assert_eq!(tensor_error(r).0, "dk");
    let mut grads = Gradients {
        dq: f.rw(s.queries),
        dk: f.rw(s.keys),
        dv: f.rw(s.keys),
    };
    let ws = f.rw::<u8>(s.backward_workspace_bytes(BackwardPath::Sm80Deterministic));
    // SAFETY: rejected before any launch.
    let r = unsafe {
        backward(
            &shape, &layout, &meta, &binputs, &mut grads, path, ws, stream,
        )
    };
    assert_eq!(tensor_error(r).0, "backward workspace");

    // Metadata of another shape.
    let other = CallShape::from_layout(&VarlenLayout::documents(&[0, 64]).unwrap(), SMS).unwrap();
    let ws = f.rw::<u8>(s.forward_sm90_bytes);
    // SAFETY: rejected before any launch.
    let r = unsafe {
        forward(
            &other,
            &layout,
            meta.topk,
            &inputs,
            &mut out,
            KernelSet::Sm80,
            ws,
            stream,
        )
    };
    assert_eq!(tensor_error(r).0, "cu_seqlens_q");

    // Validation: a short split_counts, then a small workspace.
    let mut vout = ValidateOutputs {
        error_word: f.rw(s.error_word),
        split_counts: f.rw(s.split_counts - 1),
    };
    let ws = f.rw::<u8>(VALIDATE_WORKSPACE_BYTES);
    // SAFETY: rejected before any launch.
    let r = unsafe { prepare_validate(&shape, &layout, meta.topk, &mut vout, ws, stream) };
    assert_eq!(tensor_error(r).0, "split_counts");
    let mut vout = ValidateOutputs {
        error_word: f.rw(s.error_word),
        split_counts: f.rw(s.split_counts),
    };
    let ws = f.rw::<u8>(VALIDATE_WORKSPACE_BYTES - 1);
    // SAFETY: rejected before any launch.
    let r = unsafe { prepare_validate(&shape, &layout, meta.topk, &mut vout, ws, stream) };
    assert_eq!(tensor_error(r).0, "validation workspace");

    // Indexer, selection LSE, KL.
    let mut topk = f.rw::<i32>(s.selection);
    let mut lse = f.rw::<f32>(s.index_lse + 1);
    let ws = f.rw::<u8>(s.indexer_workspace_bytes);
    let (qi, ki) = (f.ro::<bf16>(s.index_queries), f.ro::<bf16>(s.index_keys));
    // SAFETY: rejected before any launch.
    let r = unsafe { indexer_forward(&shape, &layout, qi, ki, &mut topk, &mut lse, ws, stream) };
    assert_eq!(tensor_error(r).0, "indexer lse");
    // SAFETY: rejected before any launch.
    let r = unsafe {
        selection_lse(
            &shape,
            &layout,
            meta.topk,
            f.ro(s.index_queries - 1),
            ki,
            &mut lse,
            stream,
        )
    };
    assert_eq!(tensor_error(r).0, "qi");
    let kl = KlInputs {
        q: inputs.q,
        k: inputs.k,
        teacher_lse: f.ro(s.query_heads),
        qi,
        ki,
        indexer_lse: f.ro(s.index_lse),
    };
    let (mut dqi, mut dki) = (f.rw::<bf16>(s.index_queries), f.rw::<bf16>(s.index_keys));
    let ws = f.rw::<u8>(s.kl_workspace_bytes / 2);
    // SAFETY: rejected before any launch.
    let r = unsafe {
        kl_backward(
            &shape, &layout, &meta, &kl, 1.0, &mut dqi, &mut dki, ws, stream,
        )
    };
    assert_eq!(tensor_error(r).0, "KL workspace");
}

#[test]
fn build_layout_checks_fragments_and_lengths_before_the_launch() {
    let l = VarlenLayout::new(&[0, 32, 64], &[0, 128, 256], Some(&[0, 0])).unwrap();
    let shape = CallShape::from_layout(&l, SMS).unwrap();
    let s = shape.sizes().clone();
    let mut f = Fake(1 << 32);
    let mut out = LayoutOutputs {
        fragment_first: f.rw(s.batch),
        query_fragment: f.rw(s.query_fragment),
        block_key_start: f.rw(s.block_keys),
        block_key_count: f.rw(s.block_keys),
    };
    let (cu_q, cu_k) = (f.ro(s.cu_seqlens), f.ro(s.cu_seqlens));
    // SAFETY: rejected before any launch.
    let r = unsafe { build_layout(&shape, cu_q, cu_k, None, &mut out, Stream::LEGACY) };
    assert_eq!(tensor_error(r).0, "fragment_indices");
    let frag = f.ro(s.batch + 1);
    // SAFETY: rejected before any launch.
    let r = unsafe { build_layout(&shape, cu_q, cu_k, Some(frag), &mut out, Stream::LEGACY) };
    assert_eq!(tensor_error(r).0, "fragment_indices");
    // cu_seqlens need only element alignment.
    // SAFETY: rejected (query_fragment) before any launch.
    let cu_q4 = unsafe { DevSlice::<i32>::new(f.next(64) + 4, s.cu_seqlens) };
    let mut short = LayoutOutputs {
        query_fragment: f.rw(s.query_fragment - 1),
        ..out
    };
    let frag = f.ro(s.batch);
    // SAFETY: rejected before any launch.
    let r = unsafe { build_layout(&shape, cu_q4, cu_k, Some(frag), &mut short, Stream::LEGACY) };
    assert_eq!(tensor_error(r).0, "query_fragment");
}

#[test]
fn the_error_word_maps_to_a_typed_fault() {
    use crate::error::{TopkFault, TopkFaultCode};
    let t = 70;
    assert!(prepare::fault_of(t, [0; 4]).is_ok());
    match prepare::fault_of(t, [3, 2, 69, 15]) {
        Err(MsaError::TopK(f)) => {
            assert_eq!(
                f,
                TopkFault {
                    code: TopkFaultCode::NonCausal,
                    head: 2,
                    query: 69,
                    slot: 15
                }
            );
            assert_eq!(f.word(), [3, 2, 69, 15]);
            assert_eq!(
                f.to_string(),
                "topk_indices[2, 69, 15] is invalid: non-causal: a block after the query's own \
                 block (code 3)"
            );
        }
        other => panic!("{other:?}"),
    }
    for word in [
        [5, 0, 0, 0],
        [1, 4, 0, 0],
        [1, 0, 70, 0],
        [1, 0, 0, 16],
        [-1, 0, 0, 0],
    ] {
        assert!(
            matches!(
                prepare::fault_of(t, word),
                Err(MsaError::DeviceValidation { .. })
            ),
            "{word:?}"
        );
    }
}
