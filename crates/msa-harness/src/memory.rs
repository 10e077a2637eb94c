//! The memory a command may take: a limit (the host's, or one given), what a call of a given
//! size needs, and the typed refusal. An oversized case or file is refused before anything is
//! allocated, instead of ending in an allocation abort or the kernel's OOM killer.

use std::fmt;

use msa_plan::VarlenLayout;
use thiserror::Error;

/// Bytes, printed in GiB or MiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bytes(pub u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const MIB: f64 = (1u64 << 20) as f64;
        let mib = self.0 as f64 / MIB;
        if mib >= 1024.0 {
            write!(f, "{:.1} GiB", mib / 1024.0)
        } else {
            write!(f, "{mib:.1} MiB")
        }
    }
}

/// Where a limit comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// Set by the caller (the CLI's `--memory-limit` / `MSA_MEMORY_LIMIT`).
    Given,
    /// [`HOST_SHARE`] of what this process may use.
    Host { usable: u64 },
    /// Nothing known of the host (not Linux): no limit.
    Unknown,
}

/// The part of the host's usable memory a command plans for: the rest is left to the
/// allocator's slack, thread stacks and whatever else runs on the host.
pub const HOST_SHARE: (u64, u64) = (3, 4);

/// The most memory a command plans to hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryLimit {
    bytes: u64,
    origin: Origin,
}

impl MemoryLimit {
    pub fn given(bytes: u64) -> Self {
        Self {
            bytes,
            origin: Origin::Given,
        }
    }

    /// [`HOST_SHARE`] of the smallest of: the available memory (`MemAvailable`), the cgroup's
    /// memory limit less its use, and the address-space limit (`ulimit -v`). No limit where
    /// none of them can be read.
    pub fn host() -> Self {
        match host::usable() {
            Some(usable) => Self {
                bytes: usable / HOST_SHARE.1 * HOST_SHARE.0,
                origin: Origin::Host { usable },
            },
            None => Self {
                bytes: u64::MAX,
                origin: Origin::Unknown,
            },
        }
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Refuse `need` bytes over the limit; `what` names the work in the error.
    pub fn check(&self, need: u64, what: impl FnOnce() -> String) -> Result<(), MemoryError> {
        if need <= self.bytes {
            return Ok(());
        }
        Err(MemoryError {
            what: what(),
            need: Bytes(need),
            limit: *self,
        })
    }
}

impl fmt::Display for MemoryLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.origin {
            Origin::Given => write!(f, "{} (given)", Bytes(self.bytes)),
            Origin::Host { usable } => write!(
                f,
                "{} ({}/{} of the {} this process may use)",
                Bytes(self.bytes),
                HOST_SHARE.0,
                HOST_SHARE.1,
                Bytes(usable)
            ),
            Origin::Unknown => f.write_str("none"),
        }
    }
}

/// Work refused because it would need more memory than the limit allows.
#[derive(Debug, Error)]
#[error(
    "{what} needs about {need} of memory, over the limit of {limit}; \
     set another limit with --memory-limit or MSA_MEMORY_LIMIT"
)]
pub struct MemoryError {
    pub what: String,
    pub need: Bytes,
    pub limit: MemoryLimit,
}

/// The sizes that a call's memory grows with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallShape {
    /// T, packed queries.
    pub queries: u64,
    /// Rows of the 128-aligned key workspace (at least Tk).
    pub workspace_keys: u64,
    /// CSR rows per head, Σ ceil(klen / 128).
    pub rows: u64,
}

// Host bytes per unit of a `CallShape`, by what holds them (bf16 = 2 bytes, f32 and i32 = 4).
/// Per query: inputs q, dout (64·128 bf16 each), qi (4·128 bf16), top-k (4·16 i32) = 34,048;
/// outputs out, dq, lse, dqi, indexer top-k and LSE = 34,320; the CPU reference's fp32 dQ and
/// delta = 33,024; CSR edges (4·16 per query, four i32 tables) = 1,024.
const RUN_PER_QUERY: u64 = 34_048 + 34_320 + 33_024 + 1_024;
/// Per workspace key row: inputs k, v, ki = 2,304; outputs dk, dv, dki = 2,304; the reference's
/// fp32 dK/dV = 4,096.
const RUN_PER_KEY: u64 = 2_304 + 2_304 + 4_096;
/// Per CSR row: layout coordinates (12), row pointers (4 heads · 4), work items (4 · 24) and the
/// backward task tables (4 · 80), rounded up.
const PER_ROW: u64 = 512;
/// Per query of a plan alone: the top-k, CSR edges and per-query tables, with slack for the
/// selection generators.
const PLAN_PER_QUERY: u64 = 1_536;

