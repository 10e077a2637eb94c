//! Flag values with a fixed set of names, typed so that clap rejects anything else and `--help`
//! lists them.

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::ValueEnum;
use msa_harness::backend::Backend;
use msa_harness::check::{Coverage, Tolerances};
use msa_harness::Result;
use msa_workloads::InputMode;

/// Where a call runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendArg {
    /// The GPU when this build has `msa` and device 0 is supported, else the CPU reference.
    Auto,
    /// The CPU reference (msa-ref).
    Cpu,
    /// The CUDA kernels on device 0.
    Cuda,
}

impl BackendArg {
    /// The opened backend; `poison_outputs` as [`Backend::cuda`].
    pub fn open(self, poison_outputs: bool) -> Result<Backend> {
        match self {
            Self::Cpu => Ok(Backend::Cpu),
            Self::Cuda => Backend::cuda(poison_outputs),
            Self::Auto => {
                let (backend, note) = Backend::auto(poison_outputs);
                if let Some(note) = note {
                    eprintln!("{note}");
                }
                Ok(backend)
            }
        }
    }
}

/// How much of a run's outputs `msa run` checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CheckArg {
    /// Everything on small cases, a sample of queries and key blocks on large ones.
    Auto,
    Full,
    Sample,
    /// No check (times only).
    None,
}

impl CheckArg {
    pub fn coverage(self) -> Option<Coverage> {
        match self {
            Self::Auto => Some(Coverage::Auto),
            Self::Full => Some(Coverage::Full),
            Self::Sample => Some(Coverage::Sample),
            Self::None => None,
        }
    }
}

/// How a case's inputs are drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum InputsArg {
    /// MSA's protocol: q, k, v, qi, ki ~ N(0, 0.2²), dout ~ N(0, 0.1²) (nearly uniform softmax).
    Msa,
    /// q, k, qi, ki ~ N(0, 1.5²) and a planted maximum-score key per (query, group) in a late
    /// selected block: a peaked softmax that a kernel without the online-softmax rescale fails.
    Peaked,
}

impl InputsArg {
    pub fn mode(self) -> InputMode {
        match self {
            Self::Msa => InputMode::Msa,
            Self::Peaked => InputMode::Peaked,
        }
    }
}

/// The limits a check applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TolerancesArg {
    /// MSA's own limits (docs/contract.md §7.1).
    Msa,
    /// Tenfold tighter, what the GPU suite uses.
    Strict,
}

impl TolerancesArg {
    pub fn tolerances(self) -> Tolerances {
        match self {
            Self::Msa => Tolerances::default(),
            Self::Strict => Tolerances::strict(),
        }
    }
}

/// A parser onto one of `values` by `name`: `--help` lists the names and clap rejects any other.
/// For library types that do not derive clap's traits (selection patterns, stages).
pub fn named<T: Copy + Send + Sync + 'static>(
    values: impl IntoIterator<Item = T>,
    name: impl Fn(T) -> String,
) -> impl TypedValueParser<Value = T> {
    let table: Vec<(String, T)> = values.into_iter().map(|v| (name(v), v)).collect();
    let names: Vec<String> = table.iter().map(|(n, _)| n.clone()).collect();
    PossibleValuesParser::new(names).map(move |chosen| {
        table
            .iter()
            .find(|(n, _)| *n == chosen)
            .map(|&(_, v)| v)
            .expect("clap accepts listed names only")
    })
}

/// A byte count: digits with an optional binary suffix `K`, `M`, `G` or `T` (`16G`, `512M`,
/// `1000000`); `KiB`-style and `B` endings are accepted too.
pub fn bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(t);
    let (digits, shift) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                _ => return Err(format!("unknown unit `{c}` (use K, M, G or T)")),
            };
            (&t[..i], shift)
        }
        _ => (t, 0),
    };
    let n: u64 = digits
        .trim()
        .parse()
        .map_err(|_| "expected a byte count such as 16G, 512M or 1000000".to_string())?;
    n.checked_mul(1 << shift)
        .filter(|&b| b > 0)
        .ok_or_else(|| format!("{text} is not a positive byte count below 16 EiB"))
}

#[cfg(test)]
mod tests {
    use super::bytes;

    #[test]
    fn byte_counts_take_binary_suffixes() {
        assert_eq!(bytes("1000000"), Ok(1_000_000));
        assert_eq!(bytes("512M"), Ok(512 << 20));
        assert_eq!(bytes("16g"), Ok(16 << 30));
        assert_eq!(bytes("2GiB"), Ok(2 << 30));
        assert_eq!(bytes("3KB"), Ok(3 << 10));
        assert!(bytes("0").is_err());
        assert!(bytes("4X").unwrap_err().contains("unknown unit `X`"));
        assert!(bytes("lots").is_err());
        assert!(bytes("99999999T").is_err());
    }
}
