//! Which queries and keys a sampled check looks at: random ones plus the edges where kernels
//! go wrong (first and last query of fragments, the first key block, partial blocks).

use std::ops::Range;

use msa_plan::topology::NUM_KV_HEADS;
use msa_plan::VarlenLayout;
use msa_workloads::Rng;

/// Packed queries and, per group, packed key-row ranges (one physical block each).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    pub queries: Vec<usize>,
    pub keys: Vec<(usize, Range<usize>)>,
    full: bool,
}

impl Sample {
    /// About `queries` queries and `blocks` key blocks per group, seeded.
    pub fn new(layout: &VarlenLayout, queries: usize, blocks: usize, seed: u64) -> Self {
        let mut rng = Rng::stream(seed, &[0x005A_3B1E]);
        let t = layout.total_q();
        let mut qs: Vec<usize> = Vec::new();
        for f in layout
            .fragments()
            .iter()
            .filter(|f| f.q_len > 0)
            .take(queries / 4)
        {
            qs.push(f.q_start);
            qs.push(f.q_start + f.q_len - 1);
        }
        while qs.len() < queries.min(t) {
            qs.push(rng.below(t as u64) as usize);
        }
        qs.sort_unstable();
        qs.dedup();

        let (start, count) = layout.physical_block_keys();
        let stored: Vec<usize> = (0..start.len()).filter(|&pb| count[pb] > 0).collect();
        let mut keys = Vec::new();
        for g in (0..NUM_KV_HEADS).filter(|_| !stored.is_empty()) {
            let mut picks = vec![stored[0]];
            if let Some(partial) = stored.iter().find(|&&pb| count[pb] < 128) {
                picks.push(*partial);
            }
            while picks.len() < blocks.min(stored.len()) {
                picks.push(stored[rng.below(stored.len() as u64) as usize]);
            }
            picks.sort_unstable();
            picks.dedup();
            for pb in picks {
                let s = start[pb] as usize;
                keys.push((g, s..s + count[pb] as usize));
            }
        }
        Self {
            queries: qs,
            keys,
            full: false,
        }
    }

    /// A hand-picked sample (never counted as full).
    pub fn of(queries: Vec<usize>, keys: Vec<(usize, Range<usize>)>) -> Self {
        Self {
            queries,
            keys,
            full: false,
        }
    }

    /// Every query and every key row (a full check).
    pub fn full(layout: &VarlenLayout) -> Self {
        Self {
            queries: (0..layout.total_q()).collect(),
            keys: (0..NUM_KV_HEADS)
                .map(|g| (g, 0..layout.total_k()))
                .collect(),
            full: true,
        }
    }

    /// Built by [`Sample::full`]: the check covers every output element.
    pub fn is_full(&self) -> bool {
        self.full
    }
}

/// Rows `idx` of a row-major tensor with `width` elements per row, as f32.
pub fn gather_rows<T: Copy + Into<f32>>(
    x: &[T],
    width: usize,
    idx: impl IntoIterator<Item = usize>,
) -> Vec<f32> {
    idx.into_iter()
        .flat_map(|r| x[r * width..(r + 1) * width].iter().map(|&v| v.into()))
        .collect()
}
