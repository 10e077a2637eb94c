//! The raw layer (`msa::raw`) on buffers and a stream the test owns (cudarc, as a framework
//! would): prepare (unchecked) + forward + backward on every path are captured into one CUDA
//! graph, the graph is replayed after a new top-k is written into the same selection buffer,
//! and every output is compared with an eager run on that top-k: metadata, forward and the
//! deterministic backward bitwise, the atomic backwards (sm_90a, sm_80) by cosine. The top-k is
//! validated outside the graph (`raw::validate_prepare`). And the facade's device-pointer rule:
//! a buffer of another CUDA context is rejected before any launch.
//!
//! Capture happens after one eager run: the launchers read the device's SM version and count
//! with `cudaDeviceGetAttribute` once per process (`raw::device_kernels` does it too); the sm_90a kernels encode their TMA descriptors on
//! the host at launch (captured by value: replays use the same buffers) and read item counts on
//! the device, so nothing in the captured calls synchronizes or depends on a host value of the
//! selection.

use std::sync::Arc;

use cudarc::driver::sys::{CUdevice_attribute, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, DeviceRepr};
use half::bf16;
use msa::raw::{self, BackwardPath, CallShape, DevSlice, DevSliceMut, Elem, KernelSet, Stream};
use msa::MsaError;
use msa_harness::check::{compare, CheckLine, CheckReport};
use msa_plan::topology::TOPK_BLOCKS;
use msa_plan::VarlenLayout;
use msa_workloads::{make_topk, Inputs, Pattern};
use serde_json::json;

use crate::harness;

/// The test's own context and stream, with event tracking off: one stream orders everything.
struct Device {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
}

impl Device {
    fn new() -> Self {
        let ctx = CudaContext::new(0).expect("device 0");
        // SAFETY: every copy and launch of the test goes through the one stream below.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().expect("stream");
        Self { ctx, stream }
    }

    fn upload<T: DeviceRepr>(&self, host: &[T]) -> CudaSlice<T> {
        self.stream.clone_htod(host).expect("upload")
    }

    fn alloc<T: DeviceRepr>(&self, len: usize) -> CudaSlice<T> {
        // SAFETY: every buffer is written by a launch before it is read.
        unsafe { self.stream.alloc::<T>(len.max(1)) }.expect("alloc")
    }

    fn download<T: DeviceRepr + Default + Clone>(&self, buf: &CudaSlice<T>) -> Vec<T> {
        self.stream.clone_dtoh(buf).expect("download")
    }

    fn raw_stream(&self) -> Stream {
        Stream::from_raw(self.stream.cu_stream().cast())
    }

    fn sm_count(&self) -> usize {
        self.ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .expect("SM count") as usize
    }

    /// The device address of `buf` (event tracking is off: the guard records nothing).
    fn addr<T>(&self, buf: &CudaSlice<T>) -> u64 {
        buf.device_ptr(&self.stream).0
    }

    fn ro<T: Elem>(&self, buf: &CudaSlice<T>, len: usize) -> DevSlice<T> {
        assert!(buf.len() >= len);
        // SAFETY: a live allocation of the test's context holding at least `len` elements.
        unsafe { DevSlice::new(self.addr(buf), len) }
    }

    fn rw<T: Elem>(&self, buf: &CudaSlice<T>, len: usize) -> DevSliceMut<T> {
        assert!(buf.len() >= len);
        // SAFETY: as `ro`; the test orders every use of the buffer on its one stream.
        unsafe { DevSliceMut::new(self.addr(buf), len) }
    }
}

/// Every buffer of one call, allocated once; the graph and the eager runs share them.
struct Call {
    shape: CallShape,
    kernels: KernelSet,
    paths: Vec<BackwardPath>,
    cu_q: CudaSlice<i32>,
    cu_k: CudaSlice<i32>,
    layout_arrays: [CudaSlice<i32>; 4],
    topk: CudaSlice<i32>,
    meta: [CudaSlice<i32>; 12],
    prepare_ws: CudaSlice<u8>,
    /// The forward's validation alone (`raw::prepare_validate`): error word, split counts.
    validated: [CudaSlice<i32>; 2],
    validate_ws: CudaSlice<u8>,
    q: CudaSlice<bf16>,
    k: CudaSlice<bf16>,
    v: CudaSlice<bf16>,
    dout: CudaSlice<bf16>,
    out: CudaSlice<bf16>,
    lse: CudaSlice<f32>,
    forward_ws: CudaSlice<u8>,
    /// Per path: dq, dk, dv and the backward workspace.
    grads: Vec<([CudaSlice<bf16>; 3], CudaSlice<u8>)>,
}

