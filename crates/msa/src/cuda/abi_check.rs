//! Compile-time ties between the one ABI source, `kernels/include/msa/abi.h` (exported by
//! bindgen into `msa_kernels::sys`), and the host mirrors in `msa-plan` that build and check the
//! same tables: any drift fails the build of the CUDA backend. (`msa-plan`'s `abi_header` test
//! compares the header with the same mirrors on hosts without CUDA.)

use msa_kernels::sys;
use msa_plan::backward::{abi, kv_items, walk};
use msa_plan::{csr, lpt, schedule, tiles, topk, topology};

/// `sys::$c` (an `abi.h` constant) equals the Rust mirror `$rust`.
macro_rules! same {
    ($c:ident, $rust:expr) => {
        const _: () = assert!(
            sys::$c as i64 == $rust as i64,
            concat!(
                "kernels/include/msa/abi.h: ",
                stringify!($c),
                " differs from its msa-plan mirror ",
                stringify!($rust)
            )
        );
    };
}

// Shapes.
same!(MSA_NUM_Q_HEADS, topology::NUM_Q_HEADS);
same!(MSA_NUM_KV_HEADS, topology::NUM_KV_HEADS);
same!(MSA_HEADS_PER_GROUP, topology::HEADS_PER_GROUP);
same!(MSA_NUM_INDEX_HEADS, topology::NUM_INDEX_HEADS);
same!(MSA_HEAD_DIM, topology::HEAD_DIM);
same!(MSA_INDEX_DIM, topology::INDEX_DIM);
same!(MSA_BLOCK_SIZE, topology::BLOCK_SIZE);
same!(MSA_TOPK_BLOCKS, topology::TOPK_BLOCKS);
same!(MSA_QUERY_CHUNK, topology::QUERY_CHUNK);
const _: () = assert!(
    sys::MSA_SOFTMAX_SCALE == topology::SOFTMAX_SCALE_F64,
    "kernels/include/msa/abi.h: MSA_SOFTMAX_SCALE differs from topology::SOFTMAX_SCALE_F64"
);

// Top-k validation codes of prepare's error word.
same!(MSA_TOPK_PADDING, topk::TOPK_PADDING);
same!(MSA_TOPK_OK, topk::TOPK_OK);
same!(MSA_TOPK_NEGATIVE, topk::TOPK_NEGATIVE);
same!(MSA_TOPK_OUT_OF_RANGE, topk::TOPK_OUT_OF_RANGE);
same!(MSA_TOPK_NON_CAUSAL, topk::TOPK_NON_CAUSAL);
same!(MSA_TOPK_DUPLICATE, topk::TOPK_DUPLICATE);

// Packed CSR words.
same!(MSA_QSPLIT_RANK_SHIFT, csr::QSPLIT_RANK_SHIFT);
same!(MSA_PHYSICAL_RANK_SHIFT, csr::PHYSICAL_RANK_SHIFT);

// Work items (scheduler_metadata rows).
same!(MSA_WORK_HEAD, schedule::WORK_HEAD);
same!(MSA_WORK_ROW, schedule::WORK_ROW);
same!(MSA_WORK_Q_BEGIN, schedule::WORK_Q_BEGIN);
same!(MSA_WORK_Q_COUNT, schedule::WORK_Q_COUNT);
same!(MSA_WORK_FRAGMENT, schedule::WORK_FRAGMENT);
same!(MSA_WORK_KBLOCK, schedule::WORK_KBLOCK);
same!(MSA_WORK_WORDS, schedule::WORK_WORDS);

// Backward task build: buffers, descriptor, flags, bins, decode and meta rows, the walk.
same!(MSA_TABLE_FILL, abi::TABLE_FILL);
same!(MSA_LOCALITY_WINDOW, abi::LOCALITY_WINDOW);
same!(MSA_MAX_BINS, abi::MAX_BINS);
same!(MSA_TASK_QUERIES, abi::TASK_QUERIES);
same!(MSA_DESC_NUM_TASK_ROWS, abi::DESC_NUM_TASK_ROWS);
same!(MSA_DESC_ROWS_PER_CTA, abi::DESC_ROWS_PER_CTA);
same!(MSA_DESC_NUM_FULL_CTAS, abi::DESC_NUM_FULL_CTAS);
same!(MSA_DESC_TAIL_ROWS, abi::DESC_TAIL_ROWS);
same!(MSA_DESC_GRID_CTAS, abi::DESC_GRID_CTAS);
same!(MSA_DESC_NUM_WORK, abi::DESC_NUM_WORK);
same!(MSA_DESC_NUM_TASKS, abi::DESC_NUM_TASKS);
same!(MSA_DESC_FLAGS, abi::DESC_FLAGS);
same!(MSA_DESC_WORDS, abi::DESC_WORDS);
same!(MSA_FLAG_CAPACITY_OVERFLOW, abi::FLAG_CAPACITY_OVERFLOW);
same!(
    MSA_FLAG_NONCONTIGUOUS_SEGMENTS,
    abi::FLAG_NONCONTIGUOUS_SEGMENTS
);
same!(MSA_BIN_COUNTS, abi::BIN_COUNTS);
same!(MSA_BIN_FIRST_TASKS, abi::BIN_FIRST_TASKS);
same!(MSA_BIN_LAST_TASKS, abi::BIN_LAST_TASKS);
same!(MSA_BIN_OFFSETS, abi::BIN_OFFSETS);
same!(MSA_BIN_ROWS, abi::BIN_ROWS);
same!(MSA_DEC_VALID, abi::DEC_VALID);
same!(MSA_DEC_EDGE, abi::DEC_EDGE);
same!(MSA_DEC_DOC, abi::DEC_DOC);
same!(MSA_DEC_WORDS, abi::DEC_WORDS);
same!(MSA_META_BATCH, abi::META_BATCH);
same!(MSA_META_HEAD, abi::META_HEAD);
same!(MSA_META_KBLOCK, abi::META_KBLOCK);
same!(MSA_META_VALID, abi::META_VALID);
same!(MSA_META_WORDS, abi::META_WORDS);
same!(MSA_ROWS_PER_CTA_SMALL, walk::ROWS_PER_CTA_SMALL);
same!(MSA_ROWS_PER_CTA_SWITCH, walk::ROWS_PER_CTA_SWITCH);
same!(MSA_ROWS_PER_CTA_LARGE, walk::ROWS_PER_CTA_LARGE);
same!(MSA_MIN_TAIL_ROWS, walk::MIN_TAIL_ROWS);

// The persistent sm_90a kernels' work lists.
same!(MSA_KV_ITEM_QUERIES, kv_items::KV_ITEM_QUERIES);
same!(MSA_KV_TILE_QUERIES, kv_items::TILE_QUERIES);
same!(MSA_FWD_TILE_QUERIES, tiles::TILE_QUERIES);
same!(MSA_LPT_BINS, lpt::LPT_BINS);
same!(MSA_ITEM_QUERY_BANDS, kv_items::ITEM_QUERY_BANDS);
