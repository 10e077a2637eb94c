//! safetensors I/O (`msa_harness::io`): round trips, a file built byte by byte without msa-rs or the
//! safetensors crate, and every rejection.

mod fixture;

use fixture::{encode, i32_bytes};
use std::path::{Path, PathBuf};

use half::bf16;
use msa_harness::io::{
    read_inputs, read_outputs, write_inputs, write_outputs, CallInputs, Outputs, TensorFileError,
};
use msa_harness::output_path::{self, OutputError};
use msa_plan::VarlenLayout;
use msa_workloads::{make_topk, Inputs, Pattern};

/// A fresh path under the target's scratch directory.
fn tmp(name: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("io_file-{name}.safetensors"));
    let _ = std::fs::remove_file(&p);
    p
}

fn ramp(n: usize, step: f32) -> Vec<bf16> {
    (0..n)
        .map(|i| bf16::from_f32((i % 251) as f32 * step - 1.0))
        .collect()
}

// ---- an independent safetensors encoder -------------------------------------------------------

/// (name, dtype, shape, little-endian bytes)
type Raw = (String, &'static str, Vec<usize>, Vec<u8>);

fn bf16_bytes(x: &[bf16]) -> Vec<u8> {
    x.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect()
}

// T = 5 queries in two fragments of one document over Tk = 7 packed keys (B = 2).
const CU_Q: [i32; 3] = [0, 2, 5];
const CU_K: [i32; 3] = [0, 4, 7];
const FRAGS: [i32; 2] = [0, 0];
const T: usize = 5;
const TK: usize = 7;

fn topk() -> Vec<i32> {
    (0..4 * T * 16)
        .map(|i| if i % 16 == 0 { 0 } else { -1 })
        .collect()
}

fn base() -> Vec<Raw> {
    vec![
        (
            "q".into(),
            "BF16",
            vec![T, 64, 128],
            bf16_bytes(&ramp(T * 8192, 0.01)),
        ),
        (
            "k".into(),
            "BF16",
            vec![TK, 4, 128],
            bf16_bytes(&ramp(TK * 512, 0.02)),
        ),
        (
            "v".into(),
            "BF16",
            vec![TK, 4, 128],
            bf16_bytes(&ramp(TK * 512, 0.03)),
        ),
        (
            "topk_indices".into(),
            "I32",
            vec![4, T, 16],
            i32_bytes(&topk()),
        ),
        ("cu_seqlens_q".into(), "I32", vec![3], i32_bytes(&CU_Q)),
        ("cu_seqlens_k".into(), "I32", vec![3], i32_bytes(&CU_K)),
        ("fragment_indices".into(), "I32", vec![2], i32_bytes(&FRAGS)),
        (
            "dout".into(),
            "BF16",
            vec![T, 64, 128],
            bf16_bytes(&ramp(T * 8192, 0.04)),
        ),
    ]
}

/// `base()` with tensor `name` replaced (or added) as given, or removed when `raw` is None.
fn with(name: &str, raw: Option<(&'static str, Vec<usize>, Vec<u8>)>) -> Vec<Raw> {
    let mut t: Vec<Raw> = base().into_iter().filter(|r| r.0 != name).collect();
    if let Some((dtype, shape, bytes)) = raw {
        t.push((name.into(), dtype, shape, bytes));
    }
    t
}

fn read_err(name: &str, tensors: &[Raw]) -> String {
    let path = tmp(name);
    std::fs::write(&path, encode(tensors)).unwrap();
    read_inputs(&path).unwrap_err().to_string()
}

// ---- tests -------------------------------------------------------------------------------------

#[test]
fn hand_built_file_reads_back() {
    let path = tmp("hand-built");
    std::fs::write(&path, encode(&base())).unwrap();
    let f = read_inputs(&path).unwrap();
    assert_eq!(
        f.layout,
        VarlenLayout::new(&CU_Q, &CU_K, Some(&FRAGS)).unwrap()
    );
    assert_eq!(f.q, ramp(T * 8192, 0.01));
    assert_eq!(f.k, ramp(TK * 512, 0.02));
    assert_eq!(f.v, ramp(TK * 512, 0.03));
    assert_eq!(f.topk_indices, topk());
    assert_eq!(f.dout, Some(ramp(T * 8192, 0.04)));
    assert_eq!(f.index, None);
}

#[test]
fn generated_inputs_round_trip() {
    let layout = VarlenLayout::new(&CU_Q, &CU_K, Some(&FRAGS)).unwrap();
    let topk = make_topk(&layout, Pattern::Recent16, 1);
    let file = CallInputs::generated(layout.clone(), Inputs::generate(&layout, 1), topk);
    let path = tmp("generated");
    write_inputs(&path, &file, false).unwrap();
    assert_eq!(read_inputs(&path).unwrap(), file);

    // Without the optional tensors, and without fragment_indices.
    let minimal = CallInputs {
        layout: VarlenLayout::documents(&[0, 3, 5]).unwrap(),
        dout: None,
        index: None,
        k: ramp(5 * 512, 0.5),
        v: ramp(5 * 512, 0.25),
        ..file
    };
    let path = tmp("minimal");
    write_inputs(&path, &minimal, false).unwrap();
    let back = read_inputs(&path).unwrap();
    assert_eq!(back.layout.fragment_indices(), None);
    assert_eq!(back, minimal);
}

#[test]
fn written_file_has_the_safetensors_layout() {
    // Parse the writer's output by hand: header length, JSON header, little-endian data.
    let out = Outputs {
        lse: Some(vec![-1.5; T * 64]),
        indexer_topk: Some(topk()),
        ..Outputs::default()
    };
    let path = tmp("layout");
    write_outputs(&path, &out, false).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let data = &bytes[8 + n..];
    let lse = &header["lse"];
    assert_eq!(lse["dtype"], "F32");
    assert_eq!(lse["shape"], serde_json::json!([T, 64]));
    let (b, e) = (
        lse["data_offsets"][0].as_u64().unwrap() as usize,
        lse["data_offsets"][1].as_u64().unwrap() as usize,
    );
    assert_eq!(
        &data[b..e],
        (0..T * 64)
            .flat_map(|_| (-1.5f32).to_le_bytes())
            .collect::<Vec<_>>()
    );
    let ix = &header["indexer_topk"];
    assert_eq!(
        (ix["dtype"].as_str(), &ix["shape"]),
        (Some("I32"), &serde_json::json!([4, T, 16]))
    );
    let (b, e) = (
        ix["data_offsets"][0].as_u64().unwrap() as usize,
        ix["data_offsets"][1].as_u64().unwrap() as usize,
    );
    assert_eq!(&data[b..e], i32_bytes(&topk()));
}

#[test]
fn outputs_round_trip() {
    let full = Outputs {
        out: Some(ramp(T * 8192, 0.1)),
        lse: Some((0..T * 64).map(|i| i as f32 * 0.5).collect()),
        dq: Some(ramp(T * 8192, 0.2)),
        dk: Some(ramp(TK * 512, 0.3)),
        dv: Some(ramp(TK * 512, 0.4)),
        indexer_topk: Some(topk()),
        indexer_lse: Some(vec![f32::NEG_INFINITY; 4 * T]),
        dqi: Some(ramp(T * 512, 0.5)),
        dki: Some(ramp(TK * 128, 0.6)),
    };
    let path = tmp("outputs");
    write_outputs(&path, &full, false).unwrap();
    assert_eq!(read_outputs(&path).unwrap(), full);

    let fwd = Outputs {
        out: full.out.clone(),
        lse: full.lse.clone(),
        ..Outputs::default()
    };
    let path = tmp("outputs-fwd");
    write_outputs(&path, &fwd, false).unwrap();
    assert_eq!(read_outputs(&path).unwrap(), fwd);
}

#[test]
fn existing_files_are_overwritten_only_with_force() {
    let path = tmp("exists");
    let first = Outputs {
        lse: Some(vec![1.0; 64]),
        ..Outputs::default()
    };
    let second = Outputs {
        lse: Some(vec![2.0; 64]),
        ..Outputs::default()
    };
    write_outputs(&path, &first, false).unwrap();
    let e = write_outputs(&path, &second, false).unwrap_err();
    assert!(
        matches!(e, TensorFileError::Output(OutputError::Exists { .. })),
        "{e}"
    );
    assert!(
        e.to_string()
            .ends_with("io_file-exists.safetensors already exists (overwrite it with force)"),
        "{e}"
    );
    assert_eq!(
        read_outputs(&path).unwrap(),
        first,
        "the refused write leaves the file alone"
    );
    write_outputs(&path, &second, true).unwrap();
    assert_eq!(read_outputs(&path).unwrap(), second);

    // A rejected write leaves no file behind.
    let path = tmp("rejected");
    let bad = Outputs {
        lse: Some(vec![0.0; 63]),
        ..Outputs::default()
    };
    assert!(write_outputs(&path, &bad, false).is_err());
    assert!(!path.exists());
}

#[test]
fn missing_wrong_dtype_and_wrong_shape_are_named() {
    assert_eq!(
        read_err("missing", &with("v", None)),
        "tensor `v` is missing"
    );
    assert_eq!(
        read_err(
            "dtype",
            &with(
                "topk_indices",
                Some(("F32", vec![4, T, 16], i32_bytes(&topk())))
            )
        ),
        "tensor `topk_indices` must be I32, got F32"
    );
    assert_eq!(
        read_err(
            "shape",
            &with(
                "k",
                Some(("BF16", vec![TK / 7, 8, 128], bf16_bytes(&ramp(1024, 0.1))))
            )
        ),
        "tensor `k` must have shape [Tk, 4, 128], got [1, 8, 128]"
    );
    assert_eq!(
        read_err(
            "rank",
            &with("cu_seqlens_q", Some(("I32", vec![3, 1], i32_bytes(&CU_Q))))
        ),
        "tensor `cu_seqlens_q` must have shape [B+1], got [3, 1]"
    );
    assert_eq!(
        read_err("unexpected", &with("dOut", Some(("BF16", vec![T, 64, 128], bf16_bytes(&ramp(T * 8192, 0.1)))))),
        "tensor `dOut` is not an input tensor (expected one of: q, k, v, topk_indices, cu_seqlens_q, \
         cu_seqlens_k, fragment_indices, dout, qi, ki)"
    );
    let qi = ("BF16", vec![T, 4, 128], bf16_bytes(&ramp(T * 512, 0.1)));
    assert_eq!(
        read_err("unpaired", &with("qi", Some(qi))),
        "tensor `ki` is missing: `qi` is present and the indexer needs both"
    );
}

#[test]
fn sizes_must_agree_between_tensors() {
    let e = read_err(
        "t",
        &with(
            "topk_indices",
            Some((
                "I32",
                vec![4, T + 1, 16],
                i32_bytes(&vec![0; 4 * (T + 1) * 16]),
            )),
        ),
    );
    assert_eq!(
        e,
        "inconsistent sizes: `topk_indices` has T = 6 but `q` has T = 5"
    );
    let e = read_err(
        "tk",
        &with(
            "ki",
            Some((
                "BF16",
                vec![TK - 1, 1, 128],
                bf16_bytes(&ramp((TK - 1) * 128, 0.1)),
            )),
        ),
    );
    assert_eq!(e, "inconsistent sizes: `ki` has Tk = 6 but `k` has Tk = 7");
    let e = read_err(
        "b",
        &with(
            "cu_seqlens_k",
            Some(("I32", vec![4], i32_bytes(&[0, 4, 6, 7]))),
        ),
    );
    assert_eq!(
        e,
        "inconsistent sizes: `cu_seqlens_k` has B+1 = 4 but `cu_seqlens_q` has B+1 = 3"
    );
    let e = read_err(
        "frag",
        &with(
            "fragment_indices",
            Some(("I32", vec![3], i32_bytes(&[0, 0, 0]))),
        ),
    );
    assert_eq!(
        e,
        "inconsistent sizes: `fragment_indices` has B = 3 but `cu_seqlens_q` has B = 2"
    );
    let e = read_err(
        "total-k",
        &with(
            "cu_seqlens_k",
            Some(("I32", vec![3], i32_bytes(&[0, 4, 8]))),
        ),
    );
    assert_eq!(
        e,
        "inconsistent sizes: cu_seqlens_k[B] = 8 but `k` has Tk = 7"
    );
    let e = read_err(
        "total-q",
        &with(
            "cu_seqlens_q",
            Some(("I32", vec![3], i32_bytes(&[0, 2, 4]))),
        ),
    );
    assert_eq!(
        e,
        "inconsistent sizes: cu_seqlens_q[B] = 4 but `q` has T = 5"
    );
    let e = read_err(
        "cu-layout",
        &with(
            "cu_seqlens_q",
            Some(("I32", vec![3], i32_bytes(&[1, 2, 5]))),
        ),
    );
    assert_eq!(e, "cu_seqlens_q is malformed: must start at 0, got 1");
}

#[test]
fn unreadable_files_are_reported_with_the_path() {
    let path = tmp("garbage");
    std::fs::write(&path, b"not a safetensors file").unwrap();
    let e = read_inputs(&path).unwrap_err().to_string();
    assert!(
        e.contains("io_file-garbage.safetensors is not a valid safetensors file"),
        "{e}"
    );
    let e = read_inputs(tmp("absent")).unwrap_err();
    assert!(matches!(e, TensorFileError::Io { .. }), "{e}");
}

#[test]
fn writes_check_lengths_and_sizes() {
    let layout = VarlenLayout::new(&CU_Q, &CU_K, Some(&FRAGS)).unwrap();
    let file = CallInputs::generated(layout.clone(), Inputs::generate(&layout, 2), topk());
    let short_q = CallInputs {
        q: ramp(T * 8192 - 1, 0.1),
        ..file.clone()
    };
    let e = write_inputs(tmp("short-q"), &short_q, false)
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "tensor `q` must have shape [5, 64, 128], got 40959 elements (not a multiple of 8192)"
    );
    let mut long_v = file;
    long_v.v.extend(ramp(512, 0.1));
    let e = write_inputs(tmp("long-v"), &long_v, false)
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "tensor `v` must have shape [7, 4, 128], got 4096 elements"
    );

    let mixed = Outputs {
        out: Some(ramp(T * 8192, 0.1)),
        lse: Some(vec![0.0; (T - 1) * 64]),
        ..Outputs::default()
    };
    let e = write_outputs(tmp("mixed"), &mixed, false)
        .unwrap_err()
        .to_string();
    assert_eq!(e, "tensor `lse` must have shape [5, 64], got 256 elements");
    let mixed = Outputs {
        dk: Some(ramp(TK * 512, 0.1)),
        dv: Some(ramp((TK + 1) * 512, 0.1)),
        ..Outputs::default()
    };
    let e = write_outputs(tmp("mixed-k"), &mixed, false)
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "tensor `dv` must have shape [7, 4, 128], got 4096 elements"
    );
}