/// What one run leaves: the metadata, the forward and each path's gradients (bits).
#[derive(Clone)]
struct Outputs {
    meta: Vec<Vec<i32>>,
    validated: Vec<Vec<i32>>,
    out: Vec<u16>,
    lse: Vec<f32>,
    grads: Vec<[Vec<u16>; 3]>,
}

const META_NAMES: [&str; 12] = [
    "error_word",
    "row_ptr",
    "q_indices",
    "qsplit",
    "split_counts",
    "scheduler_metadata",
    "work_count",
    "phys_row_ptr",
    "phys_q_indices",
    "phys_valid",
    "document_workspace_starts",
    "query_offsets",
];

impl Call {
    fn new(d: &Device, layout: &VarlenLayout, kernels: KernelSet) -> Self {
        let shape = CallShape::from_layout(layout, d.sm_count()).expect("shape");
        let s = shape.sizes().clone();
        let inputs = Inputs::generate(layout, 0x6EA9);
        let mut paths = vec![BackwardPath::Sm80Atomic, BackwardPath::Sm80Deterministic];
        if kernels == KernelSet::Sm90a {
            paths.splice(0..0, [BackwardPath::Sm90, BackwardPath::Deterministic]);
        }
        let cu_q = d.upload(layout.cu_seqlens_q());
        let cu_k = d.upload(layout.cu_seqlens_k());
        let frag = layout.fragment_indices().map(|f| d.upload(f));
        let layout_arrays = [
            d.alloc(s.batch),
            d.alloc(s.query_fragment),
            d.alloc(s.block_keys),
            d.alloc(s.block_keys),
        ];
        // The layout is built once, eagerly (a framework does it once per batch).
        {
            let mut out = raw::LayoutOutputs {
                fragment_first: d.rw(&layout_arrays[0], s.batch),
                query_fragment: d.rw(&layout_arrays[1], s.query_fragment),
                block_key_start: d.rw(&layout_arrays[2], s.block_keys),
                block_key_count: d.rw(&layout_arrays[3], s.block_keys),
            };
            let frag = frag.as_ref().map(|f| d.ro(f, s.batch));
            // SAFETY: live buffers of the test's context with the shape's sizes, its stream;
            // the cu_seqlens are the validated host layout's.
            unsafe {
                raw::build_layout(
                    &shape,
                    d.ro(&cu_q, s.cu_seqlens),
                    d.ro(&cu_k, s.cu_seqlens),
                    frag,
                    &mut out,
                    d.raw_stream(),
                )
            }
            .expect("build_layout");
        }
        d.ctx.bind_to_thread().expect("bind");
        let prepare_bytes = raw::prepare_workspace_bytes(&shape).expect("bytes");
        let meta_lens = [
            s.error_word,
            s.row_ptr,
            s.selection,
            s.selection,
            s.split_counts,
            s.scheduler_metadata,
            s.work_count,
            s.phys_row_ptr,
            s.selection,
            s.selection,
            s.batch,
            s.batch,
        ];
        let grads = paths
            .iter()
            .map(|&p| {
                let g = [d.alloc(s.queries), d.alloc(s.keys), d.alloc(s.keys)];
                (g, d.alloc(s.backward_workspace_bytes(p)))
            })
            .collect();
        Self {
            meta: meta_lens.map(|n| d.alloc(n)),
            prepare_ws: d.alloc(prepare_bytes),
            validated: [d.alloc(s.error_word), d.alloc(s.split_counts)],
            validate_ws: d.alloc(raw::VALIDATE_WORKSPACE_BYTES),
            topk: d.alloc(s.selection),
            q: d.upload(&inputs.q),
            k: d.upload(&inputs.k),
            v: d.upload(&inputs.v),
            dout: d.upload(&inputs.dout),
            out: d.alloc(s.queries),
            lse: d.alloc(s.query_heads),
            forward_ws: d.alloc(s.forward_workspace_bytes(kernels)),
            grads,
            cu_q,
            cu_k,
            layout_arrays,
            shape,
            kernels,
            paths,
        }
    }

    /// Write a selection into the one top-k buffer (stream-ordered).
    fn write_topk(&mut self, d: &Device, topk: &[i32]) {
        d.stream
            .memcpy_htod(topk, &mut self.topk)
            .expect("write topk");
    }

