//! The ABI constants of `kernels/include/msa/abi.h` (the one source the kernels and bindgen read)
//! against their msa-plan mirrors, on any host: this reads the header as text, so it needs
//! neither CUDA nor libclang. With feature `msa`, `msa::cuda::abi_check` asserts the same pairs
//! at compile time through the bindgen constants.

use std::collections::BTreeMap;

use msa_plan::backward::{abi, kv_items, walk};
use msa_plan::{csr, lpt, schedule, tiles, topk, topology};

/// Every integer constant of abi.h with its mirror.
fn mirrors() -> Vec<(&'static str, i64)> {
    vec![
        ("MSA_NUM_Q_HEADS", topology::NUM_Q_HEADS as i64),
        ("MSA_NUM_KV_HEADS", topology::NUM_KV_HEADS as i64),
        ("MSA_HEADS_PER_GROUP", topology::HEADS_PER_GROUP as i64),
        ("MSA_NUM_INDEX_HEADS", topology::NUM_INDEX_HEADS as i64),
        ("MSA_HEAD_DIM", topology::HEAD_DIM as i64),
        ("MSA_INDEX_DIM", topology::INDEX_DIM as i64),
        ("MSA_BLOCK_SIZE", topology::BLOCK_SIZE as i64),
        ("MSA_TOPK_BLOCKS", topology::TOPK_BLOCKS as i64),
        ("MSA_QUERY_CHUNK", topology::QUERY_CHUNK as i64),
        ("MSA_TOPK_PADDING", topk::TOPK_PADDING as i64),
        ("MSA_TOPK_OK", topk::TOPK_OK as i64),
        ("MSA_TOPK_NEGATIVE", topk::TOPK_NEGATIVE as i64),
        ("MSA_TOPK_OUT_OF_RANGE", topk::TOPK_OUT_OF_RANGE as i64),
        ("MSA_TOPK_NON_CAUSAL", topk::TOPK_NON_CAUSAL as i64),
        ("MSA_TOPK_DUPLICATE", topk::TOPK_DUPLICATE as i64),
        ("MSA_QSPLIT_RANK_SHIFT", csr::QSPLIT_RANK_SHIFT as i64),
        ("MSA_PHYSICAL_RANK_SHIFT", csr::PHYSICAL_RANK_SHIFT as i64),
        ("MSA_WORK_HEAD", schedule::WORK_HEAD as i64),
        ("MSA_WORK_ROW", schedule::WORK_ROW as i64),
        ("MSA_WORK_Q_BEGIN", schedule::WORK_Q_BEGIN as i64),
        ("MSA_WORK_Q_COUNT", schedule::WORK_Q_COUNT as i64),
        ("MSA_WORK_FRAGMENT", schedule::WORK_FRAGMENT as i64),
        ("MSA_WORK_KBLOCK", schedule::WORK_KBLOCK as i64),
        ("MSA_WORK_WORDS", schedule::WORK_WORDS as i64),
        ("MSA_TABLE_FILL", abi::TABLE_FILL as i64),
        ("MSA_LOCALITY_WINDOW", abi::LOCALITY_WINDOW as i64),
        ("MSA_MAX_BINS", abi::MAX_BINS as i64),
        ("MSA_TASK_QUERIES", abi::TASK_QUERIES as i64),
        ("MSA_DESC_NUM_TASK_ROWS", abi::DESC_NUM_TASK_ROWS as i64),
        ("MSA_DESC_ROWS_PER_CTA", abi::DESC_ROWS_PER_CTA as i64),
        ("MSA_DESC_NUM_FULL_CTAS", abi::DESC_NUM_FULL_CTAS as i64),
        ("MSA_DESC_TAIL_ROWS", abi::DESC_TAIL_ROWS as i64),
        ("MSA_DESC_GRID_CTAS", abi::DESC_GRID_CTAS as i64),
        ("MSA_DESC_NUM_WORK", abi::DESC_NUM_WORK as i64),
        ("MSA_DESC_NUM_TASKS", abi::DESC_NUM_TASKS as i64),
        ("MSA_DESC_FLAGS", abi::DESC_FLAGS as i64),
        ("MSA_DESC_WORDS", abi::DESC_WORDS as i64),
        (
            "MSA_FLAG_CAPACITY_OVERFLOW",
            abi::FLAG_CAPACITY_OVERFLOW as i64,
        ),
        (
            "MSA_FLAG_NONCONTIGUOUS_SEGMENTS",
            abi::FLAG_NONCONTIGUOUS_SEGMENTS as i64,
        ),
        ("MSA_BIN_COUNTS", abi::BIN_COUNTS as i64),
        ("MSA_BIN_FIRST_TASKS", abi::BIN_FIRST_TASKS as i64),
        ("MSA_BIN_LAST_TASKS", abi::BIN_LAST_TASKS as i64),
        ("MSA_BIN_OFFSETS", abi::BIN_OFFSETS as i64),
        ("MSA_BIN_ROWS", abi::BIN_ROWS as i64),
        ("MSA_DEC_VALID", abi::DEC_VALID as i64),
        ("MSA_DEC_EDGE", abi::DEC_EDGE as i64),
        ("MSA_DEC_DOC", abi::DEC_DOC as i64),
        ("MSA_DEC_WORDS", abi::DEC_WORDS as i64),
        ("MSA_META_BATCH", abi::META_BATCH as i64),
        ("MSA_META_HEAD", abi::META_HEAD as i64),
        ("MSA_META_KBLOCK", abi::META_KBLOCK as i64),
        ("MSA_META_VALID", abi::META_VALID as i64),
        ("MSA_META_WORDS", abi::META_WORDS as i64),
        ("MSA_ROWS_PER_CTA_SMALL", walk::ROWS_PER_CTA_SMALL as i64),
        ("MSA_ROWS_PER_CTA_SWITCH", walk::ROWS_PER_CTA_SWITCH as i64),
        ("MSA_ROWS_PER_CTA_LARGE", walk::ROWS_PER_CTA_LARGE as i64),
        ("MSA_MIN_TAIL_ROWS", walk::MIN_TAIL_ROWS as i64),
        ("MSA_KV_ITEM_QUERIES", kv_items::KV_ITEM_QUERIES as i64),
        ("MSA_KV_TILE_QUERIES", kv_items::TILE_QUERIES as i64),
        ("MSA_FWD_TILE_QUERIES", tiles::TILE_QUERIES as i64),
        ("MSA_LPT_BINS", lpt::LPT_BINS as i64),
        ("MSA_ITEM_QUERY_BANDS", kv_items::ITEM_QUERY_BANDS as i64),
    ]
}