// ---- files that must not be read whole, or written over -----------------------------------

#[test]
fn totals_that_disagree_with_the_tensors_are_named_before_the_layout_limits() {
    // cu_seqlens ending at 10^9 with 5 queries: the plain message is the disagreement, not the
    // 2^24 per-fragment query limit the layout would hit first.
    let cu = [0, 2, 1_000_000_000];
    let mut tensors = with("cu_seqlens_q", Some(("I32", vec![3], i32_bytes(&cu))));
    tensors.retain(|t| t.0 != "cu_seqlens_k");
    tensors.push(("cu_seqlens_k".into(), "I32", vec![3], i32_bytes(&cu)));
    assert_eq!(
        read_err("total-1e9", &tensors),
        "inconsistent sizes: cu_seqlens_q[B] = 1000000000 but `q` has T = 5"
    );
}

#[test]
fn a_device_is_refused_before_anything_is_read() {
    // /dev/zero never ends: read whole, it ends in "out of memory".
    let e = read_inputs("/dev/zero").unwrap_err();
    assert!(matches!(e, TensorFileError::NotAFile { .. }), "{e}");
    assert_eq!(
        e.to_string(),
        "/dev/zero is a character device, not a regular file"
    );
}

#[test]
fn a_header_length_beyond_the_file_is_named() {
    let path = tmp("long-header");
    let mut bytes = 1000u64.to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{}      ");
    std::fs::write(&path, bytes).unwrap();
    let e = read_inputs(&path).unwrap_err().to_string();
    assert!(
        e.ends_with(
            "io_file-long-header.safetensors is not a valid safetensors file: its header \
             length 1000 exceeds the 16-byte file"
        ),
        "{e}"
    );
}