    fn layout(&self, d: &Device) -> raw::Layout {
        let s = self.shape.sizes();
        let [ff, qf, ks, kc] = &self.layout_arrays;
        raw::Layout {
            cu_seqlens_q: d.ro(&self.cu_q, s.cu_seqlens),
            cu_seqlens_k: d.ro(&self.cu_k, s.cu_seqlens),
            fragment_first: d.ro(ff, s.batch),
            query_fragment: d.ro(qf, s.query_fragment),
            block_key_start: d.ro(ks, s.block_keys),
            block_key_count: d.ro(kc, s.block_keys),
        }
    }

    fn prepare_outputs(&self, d: &Device) -> raw::PrepareOutputs {
        let s = self.shape.sizes();
        let m = &self.meta;
        raw::PrepareOutputs {
            error_word: d.rw(&m[0], s.error_word),
            row_ptr: d.rw(&m[1], s.row_ptr),
            q_indices: d.rw(&m[2], s.selection),
            qsplit: d.rw(&m[3], s.selection),
            split_counts: d.rw(&m[4], s.split_counts),
            scheduler_metadata: d.rw(&m[5], s.scheduler_metadata),
            work_count: d.rw(&m[6], s.work_count),
            phys_row_ptr: d.rw(&m[7], s.phys_row_ptr),
            phys_q_indices: d.rw(&m[8], s.selection),
            phys_valid: d.rw(&m[9], s.selection),
            document_workspace_starts: d.rw(&m[10], s.batch),
            query_offsets: d.rw(&m[11], s.batch),
        }
    }

    /// The forward's validation, prepare (unchecked) + forward + the backward of every path,
    /// enqueued on the test's stream with no host synchronization: the sequence the graph
    /// captures.
    fn enqueue(&self, d: &Device) -> msa::Result<()> {
        let s = self.shape.sizes();
        let stream = d.raw_stream();
        let layout = self.layout(d);
        let topk = d.ro(&self.topk, s.selection);
        let mut prep = self.prepare_outputs(d);
        let meta = prep.metadata(topk);
        let (q, k, v) = (
            d.ro(&self.q, s.queries),
            d.ro(&self.k, s.keys),
            d.ro(&self.v, s.keys),
        );
        let mut fwd = raw::ForwardOutputs {
            out: d.rw(&self.out, s.queries),
            lse: d.rw(&self.lse, s.query_heads),
        };
        let prepare_ws = d.rw(&self.prepare_ws, self.prepare_ws.len());
        let validate_ws = d.rw(&self.validate_ws, self.validate_ws.len());
        let mut validated = raw::ValidateOutputs {
            error_word: d.rw(&self.validated[0], s.error_word),
            split_counts: d.rw(&self.validated[1], s.split_counts),
        };
        let forward_ws = d.rw(&self.forward_ws, self.forward_ws.len());
        // SAFETY: every view is a live buffer of the test's context with the shape's sizes, the
        // stream is the test's; the selection is valid (checked after each run).
        unsafe {
            raw::prepare_validate(
                &self.shape,
                &layout,
                topk,
                &mut validated,
                validate_ws,
                stream,
            )?;
            raw::prepare(&self.shape, &layout, topk, &mut prep, prepare_ws, stream)?;
            let inputs = raw::AttentionInputs { q, k, v };
            raw::forward(
                &self.shape,
                &layout,
                meta.topk,
                &inputs,
                &mut fwd,
                self.kernels,
                forward_ws,
                stream,
            )?;
            let binputs = raw::BackwardInputs {
                q,
                k,
                v,
                dout: d.ro(&self.dout, s.queries),
                out: fwd.out.as_slice(),
                lse: fwd.lse.as_slice(),
            };
            for (&path, ([dq, dk, dv], ws)) in self.paths.iter().zip(&self.grads) {
                let mut grads = raw::Gradients {
                    dq: d.rw(dq, s.queries),
                    dk: d.rw(dk, s.keys),
                    dv: d.rw(dv, s.keys),
                };
                let ws = d.rw(ws, ws.len());
                raw::backward(
                    &self.shape,
                    &layout,
                    &meta,
                    &binputs,
                    &mut grads,
                    path,
                    ws,
                    stream,
                )?;
            }
        }
        Ok(())
    }

    /// The explicit check of the selection, outside any capture.
    fn validate(&self, d: &Device) -> msa::Result<()> {
        // SAFETY: the error word of this call on the test's stream (not capturing).
        unsafe { raw::validate_prepare(&self.shape, d.ro(&self.meta[0], 4), d.raw_stream()) }
    }

