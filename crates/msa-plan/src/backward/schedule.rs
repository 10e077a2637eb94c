//! `MsaBackwardSchedule` (docs/contract.md §5.1): the forward-derived int32 metadata the backward
//! task build reads. Shapes are checked once, here, with NeMo's messages, so every consumer can
//! take the schedule as given. Types are int32 by construction (`Vec<i32>`).
//!
//! msa-rs extension: `query_offsets [documents]`, the `k_len − q_len` of each fragment, added to
//! `task_qpos` so a fragment's queries keep their document positions (0 for plain documents).

use crate::csr::K2qCsr;
use crate::error::{PlanError, Result};
use crate::layout::VarlenLayout;
use crate::schedule::{WorkItem, WorkTable, WORK_WORDS};
use crate::topology::NUM_INDEX_HEADS;

/// A flat int32 array with its shape (row-major), as a tensor arrives from a caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Int32Array {
    pub data: Vec<i32>,
    pub shape: Vec<usize>,
}

impl Int32Array {
    /// An array of the given shape over `data` (the element count is checked by the schedule).
    pub fn new(data: Vec<i32>, shape: &[usize]) -> Self {
        Self {
            data,
            shape: shape.to_vec(),
        }
    }

    /// A 1-D array.
    pub fn vector(data: Vec<i32>) -> Self {
        let n = data.len();
        Self::new(data, &[n])
    }

    /// The shape as Python prints a tuple: `(4, 3)`, `(5,)`, `()`.
    fn shape_tuple(&self) -> String {
        match self.shape.as_slice() {
            [one] => format!("({one},)"),
            dims => {
                let parts: Vec<String> = dims.iter().map(usize::to_string).collect();
                format!("({})", parts.join(", "))
            }
        }
    }
}

/// The tensors of a schedule, before validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleParts {
    /// `[4, rows + 1]`, rows + 1 >= 2.
    pub row_ptr: Int32Array,
    /// `[4, edge_capacity]`, edge_capacity >= 1: document-local queries.
    pub q_indices: Int32Array,
    /// `[work_capacity, 6]`, work_capacity >= 1.
    pub scheduler_metadata: Int32Array,
    /// `[1]`.
    pub work_count: Int32Array,
    /// `[documents + 1]`, numel >= 2.
    pub cu_seqlens: Int32Array,
    /// `[documents]`: 128-aligned workspace row of each document.
    pub document_workspace_starts: Int32Array,
    /// `[documents]` or `None` (all zero).
    pub query_offsets: Option<Int32Array>,
}

/// Forward-derived backward metadata, shape-checked once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MsaBackwardSchedule {
    row_ptr: Vec<i32>,
    q_indices: Vec<i32>,
    scheduler_metadata: Vec<i32>,
    work_count: i32,
    cu_seqlens: Vec<i32>,
    document_workspace_starts: Vec<i32>,
    query_offsets: Vec<i32>,
    rows: usize,
    edge_capacity: usize,
    work_capacity: usize,
}

fn shape_error(name: &'static str, layout: &str, got: &Int32Array) -> PlanError {
    PlanError::Shape {
        name,
        expected: layout.to_string(),
        got: got.shape_tuple(),
    }
}

/// NeMo's shape check of one tensor plus the element count of its flat data.
fn check(name: &'static str, layout: &str, a: &Int32Array, ok: bool) -> Result<()> {
    if !ok {
        return Err(shape_error(name, layout, a));
    }
    let numel: usize = a.shape.iter().product();
    if a.data.len() != numel {
        return Err(PlanError::Shape {
            name,
            expected: format!("{} ({numel} values)", a.shape_tuple()),
            got: format!("{} values", a.data.len()),
        });
    }
    Ok(())
}