#[test]
fn a_file_that_declares_huge_tensors_is_refused_before_it_is_read() {
    // A valid header for a 1 TiB `q`, with the data as a hole: the file is as large as the
    // header says, so only the memory limit stands between it and the allocator.
    let path = tmp("huge");
    let rows = (1usize << 40) / (64 * 128 * 2);
    let header = format!(
        r#"{{"q":{{"dtype":"BF16","shape":[{rows},64,128],"data_offsets":[0,{}]}}}}"#,
        1u64 << 40
    );
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    let len = bytes.len() as u64 + (1 << 40);
    std::fs::write(&path, bytes).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len)
        .unwrap();
    let e = read_inputs(&path).unwrap_err();
    let _ = std::fs::remove_file(&path);
    assert!(matches!(e, TensorFileError::Memory(_)), "{e}");
    let e = e.to_string();
    assert!(
        e.contains(&format!("io_file-huge.safetensors ({len} bytes) needs about 2048.0 GiB of memory, over the limit of")),
        "{e}"
    );
}

/// The mode a new file gets here (0666 less the umask), read off a file std creates.
fn usual_mode(dir: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    let probe = dir.join("io_file-mode-probe");
    let _ = std::fs::remove_file(&probe);
    std::fs::File::create(&probe).unwrap();
    let mode = std::fs::metadata(&probe).unwrap().permissions().mode() & 0o777;
    std::fs::remove_file(&probe).unwrap();
    mode
}

