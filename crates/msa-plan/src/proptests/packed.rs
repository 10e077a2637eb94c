//! NeMo's packed layout of random document maps: structure, and pack/unpack round trips.

use proptest::prelude::*;

use crate::packed::PackedLayout;
use crate::testing::SplitMix64;

/// A valid `[batch, seq]` map: each row is a sequence of runs, a fresh id or padding each.
fn document_map(batch: usize, seq: usize, seed: u64) -> Vec<i64> {
    let mut r = SplitMix64::new(seed);
    let mut ids = Vec::with_capacity(batch * seq);
    for _ in 0..batch {
        let (mut filled, mut next_id) = (0, 1 + r.below(3) as i64);
        while filled < seq {
            let len = 1 + r.below((seq - filled).min(300));
            let id = if r.chance(1, 4) { 0 } else { next_id };
            next_id += 1 + r.below(2) as i64;
            ids.extend(std::iter::repeat_n(id, len));
            filled += len;
        }
    }
    ids
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn layout_structure_and_round_trip(batch in 1usize..4, seq in 1usize..700, seed in any::<u64>(), width in 1usize..4) {
        let mut ids = document_map(batch, seq, seed);
        if ids.iter().all(|&d| d == 0) {
            ids[0] = 1; // at least one real token
        }
        let p = PackedLayout::from_document_map(&ids, batch, seq).unwrap();
        prop_assert_eq!(p.num_tokens, ids.iter().filter(|&&d| d > 0).count());
        prop_assert_eq!(p.cu_seqlens.len(), p.num_documents + 1);
        prop_assert_eq!(p.workspace_size % 128, 0);
        for d in 0..p.num_documents {
            let (lo, hi) = (p.cu_seqlens[d] as usize, p.cu_seqlens[d + 1] as usize);
            let start = p.document_workspace_starts[d] as i64;
            prop_assert_eq!(start % 128, 0);
            for t in lo..hi {
                let pos = (t - lo) as i64;
                prop_assert_eq!(p.document_positions[t], pos);
                prop_assert_eq!(p.workspace_positions[t], start + pos);
                prop_assert_eq!(ids[p.token_rows[t] as usize], ids[p.token_rows[lo] as usize]);
                prop_assert_eq!(p.token_rows[t], p.token_rows[lo] + pos);
            }
            let end = d + 1 < p.num_documents;
            let next = if end { p.document_workspace_starts[d + 1] as i64 } else { p.workspace_size as i64 };
            prop_assert!(start + (hi - lo) as i64 <= next && next - start < (hi - lo) as i64 + 128);
        }
        // Round trips: padding rows come back as zeros, real rows unchanged.
        let external: Vec<u32> = (0..(batch * seq * width) as u32).map(|v| v + 1).collect();
        let packed = p.pack(&external, width).unwrap();
        let back = p.unpack(&packed, width).unwrap();
        for (row, &id) in ids.iter().enumerate() {
            let span = row * width..(row + 1) * width;
            if id > 0 {
                prop_assert_eq!(&back[span.clone()], &external[span]);
            } else {
                prop_assert!(back[span].iter().all(|&v| v == 0));
            }
        }
        prop_assert_eq!(p.pack(&back, width).unwrap(), packed);
    }
}
