//! Validation of `topk_indices` (int32 `[4, T, 16]`, head-major) against a [`VarlenLayout`].
//!
//! MSA's kernels trust their selection: an out-of-range id would index past a fragment's keys, a
//! future block is only partly masked and a duplicate is double-counted (docs/contract.md §2.3). So
//! every entry is checked before any work. The rule is per slot and the first offending slot
//! (smallest linear index `(head·T + q)·16 + slot`) is reported; the device validation kernel of
//! `prepare` applies the same rule and writes the same `(code, head, query, slot)` word, so GPU
//! tests compare the two exactly. The codes below are that ABI (`MSA_TOPK_*` of
//! `kernels/include/msa/abi.h`).

use crate::error::{PlanError, Result};
use crate::layout::VarlenLayout;
use crate::topology::{BLOCK_SIZE, NUM_INDEX_HEADS, TOPK_BLOCKS};

/// Error code: every entry is valid.
pub const TOPK_OK: i32 = 0;
/// Error code: a negative entry other than the `-1` padding.
pub const TOPK_NEGATIVE: i32 = 1;
/// Error code: an id `>= num_blocks` of the query's fragment.
pub const TOPK_OUT_OF_RANGE: i32 = 2;
/// Error code: an existing block after the query's own block (`own < e < num_blocks`).
pub const TOPK_NON_CAUSAL: i32 = 3;
/// Error code: a repeated id; the later slot of the pair is the offender.
pub const TOPK_DUPLICATE: i32 = 4;
/// The padding value, allowed in any slot and any number of times.
pub const TOPK_PADDING: i32 = -1;

/// The first invalid entry of a selection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopKFault {
    /// One of `TOPK_NEGATIVE`, `TOPK_OUT_OF_RANGE`, `TOPK_NON_CAUSAL`, `TOPK_DUPLICATE`.
    pub code: i32,
    pub head: usize,
    /// Packed query index.
    pub query: usize,
    pub slot: usize,
    pub value: i32,
}

impl TopKFault {
    /// The device error word `(code, head, query, slot)`.
    pub fn word(&self) -> [i32; 4] {
        [
            self.code,
            self.head as i32,
            self.query as i32,
            self.slot as i32,
        ]
    }
}

/// Code of one entry `value`, given the entries in earlier slots of the same (head, query), the
/// query's own block and its fragment's block count: the whole per-slot rule in one place.
pub fn entry_code(value: i32, earlier: &[i32], own_block: usize, num_blocks: usize) -> i32 {
    if value == TOPK_PADDING {
        TOPK_OK
    } else if value < 0 {
        TOPK_NEGATIVE
    } else if value as usize >= num_blocks {
        TOPK_OUT_OF_RANGE
    } else if value as usize > own_block {
        TOPK_NON_CAUSAL
    } else if earlier.contains(&value) {
        TOPK_DUPLICATE
    } else {
        TOPK_OK
    }
}

/// Reject a `topk_indices` whose length is not `4·T·16` for the layout's T.
pub fn check_topk_shape(layout: &VarlenLayout, topk: &[i32]) -> Result<()> {
    let t = layout.total_q();
    let want = NUM_INDEX_HEADS * t * TOPK_BLOCKS;
    if topk.len() != want {
        return Err(PlanError::Shape {
            name: "topk_indices",
            expected: format!("[{NUM_INDEX_HEADS}, {t}, {TOPK_BLOCKS}] ({want} values)"),
            got: format!("{} values", topk.len()),
        });
    }
    Ok(())
}

/// `(own block, num_blocks)` of every packed query, in query order.
fn query_blocks(layout: &VarlenLayout) -> Vec<(usize, usize)> {
    let mut out = Vec::with_capacity(layout.total_q());
    for f in layout.fragments() {
        out.extend((0..f.q_len).map(|i| (f.position(i) / BLOCK_SIZE, f.num_blocks)));
    }
    out
}