    fn outputs(&self, d: &Device) -> Outputs {
        let s = self.shape.sizes();
        let bits = |b: &CudaSlice<bf16>, n: usize| -> Vec<u16> {
            d.download(b)[..n].iter().map(|x| x.to_bits()).collect()
        };
        Outputs {
            meta: self.meta.iter().map(|m| d.download(m)).collect(),
            validated: self.validated.iter().map(|m| d.download(m)).collect(),
            out: bits(&self.out, s.queries),
            lse: d.download(&self.lse)[..s.query_heads].to_vec(),
            grads: self
                .grads
                .iter()
                .map(|([dq, dk, dv], _)| [bits(dq, s.queries), bits(dk, s.keys), bits(dv, s.keys)])
                .collect(),
        }
    }
}

fn line(tensor: String, passed: bool, detail: String) -> CheckLine {
    CheckLine {
        tensor,
        metric: "equal",
        value: if passed { 0.0 } else { 1.0 },
        limit: 0.0,
        passed,
        detail: if passed { String::new() } else { detail },
    }
}

fn f32s(bits: &[u16]) -> Vec<f32> {
    bits.iter().map(|&b| bf16::from_bits(b).to_f32()).collect()
}

/// The replay against the eager run: metadata, forward and deterministic gradients bitwise,
/// atomic gradients by cosine (fp32 atomics reduce in arrival order); and the replay's
/// validation against its prepare, whose error word and split counts it must equal.
fn compare_runs(call: &Call, replay: &Outputs, eager: &Outputs, prefix: &str) -> CheckReport {
    let mut r = CheckReport::default();
    for (name, (a, e)) in META_NAMES.iter().zip(replay.meta.iter().zip(&eager.meta)) {
        r.push(compare::exact(&format!("{prefix}/{name}"), a, e));
    }
    for (name, a) in ["error_word", "split_counts"].iter().zip(&replay.validated) {
        let m = META_NAMES
            .iter()
            .position(|n| n == name)
            .expect("a metadata tensor");
        r.push(compare::exact(
            &format!("{prefix}/validate/{name}"),
            a,
            &replay.meta[m],
        ));
    }
    r.push(compare::bitwise(
        &format!("{prefix}/out"),
        &replay.out,
        &eager.out,
    ));
    let lse_bits = |x: &[f32]| -> Vec<i32> { x.iter().map(|v| v.to_bits() as i32).collect() };
    r.push(compare::exact(
        &format!("{prefix}/lse_bits"),
        &lse_bits(&replay.lse),
        &lse_bits(&eager.lse),
    ));
    for (i, path) in call.paths.iter().enumerate() {
        for (g, name) in ["dq", "dk", "dv"].iter().enumerate() {
            let tensor = format!("{prefix}/{path:?}/{name}");
            let (a, e) = (&replay.grads[i][g], &eager.grads[i][g]);
            r.push(match path {
                BackwardPath::Deterministic | BackwardPath::Sm80Deterministic => {
                    compare::bitwise(&tensor, a, e)
                }
                _ => compare::attention_grad_cosine(&tensor, &f32s(a), &f32s(e), 0.99999),
            });
        }
    }
    r
}

