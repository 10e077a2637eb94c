//! The real CP16 ranks the Python GPU tests run on: `tests/data/real_ranks.jsonl`, one rank per
//! line (its layout arrays and sizes, and a checksum of its recent16 selection), is exactly what
//! msa-workloads builds from the development manifest (data/cases/cp16_192k_dev.jsonl, CP16,
//! chunks of 1,024) and msa-plan's recent16 gives; this test fails when either drifts.
//! Regenerate with `MSA_TORCH_WRITE_REAL_RANKS=1 cargo test -p msa-torch --test real_ranks`.

use msa_workloads::cp::CpConfig;
use msa_workloads::{load_manifest, DEV_MANIFEST};
use serde_json::json;

/// `(case_id, rank)`: a rank of the development benchmark's run-time cases (many fragments,
/// documents split across ranks) and one of a pack of 699 mostly short documents.
const RANKS: [(u64, usize); 2] = [(151, 7), (434, 2)];

const FILE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/real_ranks.jsonl");

/// `Σ_i (v_i + 2) · ((i · 2654435761) mod 2³¹)` over the flat selection: order- and
/// value-sensitive, and computable in int64 by torch (tests/msa_reference.py).
fn checksum(topk: &[i32]) -> i64 {
    topk.iter()
        .enumerate()
        .map(|(i, &v)| (i64::from(v) + 2) * ((i as i64 * 2_654_435_761) % (1 << 31)))
        .sum()
}

fn export() -> String {
    let cases = load_manifest(DEV_MANIFEST).expect("the development manifest loads");
    let mut text = String::new();
    for (case_id, rank) in RANKS {
        let case = cases
            .iter()
            .find(|c| c.case_id == case_id)
            .expect("the case is in the development manifest");
        let split = case
            .rank_split(&CpConfig::default(), rank)
            .expect("CP16 split");
        let r = split.into_case().expect("rank layout");
        let l = r.layout();
        let line = json!({
            "case_id": case_id,
            "rank": rank,
            "cu_seqlens_q": l.cu_seqlens_q(),
            "cu_seqlens_k": l.cu_seqlens_k(),
            "fragment_indices": l.fragment_indices(),
            "total_q": l.total_q(),
            "total_k": l.total_k(),
            "total_rows": l.total_rows(),
            "max_seqlen_q": l.max_seqlen_q(),
            "max_seqlen_k": l.max_seqlen_k(),
            "recent16_checksum": checksum(&msa_plan::topk::recent_topk(l)),
        });
        text.push_str(&line.to_string());
        text.push('\n');
    }
    text
}

#[test]
fn real_ranks_file_is_what_msa_workloads_builds() {
    let want = export();
    if std::env::var_os("MSA_TORCH_WRITE_REAL_RANKS").is_some() {
        std::fs::write(FILE, &want).expect("writing tests/data/real_ranks.jsonl");
        return;
    }
    let got = std::fs::read_to_string(FILE).expect("tests/data/real_ranks.jsonl exists");
    assert!(
        got == want,
        "tests/data/real_ranks.jsonl differs from what msa-workloads builds now; regenerate it \
         with MSA_TORCH_WRITE_REAL_RANKS=1 cargo test -p msa-torch --test real_ranks"
    );
}

#[test]
fn checksum_sees_order_and_values() {
    assert_ne!(checksum(&[1, 2, -1]), checksum(&[2, 1, -1]));
    assert_ne!(checksum(&[1, 2, -1]), checksum(&[1, 2, 0]));
    // Index 0 weighs 0; index 1 weighs 2654435761 mod 2³¹, times (-1 + 2).
    assert_eq!(checksum(&[-1, -1]), 2_654_435_761 % (1 << 31));
}
