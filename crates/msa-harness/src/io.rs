//! The tensors of one MSA call and their safetensors files, with MSA's tensor names, dtypes and
//! layouts (docs/design.md "Tensors"): [`CallInputs`] (read by [`read_inputs`], written by
//! [`write_inputs`]) and [`Outputs`] ([`read_outputs`], [`write_outputs`]).
//!
//! Every tensor is checked on the way in and out: present, dtype, shape, and the sizes T (queries),
//! Tk (packed keys) and B (fragments) agreeing across tensors; errors name the tensor, the
//! expected and the found value. Unknown tensor names are rejected so a misspelt optional tensor
//! (say `dOut`) cannot silently drop a pass.
//!
//! A file is read only when it is a regular file whose size fits the memory limit; files are
//! written whole or not at all, under the rules of [`crate::output_path`].

use std::fmt::Write as _;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use half::bf16;
use msa_plan::topology::{
    HEAD_DIM, INDEX_DIM, NUM_INDEX_HEADS, NUM_KV_HEADS, NUM_Q_HEADS, TOPK_BLOCKS,
};
use msa_plan::{PlanError, VarlenLayout};
use msa_workloads::Inputs;
use safetensors::tensor::{Metadata, TensorInfo};
use safetensors::{Dtype, SafeTensors};
use thiserror::Error;

use crate::memory::{MemoryError, MemoryLimit};
use crate::output_path::{self, OutputError};

