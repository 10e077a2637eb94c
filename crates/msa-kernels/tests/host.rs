//! The launchers' host-side behaviour that needs no GPU (no CUDA call is made on these paths):
//! argument rejection before any launch, empty launches, and the workspace sizes, which are
//! host arithmetic. Runs wherever the `msa` feature links (CI's link step builds it).
#![cfg(feature = "msa")]

use msa_kernels::{launch, sys};

/// `cudaErrorInvalidValue`.
const INVALID_VALUE: i32 = 1;

/// Size fields only (the pointers are never read by the paths tested here).
fn varlen(
    total_q: i32,
    total_k: i32,
    batch: i32,
    padded_kv_blocks: i32,
    max_blocks: i32,
) -> sys::MsaVarlen {
    sys::MsaVarlen {
        batch,
        total_q,
        total_k,
        total_rows: max_blocks * batch,
        padded_kv_blocks,
        max_blocks,
        ..Default::default()
    }
}

fn align(x: usize) -> usize {
    x.div_ceil(256) * 256
}

#[test]
fn null_params_are_rejected_before_any_launch() {
    let null = std::ptr::null_mut();
    // SAFETY: every launcher checks its params pointer before touching anything else.
    let codes = unsafe {
        [
            sys::msa_attn_forward(std::ptr::null(), null),
            sys::msa_attn_backward_main(std::ptr::null(), null),
            sys::msa_attn_backward_dq(std::ptr::null(), null),
            sys::msa_attn_backward_dkv(std::ptr::null(), null),
            sys::msa_indexer_forward(std::ptr::null(), null, 0, null),
            sys::msa_kl_backward(std::ptr::null(), null, 0, null),
        ]
    };
    assert_eq!(codes, [INVALID_VALUE; 6]);
}

#[test]
fn empty_launches_succeed_without_a_device() {
    let empty = varlen(0, 0, 1, 1, 0);
    let fwd = sys::MsaAttnFwdParams {
        varlen: empty,
        ..Default::default()
    };
    let bwd = sys::MsaAttnBwdParams {
        varlen: empty,
        grid_launch: 0,
        ..Default::default()
    };
    let no_keys = sys::MsaAttnBwdParams {
        varlen: varlen(0, 0, 1, 0, 0),
        ..Default::default()
    };
    let null = std::ptr::null_mut();
    // SAFETY: with T = 0 (and no CTAs, no key blocks) the launchers return before any CUDA call
    // and read no pointer.
    unsafe {
        launch::attention::forward(&fwd, null).unwrap();
        launch::attention::backward_main(&bwd, null).unwrap();
        launch::attention::backward_dq(&bwd, null).unwrap();
        launch::attention::backward_dkv(&no_keys, null).unwrap();
    }
}

#[test]
fn workspace_sizes_follow_the_headers() {
    for (t, tk, b, p, mb) in [
        (0, 0, 1, 1, 0),
        (1, 1, 1, 2, 1),
        (1000, 5000, 3, 44, 30),
        (4097, 4097, 1, 34, 33),
    ] {
        let v = varlen(t, tk, b, p, mb);
        let (t, b, p, mb) = (t as usize, b as usize, p as usize, mb as usize);
        // indexer.h: block maxima and sums [4, T, max_blocks] f32, tile table (T + 63 B) / 64 i32.
        let scores = align(4 * t * mb * 4);
        let tiles = align((t + 63 * b) / 64 * 4);
        assert_eq!(
            launch::indexer::workspace_bytes(v).unwrap(),
            2 * scores + tiles,
            "T = {t}"
        );
        // kl.h: cap = P + ceil(64 T / 512); dQI partials [4, T, 16, 128] f32, dKI partials
        // [cap, 128, 128] f32, items [cap, 4] i32, block ranges [P, 2] i32.
        let cap = p + (64 * t).div_ceil(512);
        let kl = align(4 * t * 16 * 128 * 4)
            + align(cap * 128 * 128 * 4)
            + align(cap * 4 * 4)
            + align(p * 2 * 4);
        assert_eq!(launch::kl::workspace_bytes(v).unwrap(), kl, "T = {t}");
    }
    let err = launch::kl::workspace_bytes(varlen(-1, 0, 1, 1, 0)).unwrap_err();
    assert_eq!(
        (err.kernel, err.code),
        ("msa_kl_workspace_bytes", INVALID_VALUE)
    );
    let err = launch::indexer::workspace_bytes(varlen(-1, 0, 1, 1, 0)).unwrap_err();
    assert_eq!(err.code, INVALID_VALUE);
}

