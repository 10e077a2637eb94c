//! Work items tile every k2q row in chunks of `target` (a multiple of 8), in head/row/chunk order.

use proptest::prelude::*;

use super::{config, ok};
use crate::csr::{build_k2q_csr, K2qCsr};
use crate::layout::VarlenLayout;
use crate::schedule::{
    balanced_target_q_per_cta, build_work_items, flat_schedule_capacity, WorkItem,
};
use crate::testing::layouts_with_topk;

pub(super) fn check_work_items(
    layout: &VarlenLayout,
    csr: &K2qCsr,
    items: &[WorkItem],
    target: usize,
) -> Result<(), String> {
    if !target.is_multiple_of(8) {
        return Err(format!("target {target} is not a multiple of 8"));
    }
    let cap = flat_schedule_capacity(layout.total_rows(), layout.total_q(), target);
    if items.len() > cap {
        return Err(format!("{} items exceed the capacity {cap}", items.len()));
    }
    let key = |w: &WorkItem| (w.head, w.row, w.q_begin);
    if items.windows(2).any(|p| key(&p[0]) >= key(&p[1])) {
        return Err("items are not in head, row, chunk order".into());
    }
    let mut next = 0;
    for head in 0..4 {
        for (row, rc) in layout.rows().iter().enumerate() {
            let (b, e) = csr.row_range(head, row);
            let mut covered = 0;
            while covered < e - b {
                let w = items.get(next).ok_or("a row is not covered")?;
                let last = covered + w.q_count == e - b;
                let count_ok = if last {
                    (1..=target).contains(&w.q_count)
                } else {
                    w.q_count == target
                };
                let place = (w.head, w.row, w.q_begin, w.fragment, w.kblock);
                if place != (head, row, covered, rc.fragment as usize, rc.level as usize)
                    || !count_ok
                {
                    return Err(format!(
                        "item {next} = {w:?} does not continue head {head} row {row} at {covered}"
                    ));
                }
                covered += w.q_count;
                next += 1;
            }
        }
    }
    if next != items.len() {
        return Err(format!("{} items beyond the rows", items.len() - next));
    }
    Ok(())
}

/// A chunk size: the balanced one for some SM count, or any multiple of 8 (small ones split rows).
pub(super) fn target_strategy() -> impl Strategy<Value = Result<usize, usize>> {
    prop_oneof![
        (1usize..=200).prop_map(Ok),
        (1usize..=64).prop_map(|g| Err(8 * g))
    ]
}

/// Resolve a [`target_strategy`] value for `total_q` queries.
pub(super) fn resolve_target(choice: Result<usize, usize>, total_q: usize) -> usize {
    match choice {
        Ok(sms) => balanced_target_q_per_cta(total_q, sms),
        Err(target) => target,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn work_items_tile_each_row((l, t) in layouts_with_topk(config()), choice in target_strategy()) {
        let target = resolve_target(choice, l.total_q());
        let csr = build_k2q_csr(&l, &t).unwrap();
        ok(check_work_items(&l, &csr, &build_work_items(&l, &csr, target).unwrap(), target))?;
    }
}