/// The first offending entry in linear order, or `None` when the selection is valid (shape errors
/// are returned as `PlanError::Shape`).
pub fn first_topk_fault(layout: &VarlenLayout, topk: &[i32]) -> Result<Option<TopKFault>> {
    check_topk_shape(layout, topk)?;
    let blocks = query_blocks(layout);
    let t = layout.total_q();
    for head in 0..NUM_INDEX_HEADS {
        for (query, &(own, nb)) in blocks.iter().enumerate() {
            let base = (head * t + query) * TOPK_BLOCKS;
            let entries = &topk[base..base + TOPK_BLOCKS];
            for (slot, &value) in entries.iter().enumerate() {
                let code = entry_code(value, &entries[..slot], own, nb);
                if code != TOPK_OK {
                    return Ok(Some(TopKFault {
                        code,
                        head,
                        query,
                        slot,
                        value,
                    }));
                }
            }
        }
    }
    Ok(None)
}

/// The device error word for a selection: `(code, head, query, slot)` of the first fault, or
/// `[0, 0, 0, 0]` (the zero-initialized word) when it is valid.
pub fn topk_error_word(layout: &VarlenLayout, topk: &[i32]) -> Result<[i32; 4]> {
    Ok(first_topk_fault(layout, topk)?.map_or([TOPK_OK; 4], |f| f.word()))
}

/// Accept a valid selection; otherwise return `PlanError::TopK` naming the first offending entry.
pub fn validate_topk(layout: &VarlenLayout, topk: &[i32]) -> Result<()> {
    let Some(fault) = first_topk_fault(layout, topk)? else {
        return Ok(());
    };
    let (b, _, p) = layout.query_coords(fault.query);
    let own = p / BLOCK_SIZE;
    let nb = layout.fragment(b).num_blocks;
    let reason = match fault.code {
        TOPK_NEGATIVE => "negative block id (only -1 marks padding)".to_string(),
        TOPK_OUT_OF_RANGE => format!("out of range: fragment {b} has {nb} key blocks"),
        TOPK_NON_CAUSAL => format!(
            "non-causal: block {} lies after the query's own block {own} (document position {p})",
            fault.value
        ),
        _ => {
            let base = (fault.head * layout.total_q() + fault.query) * TOPK_BLOCKS;
            let first = topk[base..base + fault.slot]
                .iter()
                .position(|&v| v == fault.value)
                .unwrap_or(0);
            format!("duplicate of slot {first} (block ids are unique per head and query)")
        }
    };
    Err(PlanError::TopK {
        head: fault.head,
        query: fault.query,
        slot: fault.slot,
        value: fault.value,
        reason,
    })
}