#[test]
fn written_files_get_the_usual_mode() {
    use std::os::unix::fs::PermissionsExt;
    let path = tmp("mode");
    let out = Outputs {
        lse: Some(vec![0.0; 64]),
        ..Outputs::default()
    };
    write_outputs(&path, &out, false).unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, usual_mode(path.parent().unwrap()), "{mode:o}");
}

#[test]
fn links_and_directories_are_never_written_over() {
    let out = Outputs {
        lse: Some(vec![0.0; 64]),
        ..Outputs::default()
    };
    let target = tmp("link-target");
    std::fs::write(&target, b"keep").unwrap();
    let link = tmp("link");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    for force in [false, true] {
        let e = write_outputs(&link, &out, force).unwrap_err().to_string();
        assert!(
            e.ends_with(
                "io_file-link.safetensors is a symbolic link, not a regular file; refusing to \
                 write over it"
            ),
            "{e}"
        );
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
    }
    let dir = tmp("dir");
    let _ = std::fs::remove_dir(&dir);
    std::fs::create_dir(&dir).unwrap();
    let e = write_outputs(&dir, &out, true).unwrap_err().to_string();
    assert!(
        e.ends_with("is a directory, not a regular file; refusing to write over it"),
        "{e}"
    );
    assert!(dir.is_dir());
}

