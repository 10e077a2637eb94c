//! The rule `msa_prepare_layout` (kernels/src/prepare/layout.cu) uses to derive the layout
//! arrays on the device, transliterated: per packed query a binary search over cu_seqlens_q, per
//! physical block a binary search over the fragments' `phys_base` landing on the covering
//! document's last fragment. It must equal the host's `query_fragments` and
//! `physical_block_keys` (the max over a document's fragments) on every layout; the GPU suite
//! checks the kernel itself against the host word for word.

use proptest::prelude::*;

use super::config;
use crate::layout::VarlenLayout;
use crate::testing::layouts;
use crate::topology::BLOCK_SIZE;

/// The kernel's `first_of`: the fragment's document's first fragment, clamped into `[0, b]`.
fn first_of(frag: Option<&[i32]>, b: usize) -> usize {
    frag.map_or(b, |f| (f[b].max(0) as usize).min(b))
}

fn phys_base_of(cu_k: &[i32], frag: Option<&[i32]>, b: usize) -> i64 {
    let first = first_of(frag, b);
    (cu_k[first] as i64 + (first * BLOCK_SIZE) as i64) / BLOCK_SIZE as i64
}

/// `(fragment_first, query_fragment, block_key_start, block_key_count)` by the kernel's rule.
fn device_rule(l: &VarlenLayout) -> (Vec<i32>, Vec<i32>, Vec<i32>, Vec<i32>) {
    let (cu_q, cu_k, frag) = (l.cu_seqlens_q(), l.cu_seqlens_k(), l.fragment_indices());
    let batch = l.batch();
    let fragment_first = (0..batch)
        .map(|b| frag.map_or(b as i32, |f| f[b]))
        .collect();
    let query_fragment = (0..l.total_q())
        .map(|i| {
            let (mut lo, mut hi) = (0usize, batch + 1);
            while lo < hi {
                let mid = (lo + hi) / 2;
                if cu_q[mid] as usize <= i {
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
            (lo as i64 - 1).clamp(0, batch as i64 - 1) as i32
        })
        .collect();
    let (mut start, mut count) = (Vec::new(), Vec::new());
    for pb in 0..l.padded_kv_blocks() as i64 {
        let (mut lo, mut hi) = (0usize, batch);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if phys_base_of(cu_k, frag, mid) <= pb {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        let (mut s, mut c) = (-1i32, 0i32);
        if lo > 0 {
            let b = lo - 1;
            let k_base = cu_k[first_of(frag, b)] as i64;
            let k_len = cu_k[b + 1] as i64 - k_base;
            let j = pb - phys_base_of(cu_k, frag, b);
            if j * (BLOCK_SIZE as i64) < k_len {
                s = (k_base + j * BLOCK_SIZE as i64) as i32;
                c = (k_len - j * BLOCK_SIZE as i64).min(BLOCK_SIZE as i64) as i32;
            }
        }
        start.push(s);
        count.push(c);
    }
    (fragment_first, query_fragment, start, count)
}

fn check_device_rule(l: &VarlenLayout) -> Result<(), String> {
    let (first, qf, start, count) = device_rule(l);
    let (host_start, host_count) = l.physical_block_keys();
    if first != l.fragment_first() {
        return Err(format!(
            "fragment_first {first:?} vs {:?}",
            l.fragment_first()
        ));
    }
    if qf != l.query_fragments() {
        return Err(format!(
            "query_fragment {qf:?} vs {:?}",
            l.query_fragments()
        ));
    }
    if (start.clone(), count.clone()) != (host_start.clone(), host_count.clone()) {
        return Err(format!(
            "block keys ({start:?}, {count:?}) vs ({host_start:?}, {host_count:?}) for {l:?}"
        ));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn device_layout_rule_equals_the_host_layout(l in layouts(config())) {
        super::ok(check_device_rule(&l))?;
    }
}

#[test]
fn device_layout_rule_on_fixed_layouts() {
    let cases = [
        VarlenLayout::new(&[0, 1], &[0, 1], None).unwrap(),
        VarlenLayout::new(&[0, 0, 5], &[0, 100, 105], Some(&[0, 0])).unwrap(),
        VarlenLayout::new(&[0, 32, 64, 70], &[0, 200, 300, 306], Some(&[0, 0, 2])).unwrap(),
        VarlenLayout::new(
            &[0, 10, 20, 30, 40, 40],
            &[0, 130, 300, 300, 520, 900],
            Some(&[0, 0, 0, 3, 3]),
        )
        .unwrap(),
        VarlenLayout::documents(&[0, 0, 128, 128, 384, 385]).unwrap(),
    ];
    for l in &cases {
        check_device_rule(l).unwrap();
    }
}