/// A rejected or unreadable tensor file.
#[derive(Debug, Error)]
pub enum TensorFileError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("{} is not a valid safetensors file: {reason}", path.display())]
    Format { path: PathBuf, reason: String },

    /// A FIFO or a device (say `/dev/zero`) is never read: it may not end.
    #[error("{} is {kind}, not a regular file", path.display())]
    NotAFile { path: PathBuf, kind: &'static str },

    /// Holding the file would pass the memory limit.
    #[error(transparent)]
    Memory(#[from] MemoryError),

    /// The path may not be written, or writing it failed.
    #[error(transparent)]
    Output(#[from] OutputError),

    #[error("tensor `{0}` is missing")]
    Missing(&'static str),

    #[error("tensor `{missing}` is missing: `{present}` is present and the indexer needs both")]
    Unpaired {
        missing: &'static str,
        present: &'static str,
    },

    #[error("tensor `{name}` is not {kind} tensor (expected one of: {known})")]
    Unexpected {
        name: String,
        kind: &'static str,
        known: String,
    },

    #[error("tensor `{name}` must be {expected}, got {got}")]
    Dtype {
        name: &'static str,
        expected: Dtype,
        got: Dtype,
    },

    #[error("tensor `{name}` must have shape {expected}, got {got}")]
    Shape {
        name: &'static str,
        expected: String,
        got: String,
    },

    /// T, Tk or B differs between two tensors.
    #[error("inconsistent sizes: {0}")]
    Inconsistent(String),

    /// `cu_seqlens_*` / `fragment_indices` describe no valid layout.
    #[error(transparent)]
    Layout(#[from] PlanError),
}

pub type Result<T, E = TensorFileError> = std::result::Result<T, E>;

/// Element types of the files.
trait Element: Copy {
    const DTYPE: Dtype;
    fn from_le(bytes: &[u8]) -> Self;
    fn extend_le(self, out: &mut Vec<u8>);

    /// `xs` little-endian, a bounded chunk at a time (no copy of the whole tensor).
    fn write_le(xs: &[Self], w: &mut impl Write) -> io::Result<()> {
        let mut buf = Vec::with_capacity(WRITE_CHUNK * std::mem::size_of::<Self>());
        for chunk in xs.chunks(WRITE_CHUNK) {
            buf.clear();
            chunk.iter().for_each(|x| x.extend_le(&mut buf));
            w.write_all(&buf)?;
        }
        Ok(())
    }
}

/// Elements encoded per write.
const WRITE_CHUNK: usize = 1 << 16;

impl Element for bf16 {
    const DTYPE: Dtype = Dtype::BF16;
    fn from_le(b: &[u8]) -> Self {
        bf16::from_bits(u16::from_le_bytes([b[0], b[1]]))
    }
    fn extend_le(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_bits().to_le_bytes());
    }
}

impl Element for i32 {
    const DTYPE: Dtype = Dtype::I32;
    fn from_le(b: &[u8]) -> Self {
        i32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
    fn extend_le(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
}

impl Element for f32 {
    const DTYPE: Dtype = Dtype::F32;
    fn from_le(b: &[u8]) -> Self {
        f32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
    fn extend_le(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
}

/// The sizes shared between tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sym {
    T,
    Tk,
    B,
}

/// A dimension: a constant, or a shared size plus an offset (`B+1`).
#[derive(Debug, Clone, Copy)]
enum Dim {
    N(usize),
    S(Sym, usize),
}

const B1: Dim = Dim::S(Sym::B, 1);
const T: Dim = Dim::S(Sym::T, 0);
const TK: Dim = Dim::S(Sym::Tk, 0);
const B: Dim = Dim::S(Sym::B, 0);
const HQ: Dim = Dim::N(NUM_Q_HEADS);
const HKV: Dim = Dim::N(NUM_KV_HEADS);
const HI: Dim = Dim::N(NUM_INDEX_HEADS);
const D: Dim = Dim::N(HEAD_DIM);
const DI: Dim = Dim::N(INDEX_DIM);
const K16: Dim = Dim::N(TOPK_BLOCKS);

/// A named tensor of the files; each shape has exactly one shared-size dimension.
struct Spec {
    name: &'static str,
    dtype: Dtype,
    dims: &'static [Dim],
}

const fn spec(name: &'static str, dtype: Dtype, dims: &'static [Dim]) -> Spec {
    Spec { name, dtype, dims }
}

const Q: Spec = spec("q", Dtype::BF16, &[T, HQ, D]);
const K: Spec = spec("k", Dtype::BF16, &[TK, HKV, D]);
const V: Spec = spec("v", Dtype::BF16, &[TK, HKV, D]);
const TOPK: Spec = spec("topk_indices", Dtype::I32, &[HKV, T, K16]);
const CU_Q: Spec = spec("cu_seqlens_q", Dtype::I32, &[B1]);
const CU_K: Spec = spec("cu_seqlens_k", Dtype::I32, &[B1]);
const FRAGMENTS: Spec = spec("fragment_indices", Dtype::I32, &[B]);
const DOUT: Spec = spec("dout", Dtype::BF16, &[T, HQ, D]);
const QI: Spec = spec("qi", Dtype::BF16, &[T, HI, DI]);
const KI: Spec = spec("ki", Dtype::BF16, &[TK, Dim::N(1), DI]);
const INPUTS: [&Spec; 10] = [&Q, &K, &V, &TOPK, &CU_Q, &CU_K, &FRAGMENTS, &DOUT, &QI, &KI];

const OUT: Spec = spec("out", Dtype::BF16, &[T, HQ, D]);
const LSE: Spec = spec("lse", Dtype::F32, &[T, HQ]);
const DQ: Spec = spec("dq", Dtype::BF16, &[T, HQ, D]);
const DK: Spec = spec("dk", Dtype::BF16, &[TK, HKV, D]);
const DV: Spec = spec("dv", Dtype::BF16, &[TK, HKV, D]);
const INDEXER_TOPK: Spec = spec("indexer_topk", Dtype::I32, &[HI, T, K16]);
const INDEXER_LSE: Spec = spec("indexer_lse", Dtype::F32, &[HI, T]);
const DQI: Spec = spec("dqi", Dtype::BF16, &[T, HI, DI]);
const DKI: Spec = spec("dki", Dtype::BF16, &[TK, Dim::N(1), DI]);
const OUTPUTS: [&Spec; 9] = [
    &OUT,
    &LSE,
    &DQ,
    &DK,
    &DV,
    &INDEXER_TOPK,
    &INDEXER_LSE,
    &DQI,
    &DKI,
];

impl Spec {
    /// `[T, 64, 128]`, or with the bound sizes filled in: `[300, 64, 128]`.
    fn describe(&self, sizes: Option<&Sizes>) -> String {
        let mut s = String::from("[");
        for (i, d) in self.dims.iter().enumerate() {
            if i > 0 {
                s.push_str(", ");
            }
            match (*d, sizes.and_then(|z| z.value(*d))) {
                (_, Some(v)) | (Dim::N(v), None) => write!(s, "{v}").unwrap(),
                (Dim::S(sym, plus), None) => {
                    write!(s, "{sym:?}{}", if plus > 0 { "+1" } else { "" }).unwrap()
                }
            }
        }
        s.push(']');
        s
    }

    fn fixed_product(&self) -> usize {
        self.dims
            .iter()
            .map(|d| if let Dim::N(n) = d { *n } else { 1 })
            .product()
    }
}

/// T, Tk and B once known, with the tensor that fixed each.
#[derive(Default)]
struct Sizes {
    bound: Vec<(Sym, usize, &'static str)>,
}

impl Sizes {
    fn get(&self, sym: Sym) -> Option<(usize, &'static str)> {
        self.bound.iter().find(|b| b.0 == sym).map(|b| (b.1, b.2))
    }

    fn value(&self, d: Dim) -> Option<usize> {
        match d {
            Dim::N(n) => Some(n),
            Dim::S(sym, plus) => self.get(sym).map(|(v, _)| v + plus),
        }
    }

    /// Bind `sym` (dimension value `got` = size + `plus`) to `name`'s value, or check it agrees.
    fn unify(&mut self, name: &'static str, sym: Sym, plus: usize, got: usize) -> Result<()> {
        match self.get(sym) {
            Some((v, _)) if v + plus == got => Ok(()),
            Some((v, by)) => {
                let label = format!("{sym:?}{}", if plus > 0 { "+1" } else { "" });
                Err(TensorFileError::Inconsistent(format!(
                    "`{name}` has {label} = {got} but `{by}` has {label} = {}",
                    v + plus
                )))
            }
            None => {
                self.bound.push((sym, got - plus, name));
                Ok(())
            }
        }
    }

    /// Check a shape read from a file: rank and constants, then the shared sizes.
    fn check_shape(&mut self, spec: &Spec, shape: &[usize]) -> Result<()> {
        let fixed_ok = shape.len() == spec.dims.len()
            && spec.dims.iter().zip(shape).all(|(d, &n)| match d {
                Dim::N(want) => n == *want,
                Dim::S(_, plus) => n >= *plus,
            });
        if !fixed_ok {
            return Err(TensorFileError::Shape {
                name: spec.name,
                expected: spec.describe(None),
                got: format!("{shape:?}"),
            });
        }
        for (d, &n) in spec.dims.iter().zip(shape) {
            if let Dim::S(sym, plus) = d {
                self.unify(spec.name, *sym, *plus, n)?;
            }
        }
        Ok(())
    }

    /// The shape of a tensor about to be written with `len` elements: its shared size is
    /// taken from `len` when not yet bound, else `len` must match.
    fn shape_of_len(&mut self, spec: &Spec, len: usize) -> Result<Vec<usize>> {
        let fixed = spec.fixed_product();
        let shape_err = |why: String| TensorFileError::Shape {
            name: spec.name,
            expected: spec.describe(Some(self)),
            got: format!("{len} elements{why}"),
        };
        let (sym, plus) = spec
            .dims
            .iter()
            .find_map(|d| {
                if let Dim::S(s, p) = d {
                    Some((*s, *p))
                } else {
                    None
                }
            })
            .expect("every spec has one shared size");
        if !len.is_multiple_of(fixed) {
            return Err(shape_err(format!(" (not a multiple of {fixed})")));
        }
        if len / fixed < plus {
            return Err(shape_err(String::new()));
        }
        if let Some((v, _)) = self.get(sym) {
            if (v + plus) * fixed != len {
                return Err(shape_err(String::new()));
            }
        }
        self.unify(spec.name, sym, plus, len / fixed)?;
        Ok(spec.dims.iter().map(|&d| self.value(d).unwrap()).collect())
    }
}

/// The indexer inputs; present means the indexer (and the KL backward) runs.
#[derive(Debug, Clone, PartialEq)]
pub struct IndexTensors {
    /// `[T, 4, 128]`
    pub qi: Vec<bf16>,
    /// `[Tk, 1, 128]`
    pub ki: Vec<bf16>,
}

/// The inputs of one call, in host memory: what every backend runs and an inputs file holds.
/// `layout` holds `cu_seqlens_q`, `cu_seqlens_k` and the optional `fragment_indices`.
#[derive(Debug, Clone, PartialEq)]
pub struct CallInputs {
    pub layout: VarlenLayout,
    /// `[T, 64, 128]`
    pub q: Vec<bf16>,
    /// `[Tk, 4, 128]`
    pub k: Vec<bf16>,
    /// `[Tk, 4, 128]`
    pub v: Vec<bf16>,
    /// `[4, T, 16]`
    pub topk_indices: Vec<i32>,
    /// `[T, 64, 128]`; present means the backward runs too.
    pub dout: Option<Vec<bf16>>,
    pub index: Option<IndexTensors>,
}

impl CallInputs {
    /// A generated case with every optional tensor (dout, qi, ki) present.
    pub fn generated(layout: VarlenLayout, inputs: Inputs, topk_indices: Vec<i32>) -> Self {
        let Inputs {
            q,
            k,
            v,
            dout,
            qi,
            ki,
        } = inputs;
        Self {
            layout,
            q,
            k,
            v,
            topk_indices,
            dout: Some(dout),
            index: Some(IndexTensors { qi, ki }),
        }
    }
}

/// The results of one call; absent tensors were not computed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outputs {
    /// `[T, 64, 128]`
    pub out: Option<Vec<bf16>>,
    /// `[T, 64]`, natural log.
    pub lse: Option<Vec<f32>>,
    /// `[T, 64, 128]`
    pub dq: Option<Vec<bf16>>,
    /// `[Tk, 4, 128]`
    pub dk: Option<Vec<bf16>>,
    /// `[Tk, 4, 128]`
    pub dv: Option<Vec<bf16>>,
    /// `[4, T, 16]`
    pub indexer_topk: Option<Vec<i32>>,
    /// `[4, T]`
    pub indexer_lse: Option<Vec<f32>>,
    /// `[T, 4, 128]`
    pub dqi: Option<Vec<bf16>>,
    /// `[Tk, 1, 128]`
    pub dki: Option<Vec<bf16>>,
}

/// A parsed file whose tensors are fetched by spec.
struct Reader<'a> {
    st: SafeTensors<'a>,
    sizes: Sizes,
}

impl<'a> Reader<'a> {
    fn new(path: &Path, bytes: &'a [u8], kind: &'static str, specs: &[&Spec]) -> Result<Self> {
        let st = SafeTensors::deserialize(bytes).map_err(|e| TensorFileError::Format {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        let mut names = st.names();
        names.sort_unstable();
        if let Some(name) = names
            .into_iter()
            .find(|n| specs.iter().all(|s| s.name != *n))
        {
            let known = specs.iter().map(|s| s.name).collect::<Vec<_>>().join(", ");
            return Err(TensorFileError::Unexpected {
                name: name.to_string(),
                kind,
                known,
            });
        }
        Ok(Self {
            st,
            sizes: Sizes::default(),
        })
    }

    fn optional<E: Element>(&mut self, spec: &Spec) -> Result<Option<Vec<E>>> {
        debug_assert_eq!(spec.dtype, E::DTYPE);
        let Ok(view) = self.st.tensor(spec.name) else {
            return Ok(None);
        };
        if view.dtype() != spec.dtype {
            return Err(TensorFileError::Dtype {
                name: spec.name,
                expected: spec.dtype,
                got: view.dtype(),
            });
        }
        self.sizes.check_shape(spec, view.shape())?;
        let width = spec.dtype.bitsize() / 8;
        Ok(Some(
            view.data().chunks_exact(width).map(E::from_le).collect(),
        ))
    }

    fn required<E: Element>(&mut self, spec: &Spec) -> Result<Vec<E>> {
        self.optional(spec)?
            .ok_or(TensorFileError::Missing(spec.name))
    }
}

/// The whole file at `path`. Refused before reading: anything but a regular file (a FIFO or a
/// device such as `/dev/zero` may never end), a header length that the file cannot hold, and a
/// file that, held twice (the bytes, then the tensors decoded from them), would pass `limit`.
fn read_bytes(path: &Path, limit: &MemoryLimit) -> Result<Vec<u8>> {
    let io_err = |source| TensorFileError::Io {
        path: path.to_path_buf(),
        source,
    };
    let format_err = |reason: String| TensorFileError::Format {
        path: path.to_path_buf(),
        reason,
    };
    // Checked on the path first: opening a FIFO would wait for a writer.
    let meta = fs::metadata(path).map_err(io_err)?;
    if !meta.is_file() {
        return Err(TensorFileError::NotAFile {
            path: path.to_path_buf(),
            kind: output_path::kind(meta.file_type()),
        });
    }
    let mut file = File::open(path).map_err(io_err)?;
    let len = file.metadata().map_err(io_err)?.len();
    let mut head = [0u8; 8];
    file.read_exact(&mut head).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => format_err(format!(
            "{len} bytes, shorter than the 8-byte header length"
        )),
        _ => io_err(e),
    })?;
    let header = u64::from_le_bytes(head);
    if header > len - 8 {
        return Err(format_err(format!(
            "its header length {header} exceeds the {len}-byte file"
        )));
    }
    limit.check(len.saturating_mul(2), || {
        format!("reading {} ({len} bytes)", path.display())
    })?;
    let mut bytes = Vec::with_capacity(len as usize);
    bytes.extend_from_slice(&head);
    // Bounded by the size just checked, should the file grow meanwhile.
    file.take(len - 8).read_to_end(&mut bytes).map_err(io_err)?;
    Ok(bytes)
}

/// Read and check an inputs file, within the host's memory limit ([`MemoryLimit::host`]).
pub fn read_inputs(path: impl AsRef<Path>) -> Result<CallInputs> {
    read_inputs_within(path, &MemoryLimit::host())
}

/// Read and check an inputs file, refused when holding it would pass `limit`.
pub fn read_inputs_within(path: impl AsRef<Path>, limit: &MemoryLimit) -> Result<CallInputs> {
    let path = path.as_ref();
    let bytes = read_bytes(path, limit)?;
    let mut r = Reader::new(path, &bytes, "an input", &INPUTS)?;
    let q = r.required(&Q)?;
    let k = r.required(&K)?;
    let v = r.required(&V)?;
    let topk_indices = r.required(&TOPK)?;
    let cu_q: Vec<i32> = r.required(&CU_Q)?;
    let cu_k: Vec<i32> = r.required(&CU_K)?;
    let fragment_indices: Option<Vec<i32>> = r.optional(&FRAGMENTS)?;
    let dout = r.optional(&DOUT)?;
    let index = match (r.optional(&QI)?, r.optional(&KI)?) {
        (Some(qi), Some(ki)) => Some(IndexTensors { qi, ki }),
        (None, None) => None,
        (Some(_), None) => {
            return Err(TensorFileError::Unpaired {
                missing: KI.name,
                present: QI.name,
            })
        }
        (None, Some(_)) => {
            return Err(TensorFileError::Unpaired {
                missing: QI.name,
                present: KI.name,
            })
        }
    };
    // Before the layout's own rules: a total that disagrees with the tensors is the plainer
    // message (and the layout's size limits would speak of a length no tensor has).
    for (spec, cu, sym) in [(&CU_Q, &cu_q, Sym::T), (&CU_K, &cu_k, Sym::Tk)] {
        let (n, by) = r.sizes.get(sym).expect("q and k bind T and Tk");
        let total = *cu.last().expect("a [B+1] shape has an entry");
        if i64::from(total) != n as i64 {
            return Err(TensorFileError::Inconsistent(format!(
                "{}[B] = {total} but `{by}` has {sym:?} = {n}",
                spec.name
            )));
        }
    }
    let layout = VarlenLayout::new(&cu_q, &cu_k, fragment_indices.as_deref())?;
    Ok(CallInputs {
        layout,
        q,
        k,
        v,
        topk_indices,
        dout,
        index,
    })
}

/// Read and check an outputs file (every tensor optional), within the host's memory limit.
pub fn read_outputs(path: impl AsRef<Path>) -> Result<Outputs> {
    read_outputs_within(path, &MemoryLimit::host())
}

/// Read and check an outputs file, refused when holding it would pass `limit`.
pub fn read_outputs_within(path: impl AsRef<Path>, limit: &MemoryLimit) -> Result<Outputs> {
    let path = path.as_ref();
    let bytes = read_bytes(path, limit)?;
    let mut r = Reader::new(path, &bytes, "an output", &OUTPUTS)?;
    Ok(Outputs {
        out: r.optional(&OUT)?,
        lse: r.optional(&LSE)?,
        dq: r.optional(&DQ)?,
        dk: r.optional(&DK)?,
        dv: r.optional(&DV)?,
        indexer_topk: r.optional(&INDEXER_TOPK)?,
        indexer_lse: r.optional(&INDEXER_LSE)?,
        dqi: r.optional(&DQI)?,
        dki: r.optional(&DKI)?,
    })
}

/// A tensor to write, encoded little-endian as it is written.
enum Data<'a> {
    Bf16(&'a [bf16]),
    I32(&'a [i32]),
    F32(&'a [f32]),
}

impl Data<'_> {
    fn len(&self) -> usize {
        match self {
            Data::Bf16(x) => x.len(),
            Data::I32(x) => x.len(),
            Data::F32(x) => x.len(),
        }
    }

    fn dtype(&self) -> Dtype {
        match self {
            Data::Bf16(_) => Dtype::BF16,
            Data::I32(_) => Dtype::I32,
            Data::F32(_) => Dtype::F32,
        }
    }

    fn write_le(&self, w: &mut impl Write) -> io::Result<()> {
        match self {
            Data::Bf16(x) => Element::write_le(x, w),
            Data::I32(x) => Element::write_le(x, w),
            Data::F32(x) => Element::write_le(x, w),
        }
    }
}

struct Entry<'a> {
    name: &'static str,
    data: Data<'a>,
    shape: Vec<usize>,
}

/// Collects the tensors of a file, resolving and checking every shape.
#[derive(Default)]
struct Writer<'a> {
    sizes: Sizes,
    entries: Vec<Entry<'a>>,
}

impl<'a> Writer<'a> {
    fn add(&mut self, spec: &Spec, data: Data<'a>) -> Result<()> {
        let shape = self.sizes.shape_of_len(spec, data.len())?;
        self.entries.push(Entry {
            name: spec.name,
            data,
            shape,
        });
        Ok(())
    }

    fn bf16(&mut self, spec: &Spec, x: Option<&'a [bf16]>) -> Result<()> {
        x.map_or(Ok(()), |x| self.add(spec, Data::Bf16(x)))
    }

    /// The 8-byte header length and the JSON header (padded to 8 bytes), in the order of the
    /// safetensors crate (by dtype alignment, then name), so the file is the one it would write.
    fn header(&mut self) -> Vec<u8> {
        self.entries
            .sort_by(|a, b| (b.data.dtype().cmp(&a.data.dtype())).then(a.name.cmp(b.name)));
        let mut offset = 0;
        let infos = self
            .entries
            .iter()
            .map(|e| {
                let end = offset + e.data.len() * e.data.dtype().bitsize() / 8;
                let info = TensorInfo {
                    dtype: e.data.dtype(),
                    shape: e.shape.clone(),
                    data_offsets: (offset, end),
                };
                offset = end;
                (e.name.to_string(), info)
            })
            .collect();
        let metadata = Metadata::new(None, infos).expect("offsets are contiguous");
        let mut json = serde_json::to_vec(&metadata).expect("a metadata map serializes");
        json.resize(json.len().next_multiple_of(8), b' ');
        let mut out = (json.len() as u64).to_le_bytes().to_vec();
        out.extend(json);
        out
    }

    /// Write the file, streamed: the tensors are encoded as they are written.
    fn save(mut self, path: &Path, force: bool) -> Result<()> {
        let header = self.header();
        output_path::write_atomic(path, force, |w| {
            w.write_all(&header)?;
            self.entries.iter().try_for_each(|e| e.data.write_le(w))
        })?;
        Ok(())
    }
}

/// Write an inputs file (the layout's `fragment_indices` only when it has them).
pub fn write_inputs(path: impl AsRef<Path>, inputs: &CallInputs, force: bool) -> Result<()> {
    let mut w = Writer::default();
    let l = &inputs.layout;
    w.add(&CU_Q, Data::I32(l.cu_seqlens_q()))?;
    w.add(&CU_K, Data::I32(l.cu_seqlens_k()))?;
    if let Some(f) = l.fragment_indices() {
        w.add(&FRAGMENTS, Data::I32(f))?;
    }
    w.sizes.bound.extend([
        (Sym::T, l.total_q(), "cu_seqlens_q"),
        (Sym::Tk, l.total_k(), "cu_seqlens_k"),
    ]);
    w.bf16(&Q, Some(&inputs.q))?;
    w.bf16(&K, Some(&inputs.k))?;
    w.bf16(&V, Some(&inputs.v))?;
    w.add(&TOPK, Data::I32(&inputs.topk_indices))?;
    w.bf16(&DOUT, inputs.dout.as_deref())?;
    if let Some(ix) = &inputs.index {
        w.bf16(&QI, Some(&ix.qi))?;
        w.bf16(&KI, Some(&ix.ki))?;
    }
    w.save(path.as_ref(), force)
}

/// Write the present outputs; T and Tk are taken from the tensors and must agree.
pub fn write_outputs(path: impl AsRef<Path>, outputs: &Outputs, force: bool) -> Result<()> {
    let mut w = Writer::default();
    w.bf16(&OUT, outputs.out.as_deref())?;
    if let Some(x) = &outputs.lse {
        w.add(&LSE, Data::F32(x))?;
    }
    w.bf16(&DQ, outputs.dq.as_deref())?;
    w.bf16(&DK, outputs.dk.as_deref())?;
    w.bf16(&DV, outputs.dv.as_deref())?;
    if let Some(x) = &outputs.indexer_topk {
        w.add(&INDEXER_TOPK, Data::I32(x))?;
    }
    if let Some(x) = &outputs.indexer_lse {
        w.add(&INDEXER_LSE, Data::F32(x))?;
    }
    w.bf16(&DQI, outputs.dqi.as_deref())?;
    w.bf16(&DKI, outputs.dki.as_deref())?;
    w.save(path.as_ref(), force)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The streamed writer makes the file the safetensors crate would make, byte for byte.
    #[test]
    fn streamed_files_are_what_safetensors_writes() {
        struct Raw(Dtype, Vec<usize>, Vec<u8>);
        impl safetensors::View for &Raw {
            fn dtype(&self) -> Dtype {
                self.0
            }
            fn shape(&self) -> &[usize] {
                &self.1
            }
            fn data(&self) -> std::borrow::Cow<'_, [u8]> {
                (&self.2[..]).into()
            }
            fn data_len(&self) -> usize {
                self.2.len()
            }
        }
        let (t, tk) = (3, 130);
        let out: Vec<bf16> = (0..t * 8192).map(|i| bf16::from_f32(i as f32)).collect();
        let lse: Vec<f32> = (0..t * 64).map(|i| -(i as f32)).collect();
        let dk: Vec<bf16> = (0..tk * 512)
            .map(|i| bf16::from_f32(0.5 * i as f32))
            .collect();
        let topk: Vec<i32> = (0..4 * t * 16).map(|i| i as i32 % 3 - 1).collect();
        let outputs = Outputs {
            out: Some(out.clone()),
            lse: Some(lse.clone()),
            dk: Some(dk.clone()),
            indexer_topk: Some(topk.clone()),
            ..Outputs::default()
        };
        let path = std::env::temp_dir().join(format!("msa-io-stream-{}", std::process::id()));
        write_outputs(&path, &outputs, true).unwrap();
        let ours = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();

        let raws = [
            ("out", Raw(Dtype::BF16, vec![t, 64, 128], encode(&out))),
            ("lse", Raw(Dtype::F32, vec![t, 64], encode(&lse))),
            ("dk", Raw(Dtype::BF16, vec![tk, 4, 128], encode(&dk))),
            (
                "indexer_topk",
                Raw(Dtype::I32, vec![4, t, 16], encode(&topk)),
            ),
        ];
        let theirs = safetensors::serialize(raws.iter().map(|(n, r)| (*n, r)), None).unwrap();
        assert_eq!(ours, theirs);
    }

    fn encode<E: Element>(xs: &[E]) -> Vec<u8> {
        let mut out = Vec::new();
        E::write_le(xs, &mut out).unwrap();
        out
    }
}
