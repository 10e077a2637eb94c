//! The backward task tables hold every (head, key block, query) edge exactly once, with the
//! right packed row and workspace position, in locality order, and the walk covers them.

use proptest::prelude::*;

use super::walk::{check_walk, REAL};
use super::work::{resolve_target, target_strategy};
use super::{config, ok};
use crate::backward::abi::*;
use crate::backward::{build_backward_tasks, MsaBackwardSchedule, TaskTables};
use crate::csr::build_k2q_csr;
use crate::layout::VarlenLayout;
use crate::schedule::{build_work_items, flat_schedule_capacity};
use crate::testing::layouts_with_topk;

/// Expected edges `(head, workspace kblock, packed query, workspace position)` straight from the
/// selection: the key block's workspace row and the query's key row share the document's base.
fn expected_edges(layout: &VarlenLayout, topk: &[i32]) -> Vec<(i32, i32, i32, i32)> {
    let t = layout.total_q();
    let mut out = Vec::new();
    for h in 0..4 {
        for q in 0..t {
            let (b, _, p) = layout.query_coords(q);
            let f = layout.fragment(b);
            let doc_row = f.k_base + 128 * f.first; // padded-varlen row of the document's key 0
            for &e in topk[(h * t + q) * 16..][..16].iter().filter(|&&e| e >= 0) {
                let kblock = doc_row / 128 + e as usize;
                out.push((
                    h as i32,
                    kblock as i32,
                    q as i32,
                    (doc_row / 128 * 128 + p) as i32,
                ));
            }
        }
    }
    out.sort_unstable();
    out
}

pub(super) fn check_tasks(
    layout: &VarlenLayout,
    topk: &[i32],
    tables: &TaskTables,
    num_sms: usize,
) -> Result<(), String> {
    let d = &tables.desc;
    let n = d[DESC_NUM_TASK_ROWS] as usize;
    if d[DESC_FLAGS] != 0 || d[DESC_NUM_TASKS] as usize != n || n > tables.sizes.capacity {
        return Err(format!(
            "descriptor {d:?}: expected no flags and every task walked"
        ));
    }
    let walk = tables.walk();
    if walk != crate::backward::CtaWalk::new(n, num_sms) {
        return Err(format!(
            "descriptor walk {walk:?} is not the walk of {n} rows"
        ));
    }
    check_walk(&REAL, n, tables.sizes.capacity, num_sms)?;
    if tables.grid_launch < walk.grid {
        return Err("grid_launch is below the walk's grid".into());
    }
    let mut got = Vec::new();
    let mut prev_key = None;
    for row in 0..n {
        let meta = &tables.task_meta[row * 4..row * 4 + 4];
        let (head, kblock, valid) = (
            meta[META_HEAD],
            meta[META_KBLOCK],
            meta[META_VALID] as usize,
        );
        if meta[META_BATCH] != 0 || !(1..=8).contains(&valid) {
            return Err(format!("task row {row}: meta {meta:?}"));
        }
        let qrows = &tables.task_qrows[row * 8..row * 8 + 8];
        let qpos = &tables.task_qpos[row * 8..row * 8 + 8];
        if qrows[valid..]
            .iter()
            .chain(&qpos[valid..])
            .any(|&v| v != -1)
        {
            return Err(format!("task row {row}: slots past {valid} are not -1"));
        }
        if qrows[..valid].windows(2).any(|w| w[0] >= w[1]) {
            return Err(format!("task row {row}: queries {qrows:?} do not ascend"));
        }
        let frag = layout.query_fragment(qrows[0] as usize);
        if qrows[..valid]
            .iter()
            .any(|&q| layout.query_fragment(q as usize) != frag)
        {
            return Err(format!("task row {row}: queries {qrows:?} span fragments"));
        }
        // Locality order: head, then 512-query window of the first query, then key block.
        let key = (head, qrows[0] / 512, kblock);
        if prev_key.is_some_and(|p| p > key) {
            return Err(format!("task row {row}: {key:?} after {prev_key:?}"));
        }
        prev_key = Some(key);
        got.extend((0..valid).map(|s| (head, kblock, qrows[s], qpos[s])));
    }
    let cap = tables.sizes.capacity;
    let rest = [
        &tables.task_meta[n * 4..],
        &tables.task_qrows[n * 8..],
        &tables.task_qpos[n * 8..],
    ];
    if rest.iter().any(|r| r.iter().any(|&v| v != -1)) || tables.task_meta.len() != cap * 4 {
        return Err(format!("table rows past {n} are not -1"));
    }
    got.sort_unstable();
    if got != expected_edges(layout, topk) {
        return Err("task slots differ from the selection's edges".into());
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn task_tables_cover_every_edge_once(
        (l, t) in layouts_with_topk(config()),
        choice in target_strategy(),
        num_sms in 1usize..=160,
    ) {
        let target = resolve_target(choice, l.total_q());
        let csr = build_k2q_csr(&l, &t).unwrap();
        let items = build_work_items(&l, &csr, target).unwrap();
        let cap = flat_schedule_capacity(l.total_rows(), l.total_q(), target);
        let s = MsaBackwardSchedule::from_plan(&l, &csr, &items, cap).unwrap();
        let tables = build_backward_tasks(&s, l.total_q(), l.workspace_rows(), num_sms).unwrap();
        prop_assert_eq!(tables.desc[DESC_NUM_WORK] as usize, items.len());
        ok(check_tasks(&l, &t, &tables, num_sms))?;
    }
}