impl MsaBackwardSchedule {
    /// Validate every shape in NeMo's order and with NeMo's messages, then own the data.
    pub fn new(parts: ScheduleParts) -> Result<Self> {
        let ScheduleParts {
            row_ptr,
            q_indices,
            scheduler_metadata,
            work_count,
            cu_seqlens,
            document_workspace_starts,
            query_offsets,
        } = parts;
        let s = |a: &Int32Array| a.shape.clone();
        let rp = s(&row_ptr);
        check(
            "row_ptr",
            "[4, rows + 1]",
            &row_ptr,
            rp.len() == 2 && rp[0] == NUM_INDEX_HEADS && rp[1] >= 2,
        )?;
        let qi = s(&q_indices);
        check(
            "q_indices",
            "[4, edge_capacity]",
            &q_indices,
            qi.len() == 2 && qi[0] == NUM_INDEX_HEADS && qi[1] >= 1,
        )?;
        let sm = s(&scheduler_metadata);
        check(
            "scheduler_metadata",
            "[work_capacity, 6]",
            &scheduler_metadata,
            sm.len() == 2 && sm[1] == WORK_WORDS && sm[0] >= 1,
        )?;
        check("work_count", "[1]", &work_count, work_count.shape == [1])?;
        let cu = s(&cu_seqlens);
        check(
            "cu_seqlens",
            "[documents + 1]",
            &cu_seqlens,
            cu.len() == 1 && cu[0] >= 2,
        )?;
        let documents = cu[0] - 1;
        check(
            "document_workspace_starts",
            "[documents]",
            &document_workspace_starts,
            document_workspace_starts.shape == [documents],
        )?;
        let query_offsets = match query_offsets {
            Some(q) => {
                check("query_offsets", "[documents]", &q, q.shape == [documents])?;
                q.data
            }
            None => vec![0; documents],
        };
        Ok(Self {
            row_ptr: row_ptr.data,
            q_indices: q_indices.data,
            scheduler_metadata: scheduler_metadata.data,
            work_count: work_count.data[0],
            cu_seqlens: cu_seqlens.data,
            document_workspace_starts: document_workspace_starts.data,
            query_offsets,
            rows: rp[1] - 1,
            edge_capacity: qi[1],
            work_capacity: sm[0],
        })
    }

    /// The schedule of one planned call: k2q CSR, work items in a `[work_capacity, 6]` table, and
    /// per fragment `cu_seqlens_q`, its document's workspace start and its query offset.
    pub fn from_plan(
        layout: &VarlenLayout,
        csr: &K2qCsr,
        items: &[WorkItem],
        work_capacity: usize,
    ) -> Result<Self> {
        let table = WorkTable::new(items, work_capacity)?;
        let frags = layout.fragments();
        let docs = frags.len();
        Self::new(ScheduleParts {
            row_ptr: Int32Array::new(csr.row_ptr.clone(), &[NUM_INDEX_HEADS, csr.rows + 1]),
            q_indices: Int32Array::new(
                csr.q_indices.clone(),
                &[NUM_INDEX_HEADS, csr.edge_capacity()],
            ),
            scheduler_metadata: Int32Array::new(
                table.scheduler_metadata,
                &[work_capacity, WORK_WORDS],
            ),
            work_count: Int32Array::vector(vec![table.work_count]),
            cu_seqlens: Int32Array::vector(layout.cu_seqlens_q().to_vec()),
            document_workspace_starts: Int32Array::new(
                frags.iter().map(|f| f.workspace_start() as i32).collect(),
                &[docs],
            ),
            query_offsets: Some(Int32Array::new(
                frags.iter().map(|f| f.query_offset() as i32).collect(),
                &[docs],
            )),
        })
    }