/// Files of `dir` whose name contains `part`.
fn files_with(dir: &Path, part: &str) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(part))
        .collect()
}

#[test]
fn a_failed_write_names_the_file_and_leaves_no_temporary_behind() {
    let path = tmp("full");
    let dir = path.parent().unwrap();
    std::fs::write(&path, b"before").unwrap();
    let e = output_path::write_atomic(&path, true, |w| {
        use std::io::Write;
        w.write_all(b"partial")?;
        Err(std::io::Error::from_raw_os_error(28))
    })
    .unwrap_err()
    .to_string();
    assert_eq!(
        e,
        format!(
            "cannot write {}: No space left on device (os error 28)",
            path.display()
        )
    );
    assert_eq!(
        std::fs::read(&path).unwrap(),
        b"before",
        "the file is untouched"
    );
    assert_eq!(
        files_with(dir, "io_file-full.safetensors."),
        Vec::<String>::new()
    );

    // A missing directory and a write-protected one are named before any data is made.
    let missing = dir.join("io_file-no-such-dir").join("out.safetensors");
    let e = output_path::check(&missing, false).unwrap_err().to_string();
    assert!(e.ends_with("io_file-no-such-dir does not exist"), "{e}");
    assert!(
        e.starts_with(&format!("cannot write {}: directory ", missing.display())),
        "{e}"
    );
    let locked = dir.join("io_file-locked");
    let _ = std::fs::create_dir(&locked);
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o555)).unwrap();
    let e = output_path::check(&locked.join("out.safetensors"), false)
        .unwrap_err()
        .to_string();
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o755)).unwrap();
    assert!(e.ends_with("io_file-locked is write-protected"), "{e}");
}
