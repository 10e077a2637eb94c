//! The walk properties can fail: each deliberately broken rule below is run through a
//! deterministic `TestRunner` with the same check as the real rule, and the runner must return a
//! counterexample that the real rule passes.

use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};

use super::walk::{check_bound, check_walk, WalkRule, REAL};
use crate::backward::walk::{chunk_map, cta_row_interval, rows_per_cta, CtaWalk, MIN_TAIL_ROWS};

/// `chunk_map` without "a partial chunk cannot join a full wave": a full wave may then own the
/// partial last chunk (signed arithmetic, as the Python original).
fn chunk_map_without_guard(rows: usize, rpc: usize, sms: usize) -> (usize, usize, usize) {
    let num_chunks = rows.div_ceil(rpc);
    let num_full = (num_chunks / sms) * sms;
    let rows_left = rows as isize - (num_full * rpc) as isize;
    if rows_left <= 0 {
        return (num_full, 1, num_full);
    }
    chunk_map(rows, rpc, sms)
}

/// `chunk_map` counting tail CTAs with a floor: the last partial tail chunk is lost.
fn chunk_map_floor_grid(rows: usize, rpc: usize, sms: usize) -> (usize, usize, usize) {
    let (num_full, tail, grid) = chunk_map(rows, rpc, sms);
    if tail >= MIN_TAIL_ROWS && grid > num_full && rows > num_full * rpc {
        return (num_full, tail, num_full + (rows - num_full * rpc) / tail);
    }
    (num_full, tail, grid)
}

/// The interval rule with `bidx > grid` for surplus CTAs (should be `>=`).
fn interval_off_by_one(bidx: usize, w: &CtaWalk) -> (usize, usize) {
    if bidx == w.grid {
        let widened = CtaWalk {
            grid: w.grid + 1,
            ..*w
        };
        return cta_row_interval(bidx, &widened);
    }
    cta_row_interval(bidx, w)
}

/// The launch bound without the one tail CTA per SM.
fn bound_without_tail(capacity: usize, _sms: usize) -> usize {
    (capacity.min(2400) / 4).max(capacity / 64)
}

fn runner(cases: u32) -> TestRunner {
    let config = Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    };
    TestRunner::new_with_rng(config, TestRng::deterministic_rng(RngAlgorithm::ChaCha))
}

/// Run `check(rule, rows, sms)` over the strategy; return the minimal counterexample.
fn counterexample(
    rule: WalkRule,
    rows: std::ops::Range<usize>,
    sms: std::ops::Range<usize>,
    check: fn(&WalkRule, usize, usize) -> Result<(), String>,
) -> (usize, usize) {
    let result = runner(512).run(&(rows, sms), |(r, s)| {
        check(&rule, r, s).map_err(TestCaseError::fail)
    });
    match result {
        Err(TestError::Fail(_, (r, s))) => {
            assert!(
                check(&rule, r, s).is_err(),
                "the counterexample must fail the mutated rule"
            );
            assert_eq!(
                check(&REAL, r, s),
                Ok(()),
                "the counterexample must pass the real rule"
            );
            (r, s)
        }
        other => panic!("the mutated rule was not caught: {other:?}"),
    }
}

fn coverage(rule: &WalkRule, rows: usize, sms: usize) -> Result<(), String> {
    check_walk(rule, rows, rows, sms)
}

#[test]
fn missing_full_wave_guard_is_caught() {
    let rule = WalkRule {
        chunk_map: chunk_map_without_guard,
        ..REAL
    };
    let (rows, sms) = counterexample(rule, 0..10_000, 1..16, coverage);
    // Only a partial chunk inside a full wave tells the rules apart.
    let rpc = rows_per_cta(rows);
    assert!(
        rows % rpc != 0 && rows.div_ceil(rpc) % sms == 0,
        "{rows} rows, {sms} SMs"
    );
}

#[test]
fn floor_tail_count_is_caught() {
    let rule = WalkRule {
        chunk_map: chunk_map_floor_grid,
        ..REAL
    };
    let err = coverage(&rule, 2401, 148).unwrap_err();
    assert!(err.contains("dropped"), "{err}");
    counterexample(rule, 0..200_000, 1..200, coverage);
}

#[test]
fn surplus_cta_off_by_one_is_caught() {
    let rule = WalkRule {
        interval: interval_off_by_one,
        ..REAL
    };
    counterexample(rule, 0..200_000, 1..200, coverage);
}

#[test]
fn bound_without_tail_ctas_is_caught() {
    let rule = WalkRule {
        bound: bound_without_tail,
        ..REAL
    };
    assert!(check_bound(&rule, 1, 1)
        .unwrap_err()
        .contains("grid exceeds"));
    counterexample(rule, 0..200_000, 1..200, check_bound);
}
