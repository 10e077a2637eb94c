//! Random valid [`VarlenLayout`]s: documents split into CP fragments the way a context-parallel
//! rank sees them (docs/contract.md §2.2).

use proptest::prelude::*;

use crate::layout::VarlenLayout;

/// The fragments of one document on this rank: ascending, disjoint, non-empty position ranges
/// `[begin, end)`. Empty = an empty batch entry (no queries, no keys).
pub type DocumentFragments = Vec<(usize, usize)>;

/// Size limits of generated layouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayoutConfig {
    /// Documents per layout (at least 1).
    pub max_documents: usize,
    /// Longest document, in tokens (at least 1).
    pub max_doc_len: usize,
    /// Most fragments of one document (1 = no context parallelism).
    pub max_fragments: usize,
    /// Whether empty batch entries may appear.
    pub empty_documents: bool,
}

impl Default for LayoutConfig {
    fn default() -> Self {
        Self {
            max_documents: 5,
            max_doc_len: 1200,
            max_fragments: 3,
            empty_documents: true,
        }
    }
}

/// Lengths at block boundaries, where off-by-one rules break.
const EDGE_LENGTHS: [usize; 12] = [1, 2, 127, 128, 129, 255, 256, 257, 383, 384, 385, 2049];

/// The layout of `docs` as one rank's batch: each fragment sees K from its document's start to
/// its own end and queries its own range; `fragment_indices` is passed when a document has
/// several fragments or `explicit_fragments` is set. Panics on malformed fragments.
pub fn layout_from_documents(docs: &[DocumentFragments], explicit_fragments: bool) -> VarlenLayout {
    let (mut cu_q, mut cu_k, mut first) = (vec![0i32], vec![0i32], Vec::new());
    for doc in docs {
        let kv_base = *cu_k.last().unwrap();
        let b = first.len() as i32;
        if doc.is_empty() {
            cu_q.push(*cu_q.last().unwrap());
            cu_k.push(kv_base);
            first.push(b);
        }
        let mut prev_end = 0;
        for (i, &(begin, end)) in doc.iter().enumerate() {
            assert!(
                begin < end && (i == 0 || begin >= prev_end),
                "malformed fragments {doc:?}"
            );
            prev_end = end;
            cu_q.push(*cu_q.last().unwrap() + (end - begin) as i32);
            cu_k.push(kv_base + end as i32);
            first.push(b);
        }
    }
    let fragmented = docs.iter().any(|d| d.len() > 1);
    let fragments = (fragmented || explicit_fragments).then_some(first.as_slice());
    VarlenLayout::new(&cu_q, &cu_k, fragments).expect("generated layouts are valid")
}

/// Fragments of one random document.
fn document(cfg: LayoutConfig) -> impl Strategy<Value = DocumentFragments> {
    let max_len = cfg.max_doc_len.max(1);
    let len = prop_oneof![
        3 => 1..=max_len,
        1 => prop::sample::select(EDGE_LENGTHS.to_vec()).prop_map(move |l| l.min(max_len)),
    ];
    let max_cuts = 2 * cfg.max_fragments.max(1);
    let doc = len.prop_flat_map(move |len| {
        (
            Just(len),
            prop::collection::vec(0..=len, 0..=max_cuts),
            any::<bool>(),
        )
    });
    let doc = doc.prop_map(|(len, mut cuts, whole)| {
        cuts.sort_unstable();
        cuts.dedup();
        let frags: DocumentFragments = cuts.chunks_exact(2).map(|c| (c[0], c[1])).collect();
        if whole || frags.is_empty() {
            vec![(0, len)]
        } else {
            frags
        }
    });
    // One document in nine is an empty batch entry when allowed.
    (0..9u8, doc).prop_map(move |(pick, doc)| {
        if cfg.empty_documents && pick == 0 {
            Vec::new()
        } else {
            doc
        }
    })
}

/// Random valid layouts with at least one query.
pub fn layouts(cfg: LayoutConfig) -> impl Strategy<Value = VarlenLayout> {
    let docs = prop::collection::vec(document(cfg), 1..=cfg.max_documents.max(1));
    (docs, any::<bool>()).prop_map(|(mut docs, explicit)| {
        if docs.iter().all(Vec::is_empty) {
            docs[0] = vec![(0, 1)];
        }
        layout_from_documents(&docs, explicit)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fragments_of_one_document_share_its_keys() {
        // A 300-token document held as [10, 50) and [200, 260); then an empty entry; then a
        // 5-token document.
        let l = layout_from_documents(&[vec![(10, 50), (200, 260)], vec![], vec![(0, 5)]], false);
        assert_eq!(l.cu_seqlens_q(), &[0, 40, 100, 100, 105]);
        assert_eq!(l.cu_seqlens_k(), &[0, 50, 260, 260, 265]);
        assert_eq!(l.fragment_indices(), Some(&[0, 0, 2, 3][..]));
        assert_eq!(l.fragment(1).position(0), 200);
        assert_eq!(l.fragment(1).k_len, 260);
        assert_eq!(l.fragment(3).k_base, 260);
        let plain = layout_from_documents(&[vec![(0, 3)]], false);
        assert_eq!(plain.fragment_indices(), None);
    }

    #[test]
    fn generated_layouts_reach_the_interesting_cases() {
        use proptest::strategy::ValueTree;
        use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
        let config = Config {
            failure_persistence: None,
            ..Config::default()
        };
        let mut runner =
            TestRunner::new_with_rng(config, TestRng::deterministic_rng(RngAlgorithm::ChaCha));
        let strategy = layouts(LayoutConfig::default());
        let (mut fragmented, mut offset, mut single, mut odd, mut empty, mut windows) =
            (0, 0, 0, 0, 0, 0);
        for _ in 0..200 {
            let l = strategy.new_tree(&mut runner).unwrap().current();
            let frags = l.fragments();
            fragmented += usize::from(frags.iter().enumerate().any(|(b, f)| f.first != b));
            offset += usize::from(frags.iter().any(|f| f.query_offset() > 0));
            single += usize::from(frags.iter().any(|f| f.q_len == 1));
            odd += usize::from(frags.iter().any(|f| f.k_len % 128 != 0));
            empty += usize::from(frags.iter().any(|f| f.k_len == 0));
            windows += usize::from(l.total_q() > 512);
        }
        for (name, n) in [
            ("fragmented", fragmented),
            ("query offsets", offset),
            ("single-query fragments", single),
            ("odd lengths", odd),
            ("empty entries", empty),
            ("several 512-query windows", windows),
        ] {
            assert!(n >= 10, "only {n} of 200 layouts have {name}");
        }
    }

    proptest! {
        #[test]
        fn generated_layouts_have_queries_and_respect_the_limits(l in layouts(LayoutConfig::default())) {
            prop_assert!(l.total_q() > 0);
            prop_assert!(l.batch() <= 5 * 3);
            prop_assert!(l.max_seqlen_k() <= 1200);
        }
    }
}