#[test]
fn task_build_rejects_sizes_that_differ_from_the_planner() {
    let shape = sys::MsaTaskBuildShape {
        rows: 1,
        edge_capacity: 64,
        work_capacity: 4,
        documents: 1,
        num_tokens: 4,
        workspace_rows: 256,
        num_sms: 132,
    };
    // msa_plan::task_build_sizes: capacity = 4 * 64 / 8 + 4 = 36, bins = 4 * 1 * 2 = 8,
    // scratch = 8 + 4 + 36 + 4 * 8 + 3 * 36 = 188, tables = 36 * 20 = 720. Off by one: rejected.
    let inputs = sys::MsaTaskBuildInputs::default();
    let fake = 16u64; // never dereferenced: the size check comes first
    for (scratch, tables) in [(187, 720), (188, 721), (189, 720)] {
        // SAFETY: mismatched sizes are rejected before any pointer is used or kernel launched.
        let err = unsafe {
            launch::task_build::tables(
                inputs,
                shape,
                fake,
                scratch,
                fake,
                tables,
                std::ptr::null_mut(),
            )
        }
        .unwrap_err();
        assert_eq!(err.code, INVALID_VALUE, "{scratch} {tables}");
    }
}

#[test]
fn layout_launcher_rejects_inconsistent_sizes_before_any_launch() {
    let fake = 16u64; // never dereferenced: the size checks come first
    let out = sys::MsaLayoutOutputs {
        fragment_first: fake as *mut i32,
        query_fragment: fake as *mut i32,
        block_key_start: fake as *mut i32,
        block_key_count: fake as *mut i32,
    };
    let null = std::ptr::null_mut();
    // (batch, total_q, total_k, padded_kv_blocks): batch 0, and P != (Tk + (B + 1) * 128 - 1) / 128.
    for (b, t, tk, p) in [
        (0, 0, 0, 1),
        (1, 10, 300, 5),
        (2, 10, 300, 6),
        (1, -1, 0, 1),
    ] {
        // SAFETY: rejected on the sizes, before any pointer is used or kernel launched.
        let err =
            unsafe { launch::prepare::layout(fake, fake, 0, b, t, tk, p, out, null) }.unwrap_err();
        assert_eq!(
            (err.kernel, err.code),
            ("msa_prepare_layout", INVALID_VALUE),
            "{b} {t} {tk} {p}"
        );
    }
    // Null cu_seqlens with consistent sizes: rejected too.
    // SAFETY: as above.
    let err = unsafe { launch::prepare::layout(0, fake, 0, 1, 10, 300, 4, out, null) }.unwrap_err();
    assert_eq!(err.code, INVALID_VALUE);
}

#[test]
fn empty_zero_and_read_need_no_device() {
    let null = std::ptr::null_mut();
    // SAFETY: zero bytes: both return before any CUDA call.
    unsafe {
        launch::util::zero(0, 0, null).unwrap();
        launch::util::read_i32(0, &mut [], null).unwrap();
    }
    // SAFETY: a null destination of a non-empty zeroing is rejected before any CUDA call.
    let err = unsafe { launch::util::zero(0, 4, null) }.unwrap_err();
    assert_eq!((err.kernel, err.code), ("msa_util_zero", INVALID_VALUE));
}