/// The header with its `/* ... */` comments removed.
fn header() -> String {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../kernels/include/msa/abi.h"
    );
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut out = String::new();
    let mut rest = text.as_str();
    while let Some(start) = rest.find("/*") {
        out.push_str(&rest[..start]);
        let end = rest[start..].find("*/").expect("unterminated comment") + start + 2;
        out.push(' ');
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// `N`, `-N` or `A << B`: the only enumerator values abi.h uses (anything else fails here).
fn eval(expr: &str) -> i64 {
    let expr = expr.trim();
    if let Some((a, b)) = expr.split_once("<<") {
        return eval(a) << eval(b);
    }
    expr.parse()
        .unwrap_or_else(|_| panic!("abi.h: cannot evaluate `{expr}`"))
}

/// `NAME = value` of every enumerator and `#define MSA_X value` with a value.
fn parse(text: &str) -> (BTreeMap<String, i64>, BTreeMap<String, String>) {
    let mut ints = BTreeMap::new();
    let mut defines = BTreeMap::new();
    for line in text.lines() {
        let line = line.trim();
        if let Some(def) = line.strip_prefix("#define") {
            let mut parts = def.split_whitespace();
            if let (Some(name), Some(value)) = (parts.next(), parts.next()) {
                defines.insert(name.to_string(), value.to_string());
            }
        }
    }
    let mut rest = text;
    while let Some(open) = rest.find('{') {
        let close = rest[open..].find('}').expect("unterminated enum") + open;
        for item in rest[open + 1..close].split(',') {
            if item.trim().is_empty() {
                continue;
            }
            let (name, value) = item
                .split_once('=')
                .unwrap_or_else(|| panic!("abi.h: enumerator without a value: `{}`", item.trim()));
            let name = name.trim().to_string();
            assert!(
                name.starts_with("MSA_"),
                "abi.h: `{name}` lacks the MSA_ prefix"
            );
            assert!(
                ints.insert(name.clone(), eval(value)).is_none(),
                "abi.h: `{name}` twice"
            );
        }
        rest = &rest[close + 1..];
    }
    (ints, defines)
}

#[test]
fn every_abi_constant_equals_its_msa_plan_mirror() {
    let (ints, defines) = parse(&header());
    let mirrors = mirrors();
    let mut errors = Vec::new();
    for (name, value) in &mirrors {
        match ints.get(*name) {
            Some(c) if c == value => {}
            Some(c) => errors.push(format!("{name} = {c} in abi.h, {value} in msa-plan")),
            None => errors.push(format!("{name} is missing from abi.h")),
        }
    }
    for name in ints.keys() {
        if !mirrors.iter().any(|(m, _)| m == name) {
            errors.push(format!(
                "{name} of abi.h has no msa-plan mirror in this test"
            ));
        }
    }
    let scale: f64 = defines
        .get("MSA_SOFTMAX_SCALE")
        .expect("MSA_SOFTMAX_SCALE is defined")
        .parse()
        .expect("MSA_SOFTMAX_SCALE is a number");
    if scale != topology::SOFTMAX_SCALE_F64 {
        errors.push(format!(
            "MSA_SOFTMAX_SCALE = {scale} in abi.h, {} in msa-plan",
            topology::SOFTMAX_SCALE_F64
        ));
    }
    assert!(errors.is_empty(), "{}", errors.join("\n"));
}
