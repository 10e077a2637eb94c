/* The constants Rust and CUDA share, defined once. Kernels read them through
 * kernels/src/common/constants.cuh (and directly where a word position is meant); bindgen
 * exports them into msa_kernels::sys, and msa::cuda's abi_check asserts at compile time that
 * every msa-plan mirror equals its constant here (msa-plan's abi_header test compares the two
 * without CUDA), so a drift fails the build. Plain C: named enums of int constants, plus the
 * one floating-point constant as a macro. */
#ifndef MSA_ABI_H
#define MSA_ABI_H

/* The fixed MSA v1 shapes (msa_plan::topology). */
enum MsaDim {
    MSA_NUM_Q_HEADS = 64,     /* query heads */
    MSA_NUM_KV_HEADS = 4,     /* KV heads (GQA groups); query head h reads group h / 16 */
    MSA_HEADS_PER_GROUP = 16, /* query heads per group, = one mma tile's 16 rows */
    MSA_NUM_INDEX_HEADS = 4,  /* lightning-indexer query heads, one per group */
    MSA_HEAD_DIM = 128,       /* q, k, v head dimension */
    MSA_INDEX_DIM = 128,      /* qi, ki head dimension */
    MSA_BLOCK_SIZE = 128,     /* keys per document-local block; the workspace unit */
    MSA_TOPK_BLOCKS = 16,     /* selection slots per (group, query), own block included */
    MSA_QUERY_CHUNK = 8       /* queries per backward task row (8 queries x 16 heads = 128 rows) */
};

/* softmax_scale = 128^-0.5 of the attention and the indexer, in double precision
 * (msa_plan::topology::SOFTMAX_SCALE_F64). */
#define MSA_SOFTMAX_SCALE 0.088388347648318440550

/* Top-k validation (msa_plan::topk): the code of prepare's error word (code, head, query,
 * slot), and the padding value every slot may hold. */
enum MsaTopkCode {
    MSA_TOPK_PADDING = -1,     /* the padding entry: valid anywhere, any number of times */
    MSA_TOPK_OK = 0,           /* every entry is valid */
    MSA_TOPK_NEGATIVE = 1,     /* a negative entry other than -1 */
    MSA_TOPK_OUT_OF_RANGE = 2, /* an id >= num_blocks of the query's fragment */
    MSA_TOPK_NON_CAUSAL = 3,   /* an existing block after the query's own block */
    MSA_TOPK_DUPLICATE = 4     /* an id repeated from an earlier slot of the row */
};

/* Packed edge words of prepare's CSRs (msa_plan::csr). */
enum MsaCsrShift {
    MSA_QSPLIT_RANK_SHIFT = 24,  /* qsplit = q_local | writer_rank << 24 */
    MSA_PHYSICAL_RANK_SHIFT = 8  /* phys_valid = visible_keys | writer_rank << 8 */
};

/* One scheduler_metadata row (msa_plan::schedule::WorkItem::to_words). */
enum MsaWorkWord {
    MSA_WORK_HEAD = 0,     /* index head (= KV group) */
    MSA_WORK_ROW = 1,      /* level-major k2q row */
    MSA_WORK_Q_BEGIN = 2,  /* first edge of the chunk, relative to the row start */
    MSA_WORK_Q_COUNT = 3,  /* queries of the chunk */
    MSA_WORK_FRAGMENT = 4, /* fragment of the row */
    MSA_WORK_KBLOCK = 5,   /* document-local key block (the row's level) */
    MSA_WORK_WORDS = 6     /* words per row */
};

/* Backward task build buffers (msa_plan::backward::abi): fill, grouping and limits. */
enum MsaTaskBuild {
    MSA_TABLE_FILL = -1,         /* every scratch/table word no kernel writes (memset 0xFF) */
    MSA_LOCALITY_WINDOW = 512,   /* tasks are grouped by the 512-query window of query 0 */
    MSA_MAX_BINS = 1 << 22,      /* most locality bins one build supports */
    MSA_TASK_QUERIES = 8         /* query slots per task row (task_qrows, task_qpos width) */
};