/// MSA's test pattern (`make_torch_topk`, the workloads' `recent16`): per (head, query) the
/// `min(own+1, 16)` most recent blocks in ascending order, the local block last, then `-1`; the
/// same for every head. Valid for every layout.
pub fn recent_topk(layout: &VarlenLayout) -> Vec<i32> {
    let t = layout.total_q();
    let mut topk = vec![TOPK_PADDING; NUM_INDEX_HEADS * t * TOPK_BLOCKS];
    for f in layout.fragments() {
        for i in 0..f.q_len {
            let own = f.position(i) / BLOCK_SIZE;
            let lo = (own + 1).saturating_sub(TOPK_BLOCKS);
            for h in 0..NUM_INDEX_HEADS {
                let row = &mut topk[(h * t + f.q_start + i) * TOPK_BLOCKS..][..TOPK_BLOCKS];
                for (slot, b) in row.iter_mut().zip(lo..=own) {
                    *slot = b as i32;
                }
            }
        }
    }
    topk
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two documents: 130 tokens (2 blocks) and 1 token (1 block).
    fn layout() -> VarlenLayout {
        VarlenLayout::documents(&[0, 130, 131]).unwrap()
    }

    fn padded(layout: &VarlenLayout) -> Vec<i32> {
        vec![-1; 4 * layout.total_q() * 16]
    }

    fn at(layout: &VarlenLayout, head: usize, query: usize, slot: usize) -> usize {
        (head * layout.total_q() + query) * 16 + slot
    }

    #[test]
    fn all_padding_and_causal_selections_are_valid() {
        let l = layout();
        let mut t = padded(&l);
        assert_eq!(validate_topk(&l, &t), Ok(()));
        t[at(&l, 0, 129, 15)] = 1; // position 129: own block 1
        t[at(&l, 0, 129, 3)] = 0;
        t[at(&l, 3, 130, 7)] = 0; // the one-token document
        assert_eq!(validate_topk(&l, &t), Ok(()));
        assert_eq!(topk_error_word(&l, &t), Ok([0; 4]));
    }

    #[test]
    fn each_code_is_detected_with_its_reason() {
        let l = layout();
        let cases = [
            (0, 5, 2, -2, TOPK_NEGATIVE, "negative block id"),
            (
                1,
                130,
                0,
                1,
                TOPK_OUT_OF_RANGE,
                "fragment 1 has 1 key blocks",
            ),
            (
                2,
                127,
                9,
                1,
                TOPK_NON_CAUSAL,
                "after the query's own block 0 (document position 127)",
            ),
            (
                3,
                129,
                4,
                2,
                TOPK_OUT_OF_RANGE,
                "fragment 0 has 2 key blocks",
            ),
        ];
        for (head, query, slot, value, code, reason) in cases {
            let mut t = padded(&l);
            t[at(&l, head, query, slot)] = value;
            assert_eq!(
                topk_error_word(&l, &t).unwrap(),
                [code, head as i32, query as i32, slot as i32]
            );
            let err = validate_topk(&l, &t).unwrap_err();
            let msg = err.to_string();
            assert!(msg.contains(reason), "{msg}");
            assert!(
                msg.starts_with(&format!("topk_indices[{head}, {query}, {slot}] = {value}")),
                "{msg}"
            );
        }
    }

    #[test]
    fn the_later_slot_of_a_duplicate_is_the_offender() {
        let l = layout();
        let mut t = padded(&l);
        t[at(&l, 1, 129, 2)] = 1;
        t[at(&l, 1, 129, 11)] = 1;
        let f = first_topk_fault(&l, &t).unwrap().unwrap();
        assert_eq!(
            (f.code, f.head, f.query, f.slot, f.value),
            (TOPK_DUPLICATE, 1, 129, 11, 1)
        );
        let msg = validate_topk(&l, &t).unwrap_err().to_string();
        assert!(msg.contains("duplicate of slot 2"), "{msg}");
    }

    #[test]
    fn the_first_fault_in_linear_order_wins() {
        let l = layout();
        let mut t = padded(&l);
        t[at(&l, 2, 0, 0)] = -7; // head 2 comes after head 1 whatever the query
        t[at(&l, 1, 130, 15)] = 9;
        t[at(&l, 1, 130, 14)] = 0;
        t[at(&l, 1, 130, 13)] = 0; // same query, earlier slot, valid
        assert_eq!(
            topk_error_word(&l, &t).unwrap(),
            [TOPK_DUPLICATE, 1, 130, 14]
        );
        t[at(&l, 1, 130, 13)] = -1;
        assert_eq!(
            topk_error_word(&l, &t).unwrap(),
            [TOPK_OUT_OF_RANGE, 1, 130, 15]
        );
        t[at(&l, 1, 130, 15)] = -1;
        assert_eq!(topk_error_word(&l, &t).unwrap(), [TOPK_NEGATIVE, 2, 0, 0]);
    }

    #[test]
    fn fragments_use_their_document_positions() {
        // Fragment 1 holds positions 224..256 of a 256-key document: block 1 is causal there.
        let l = VarlenLayout::new(&[0, 32, 64], &[0, 128, 256], Some(&[0, 0])).unwrap();
        let mut t = padded(&l);
        t[at(&l, 0, 40, 0)] = 1;
        assert_eq!(validate_topk(&l, &t), Ok(()));
        t[at(&l, 0, 31, 0)] = 1; // fragment 0 has one block
        assert_eq!(
            topk_error_word(&l, &t).unwrap(),
            [TOPK_OUT_OF_RANGE, 0, 31, 0]
        );
    }

    #[test]
    fn wrong_lengths_are_shape_errors() {
        let l = layout();
        let err = validate_topk(&l, &[0; 10]).unwrap_err();
        assert!(matches!(err, PlanError::Shape { .. }));
        assert_eq!(
            err.to_string(),
            "topk_indices must have shape [4, 131, 16] (8384 values), got 10 values"
        );
    }
}