impl CallShape {
    /// The sizes of a call on `layout`.
    pub fn of(layout: &VarlenLayout) -> Self {
        Self {
            queries: layout.total_q() as u64,
            workspace_keys: layout.workspace_rows() as u64,
            rows: layout.total_rows() as u64,
        }
    }

    /// One call with every stage (forward, backward, indexer, KL) and its check. Measured peaks
    /// on the CPU backend are 1.3 GB (T 12,288, Tk 14k) and 1.8 GB (Tk 185k) against estimates
    /// of 1.4 and 2.9 GB: it errs high.
    pub fn run_bytes(&self) -> u64 {
        self.queries
            .saturating_mul(RUN_PER_QUERY)
            .saturating_add(self.workspace_keys.saturating_mul(RUN_PER_KEY))
            .saturating_add(self.rows.saturating_mul(PER_ROW))
    }

    /// The host planner alone (`msa plan`): selection, CSR, schedules and task tables.
    pub fn plan_bytes(&self) -> u64 {
        self.queries
            .saturating_mul(PLAN_PER_QUERY)
            .saturating_add(self.rows.saturating_mul(PER_ROW))
    }
}

impl fmt::Display for CallShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} queries, {} workspace keys, {} CSR rows",
            self.queries, self.workspace_keys, self.rows
        )
    }
}

/// What the host lets this process use (Linux: procfs and cgroup v2 files).
mod host {
    use std::fs;

    /// `MemAvailable` of `/proc/meminfo`, in bytes.
    fn available() -> Option<u64> {
        let text = fs::read_to_string("/proc/meminfo").ok()?;
        let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib.saturating_mul(1024))
    }

    /// The soft address-space limit (`ulimit -v`) of `/proc/self/limits`.
    fn address_space() -> Option<u64> {
        let text = fs::read_to_string("/proc/self/limits").ok()?;
        let line = text.lines().find(|l| l.starts_with("Max address space"))?;
        line.split_whitespace().nth(3)?.parse().ok()
    }

    /// The cgroup v2 limit less the cgroup's current use.
    fn cgroup() -> Option<u64> {
        let read = |name| fs::read_to_string(format!("/sys/fs/cgroup/{name}")).ok();
        let max: u64 = read("memory.max")?.trim().parse().ok()?;
        let current: u64 = read("memory.current")?.trim().parse().ok()?;
        Some(max.saturating_sub(current))
    }

    pub fn usable() -> Option<u64> {
        [available(), address_space(), cgroup()]
            .into_iter()
            .flatten()
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_print_in_mib_or_gib() {
        assert_eq!(Bytes(3 << 29).to_string(), "1.5 GiB");
        assert_eq!(Bytes(5 << 19).to_string(), "2.5 MiB");
    }

    #[test]
    fn a_need_over_the_limit_is_refused_with_both_numbers() {
        let limit = MemoryLimit::given(1 << 30);
        assert!(limit.check(1 << 30, || unreachable!()).is_ok());
        let e = limit.check(3 << 30, || "case 1".into()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "case 1 needs about 3.0 GiB of memory, over the limit of 1.0 GiB (given); \
             set another limit with --memory-limit or MSA_MEMORY_LIMIT"
        );
    }

    #[test]
    fn the_host_limit_is_a_share_of_what_is_usable() {
        let limit = MemoryLimit::host();
        match limit.origin {
            Origin::Host { usable } => {
                assert_eq!(limit.bytes(), usable / 4 * 3);
                assert!(limit.to_string().contains("(3/4 of the "), "{limit}");
            }
            Origin::Unknown => assert_eq!(limit.bytes(), u64::MAX),
            Origin::Given => unreachable!(),
        }
    }

    #[test]
    fn estimates_grow_with_every_size_and_saturate() {
        let real = CallShape {
            queries: 12_288,
            workspace_keys: 186_880,
            rows: 9_264,
        };
        // Between the measured peak (1.8 GB) and twice it.
        assert!((1.8e9..3.6e9).contains(&(real.run_bytes() as f64)));
        assert!(real.plan_bytes() < real.run_bytes() / 10);
        let huge = CallShape {
            queries: u64::MAX,
            ..real
        };
        assert_eq!(huge.run_bytes(), u64::MAX);
    }
}