/* Words of the CTA-walk descriptor desc[8] at the start of the task-build scratch. */
enum MsaDescWord {
    MSA_DESC_NUM_TASK_ROWS = 0, /* rows the walk covers: min(tasks, capacity), 0 on overflow */
    MSA_DESC_ROWS_PER_CTA = 1,  /* rows per full CTA */
    MSA_DESC_NUM_FULL_CTAS = 2, /* CTAs that take rows_per_cta rows */
    MSA_DESC_TAIL_ROWS = 3,     /* rows of each CTA after the full ones */
    MSA_DESC_GRID_CTAS = 4,     /* CTAs that walk; later ones of the launch exit at once */
    MSA_DESC_NUM_WORK = 5,      /* work items read: clamp(work_count, 0, work_capacity) */
    MSA_DESC_NUM_TASKS = 6,     /* exact task count (may exceed the capacity) */
    MSA_DESC_FLAGS = 7,         /* MsaTaskFlag bits */
    MSA_DESC_WORDS = 8          /* descriptor words */
};

/* Bits of desc[MSA_DESC_FLAGS]. */
enum MsaTaskFlag {
    MSA_FLAG_CAPACITY_OVERFLOW = 1,     /* more tasks than capacity: the walk is disabled */
    MSA_FLAG_NONCONTIGUOUS_SEGMENTS = 2 /* a segment is not one run: tables keep source order */
};

/* Rows of the [4, bins] bin array of the scratch. */
enum MsaBinRow {
    MSA_BIN_COUNTS = 0,      /* tasks per segment */
    MSA_BIN_FIRST_TASKS = 1, /* smallest task of a segment, INT32_MAX when empty */
    MSA_BIN_LAST_TASKS = 2,  /* largest task of a segment, -1 when empty */
    MSA_BIN_OFFSETS = 3,     /* exclusive prefix of the counts */
    MSA_BIN_ROWS = 4         /* rows of the bin array */
};

/* One task_decode row of the scratch. */
enum MsaDecodeWord {
    MSA_DEC_VALID = 0, /* valid queries of the task (1..=8) */
    MSA_DEC_EDGE = 1,  /* edge of the task's slot 0 in its head's q_indices */
    MSA_DEC_DOC = 2,   /* document (fragment) of the task */
    MSA_DEC_WORDS = 3  /* words per row */
};

/* One task_meta row: (0, head, workspace kblock, valid slots). */
enum MsaMetaWord {
    MSA_META_BATCH = 0,  /* always 0 (NeMo's batch column) */
    MSA_META_HEAD = 1,   /* KV group */
    MSA_META_KBLOCK = 2, /* workspace (physical) key block */
    MSA_META_VALID = 3,  /* valid query slots of the row */
    MSA_META_WORDS = 4   /* words per row */
};

/* The CTA walk of the backward main kernel (msa_plan::backward::walk). */
enum MsaWalk {
    MSA_ROWS_PER_CTA_SMALL = 4,     /* rows per CTA up to MSA_ROWS_PER_CTA_SWITCH task rows */
    MSA_ROWS_PER_CTA_SWITCH = 2400, /* task rows up to which the small walk is used */
    MSA_ROWS_PER_CTA_LARGE = 64,    /* rows per CTA beyond it */
    MSA_MIN_TAIL_ROWS = 3           /* shorter tails fall back to plain rows_per_cta chunks */
};

/* The work lists of the persistent sm_90a kernels (msa_plan::backward::kv_items,
 * msa_plan::tiles, msa_plan::lpt). */
enum MsaSm90Work {
    MSA_KV_ITEM_QUERIES = 512,   /* most CSR entries (selecting queries) per backward item */
    MSA_KV_TILE_QUERIES = 4,     /* CSR entries per backward tile: an item costs its tiles */
    MSA_FWD_TILE_QUERIES = 8,    /* consecutive packed queries per forward tile */
    MSA_LPT_BINS = 129,          /* costs the run order tells apart (0..128; more share 128) */
    MSA_ITEM_QUERY_BANDS = 32    /* bands of a head's queries: the backward claim order's key
                                    (4 heads x 32 < MSA_LPT_BINS) */
};

#endif /* MSA_ABI_H */