    /// `[4, rows + 1]` CSR row offsets.
    pub fn row_ptr(&self) -> &[i32] {
        &self.row_ptr
    }
    /// `[4, edge_capacity]` document-local queries.
    pub fn q_indices(&self) -> &[i32] {
        &self.q_indices
    }
    /// `[work_capacity, 6]` work items; rows past `work_count` are not read.
    pub fn scheduler_metadata(&self) -> &[i32] {
        &self.scheduler_metadata
    }
    /// The stored `work_count[0]` (the task build clamps it to `[0, work_capacity]`).
    pub fn work_count(&self) -> i32 {
        self.work_count
    }
    /// `[documents + 1]` compact document (fragment) offsets.
    pub fn cu_seqlens(&self) -> &[i32] {
        &self.cu_seqlens
    }
    /// `[documents]` workspace row where each document (fragment's document) starts.
    pub fn document_workspace_starts(&self) -> &[i32] {
        &self.document_workspace_starts
    }
    /// `[documents]` position of each fragment's first query in its document.
    pub fn query_offsets(&self) -> &[i32] {
        &self.query_offsets
    }
    /// CSR rows per head.
    pub fn rows(&self) -> usize {
        self.rows
    }
    /// Edge slots per head.
    pub fn edge_capacity(&self) -> usize {
        self.edge_capacity
    }
    /// Rows of `scheduler_metadata`.
    pub fn work_capacity(&self) -> usize {
        self.work_capacity
    }
    /// Documents (fragments).
    pub fn documents(&self) -> usize {
        self.document_workspace_starts.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts() -> ScheduleParts {
        ScheduleParts {
            row_ptr: Int32Array::new(vec![0; 8], &[4, 2]),
            q_indices: Int32Array::new(vec![-1; 4], &[4, 1]),
            scheduler_metadata: Int32Array::new(vec![0; 6], &[1, 6]),
            work_count: Int32Array::vector(vec![0]),
            cu_seqlens: Int32Array::vector(vec![0, 1]),
            document_workspace_starts: Int32Array::vector(vec![0]),
            query_offsets: None,
        }
    }

    #[test]
    fn minimal_schedule_is_accepted() {
        let s = MsaBackwardSchedule::new(parts()).unwrap();
        assert_eq!(
            (
                s.rows(),
                s.edge_capacity(),
                s.work_capacity(),
                s.documents()
            ),
            (1, 1, 1, 1)
        );
        assert_eq!(s.query_offsets(), &[0]);
    }

    /// Breaks one tensor of valid parts.
    type Mutation = fn(&mut ScheduleParts);

    #[test]
    fn nemo_messages_for_each_tensor() {
        let cases: [(Mutation, &str); 11] = [
            (
                |p| p.row_ptr = Int32Array::new(vec![0; 4], &[4, 1]),
                "row_ptr must have shape [4, rows + 1], got (4, 1)",
            ),
            (
                |p| p.row_ptr = Int32Array::new(vec![0; 6], &[3, 2]),
                "row_ptr must have shape [4, rows + 1], got (3, 2)",
            ),
            (
                |p| p.q_indices = Int32Array::new(vec![], &[4, 0]),
                "q_indices must have shape [4, edge_capacity], got (4, 0)",
            ),
            (
                |p| p.scheduler_metadata = Int32Array::new(vec![0; 5], &[1, 5]),
                "scheduler_metadata must have shape [work_capacity, 6], got (1, 5)",
            ),
            (
                |p| p.scheduler_metadata = Int32Array::new(vec![], &[0, 6]),
                "scheduler_metadata must have shape [work_capacity, 6], got (0, 6)",
            ),
            (
                |p| p.work_count = Int32Array::new(vec![0], &[]),
                "work_count must have shape [1], got ()",
            ),
            (
                |p| p.cu_seqlens = Int32Array::vector(vec![0]),
                "cu_seqlens must have shape [documents + 1], got (1,)",
            ),
            (
                |p| p.cu_seqlens = Int32Array::new(vec![0, 1], &[1, 2]),
                "cu_seqlens must have shape [documents + 1], got (1, 2)",
            ),
            (
                |p| p.document_workspace_starts = Int32Array::vector(vec![0, 0]),
                "document_workspace_starts must have shape [documents], got (2,)",
            ),
            (
                |p| p.query_offsets = Some(Int32Array::vector(vec![])),
                "query_offsets must have shape [documents], got (0,)",
            ),
            (
                |p| p.row_ptr = Int32Array::new(vec![0; 7], &[4, 2]),
                "row_ptr must have shape (4, 2) (8 values), got 7 values",
            ),
        ];
        for (mutate, msg) in cases {
            let mut p = parts();
            mutate(&mut p);
            assert_eq!(MsaBackwardSchedule::new(p).unwrap_err().to_string(), msg);
        }
    }
}
