//! The fixed MSA v1 / MiniMax M3 topology, as a validated value.

use crate::error::{PlanError, Result};

/// Query heads.
pub const NUM_Q_HEADS: usize = 64;
/// Key/value heads (GQA groups).
pub const NUM_KV_HEADS: usize = 4;
/// Lightning-indexer query heads, one per GQA group.
pub const NUM_INDEX_HEADS: usize = 4;
/// Main-branch head dimension.
pub const HEAD_DIM: usize = 128;
/// Indexer head dimension.
pub const INDEX_DIM: usize = 128;
/// Keys per document-local block; also the aligned-workspace unit.
pub const BLOCK_SIZE: usize = 128;
/// Selected blocks per (group, query), the local block included.
pub const TOPK_BLOCKS: usize = 16;
/// Queries per backward task row: a 128-row tile folds 8 queries x 16 heads.
pub const QUERY_CHUNK: usize = 8;
/// Query heads that share one KV head and one selection.
pub const HEADS_PER_GROUP: usize = NUM_Q_HEADS / NUM_KV_HEADS;
/// The attention and indexer scale 128^-0.5 in f64, for references.
pub const SOFTMAX_SCALE_F64: f64 = 0.088_388_347_648_318_44;
/// The attention and indexer scale 128^-0.5, correctly rounded to f32.
pub const SOFTMAX_SCALE: f32 = SOFTMAX_SCALE_F64 as f32;

/// The shape constants of one MSA configuration. Only [`Topology::MSA_V1`] is supported; any
/// other value is rejected by [`Topology::validate`] with every expected and found value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Topology {
    pub num_q_heads: usize,
    pub num_kv_heads: usize,
    pub num_index_heads: usize,
    pub head_dim: usize,
    pub index_dim: usize,
    pub block_size: usize,
    pub topk_blocks: usize,
    pub query_chunk: usize,
}

impl Topology {
    /// The one configuration msa-rs is built for.
    pub const MSA_V1: Topology = Topology {
        num_q_heads: NUM_Q_HEADS,
        num_kv_heads: NUM_KV_HEADS,
        num_index_heads: NUM_INDEX_HEADS,
        head_dim: HEAD_DIM,
        index_dim: INDEX_DIM,
        block_size: BLOCK_SIZE,
        topk_blocks: TOPK_BLOCKS,
        query_chunk: QUERY_CHUNK,
    };

    fn fields(&self) -> [(&'static str, usize); 8] {
        [
            ("num_q_heads", self.num_q_heads),
            ("num_kv_heads", self.num_kv_heads),
            ("num_index_heads", self.num_index_heads),
            ("head_dim", self.head_dim),
            ("index_dim", self.index_dim),
            ("block_size", self.block_size),
            ("topk_blocks", self.topk_blocks),
            ("query_chunk", self.query_chunk),
        ]
    }

    fn describe(&self) -> String {
        let parts: Vec<String> = self
            .fields()
            .iter()
            .map(|(n, v)| format!("{n}={v}"))
            .collect();
        format!("({})", parts.join(", "))
    }

    /// Accept exactly [`Topology::MSA_V1`]; otherwise name the first differing field and list
    /// both configurations.
    pub fn validate(&self) -> Result<Self> {
        let want = Self::MSA_V1;
        for ((name, got), (_, expected)) in self.fields().into_iter().zip(want.fields()) {
            if got != expected {
                return Err(PlanError::Topology {
                    field: name,
                    expected: expected.to_string(),
                    got: got.to_string(),
                    all_expected: want.describe(),
                    all_got: self.describe(),
                });
            }
        }
        Ok(*self)
    }

    /// Query heads per GQA group (16).
    pub const fn heads_per_group(&self) -> usize {
        self.num_q_heads / self.num_kv_heads
    }

    /// The softmax scale, `head_dim^-0.5` (validated topologies have head_dim 128).
    pub fn softmax_scale(&self) -> f32 {
        ((self.head_dim as f64).powf(-0.5)) as f32
    }
}

impl Default for Topology {
    fn default() -> Self {
        Self::MSA_V1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn msa_v1_is_valid_and_scale_matches_constant() {
        assert_eq!(Topology::MSA_V1.validate(), Ok(Topology::MSA_V1));
        assert_eq!(Topology::MSA_V1.softmax_scale(), SOFTMAX_SCALE);
        assert_eq!(Topology::MSA_V1.heads_per_group(), 16);
        assert!((SOFTMAX_SCALE_F64 - 128f64.powf(-0.5)).abs() < 1e-15);
    }

    #[test]
    fn other_configurations_are_rejected_with_both_sides_listed() {
        let t = Topology {
            num_kv_heads: 8,
            ..Topology::MSA_V1
        };
        let err = t.validate().unwrap_err().to_string();
        assert!(err.contains("num_kv_heads must be 4, got 8"), "{err}");
        assert!(
            err.contains("expected (num_q_heads=64, num_kv_heads=4"),
            "{err}"
        );
        assert!(err.contains("got (num_q_heads=64, num_kv_heads=8"), "{err}");
        let t = Topology {
            head_dim: 64,
            ..Topology::MSA_V1
        };
        assert!(t
            .validate()
            .unwrap_err()
            .to_string()
            .contains("head_dim must be 128, got 64"));
    }
}