fn graph_case(name: &str, layout: &VarlenLayout) -> CheckReport {
    let d = Device::new();
    // The first raw call of the process reads (and caches) the device's SM version and count.
    let kernels = raw::device_kernels().expect("device kernels");
    let mut call = Call::new(&d, layout, kernels);
    let first = make_topk(layout, Pattern::Recent16, 1);
    // Random blocks with the first non-local entry of every row dropped (a valid -1 hole): on
    // short documents a random choice can be the whole causal prefix, i.e. recent16 itself.
    let mut second = make_topk(layout, Pattern::Random, 2);
    for row in second.chunks_mut(TOPK_BLOCKS) {
        let local = row.iter().rposition(|&e| e >= 0);
        if let Some(slot) = row
            .iter()
            .position(|&e| e >= 0)
            .filter(|&s| Some(s) != local)
        {
            row[slot] = -1;
        }
    }
    let mut report = CheckReport::default();
    report.push(line(
        format!("{name}/selections_differ"),
        first != second,
        "the two selections are equal".into(),
    ));

    // Eager on the first selection (also the warm-up before capture).
    call.write_topk(&d, &first);
    call.enqueue(&d).expect("eager run on the first selection");
    call.validate(&d).expect("first selection is valid");
    d.stream.synchronize().unwrap();
    let eager_first = call.outputs(&d);

    // Capture prepare + forward + every backward.
    d.stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL)
        .expect("begin capture");
    let enqueued = call.enqueue(&d);
    let graph = d.stream.end_capture(CUgraphInstantiate_flags(0));
    let graph = match (enqueued, graph) {
        (Ok(()), Ok(Some(graph))) => graph,
        (enqueued, graph) => {
            report.push(line(
                format!("{name}/capture"),
                false,
                format!(
                    "raw calls under capture: {:?}; end_capture: {:?}",
                    enqueued.err(),
                    graph.map(|g| g.is_some())
                ),
            ));
            return report;
        }
    };

    // Replay with the second selection written into the same buffer, check it, then eager.
    call.write_topk(&d, &second);
    graph.launch().expect("graph launch");
    let valid = call.validate(&d);
    report.push(line(
        format!("{name}/validate_after_replay"),
        valid.is_ok(),
        format!("{valid:?}"),
    ));
    let replay_second = call.outputs(&d);
    call.enqueue(&d).expect("eager run on the second selection");
    call.validate(&d).expect("second selection is valid");
    let eager_second = call.outputs(&d);
    report.extend(compare_runs(&call, &replay_second, &eager_second, "second"));
    report.push(line(
        format!("{name}/replay_follows_the_new_topk"),
        replay_second.out != eager_first.out,
        "the replay's out equals the first selection's".into(),
    ));

    // And back: a second replay on the first selection equals the first eager run.
    call.write_topk(&d, &first);
    graph.launch().expect("graph relaunch");
    call.validate(&d).expect("first selection is valid");
    let replay_first = call.outputs(&d);
    report.extend(compare_runs(&call, &replay_first, &eager_first, "first"));
    report
}

/// Prepare + forward + backward (every path this device runs) captured through the raw layer
/// and replayed with a new top-k in the same buffer: equal to eager runs. A CP layout of the
/// edge set (fragments sharing blocks) and a real CP16 rank of the dev set.
#[test]
fn raw_calls_replay_from_a_cuda_graph_with_a_new_topk() {
    let mut cases: Vec<(String, VarlenLayout)> = harness::edge_layouts()
        .into_iter()
        .filter(|(n, _)| n == "cp_fragments" || n == "odd_lengths")
        .collect();
    cases.extend(crate::prepare::dev_layouts().take(1));
    let mut failed = Vec::new();
    for (name, layout) in &cases {
        let report = graph_case(name, layout);
        if !report.passed() {
            failed.push(name.clone());
        }
        harness::record_soft(
            "raw_graph_replay",
            name,
            &report,
            json!({ "T": layout.total_q(), "B": layout.batch() }),
        );
    }
    assert!(failed.is_empty(), "failed: {failed:?}");
}

/// The facade rejects a buffer of another CUDA context (another `CudaMsa`) with a typed error
/// before any launch, and accepts its own.
#[test]
fn facade_rejects_buffers_of_another_context() {
    let msa = harness::open_device();
    let other = harness::open_device();
    let layout = VarlenLayout::documents(&[0, 200]).unwrap();
    let dl = Arc::new(msa::cuda::DeviceLayout::new(&msa, layout.clone()).unwrap());
    let meta = msa
        .prepare(
            &dl,
            msa.upload(&make_topk(&layout, Pattern::Recent16, 1))
                .unwrap(),
        )
        .unwrap();
    let inputs = Inputs::generate(&layout, 7);
    let (q, k, v) = (
        msa.upload(&inputs.q).unwrap(),
        msa.upload(&inputs.k).unwrap(),
        msa.upload(&inputs.v).unwrap(),
    );
    let foreign_k = other.upload(&inputs.k).unwrap();
    let mut report = CheckReport::default();
    let err = msa.forward(&meta, &q, &foreign_k, &v).err();
    report.push(line(
        "forward/foreign_k".into(),
        matches!(err, Some(MsaError::ForeignContext { name: "k" })),
        format!("got {err:?}"),
    ));
    let own = msa.forward(&meta, &q, &k, &v).map(|_| ());
    report.push(line(
        "forward/own_buffers".into(),
        own.is_ok(),
        format!("got {own:?}"),
    ));
    let foreign_layout = msa::cuda::DeviceLayout::new(&other, layout.clone()).unwrap();
    let err = msa.indexer_forward(&foreign_layout, &q, &k).err();
    report.push(line(
        "indexer/foreign_layout".into(),
        matches!(err, Some(MsaError::ForeignContext { .. })),
        format!("got {err:?}"),
    ));
    harness::record(
        "facade_foreign_context",
        "documents_200",
        &report,
        json!({}),
    );
}
