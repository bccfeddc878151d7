//! The command on files: Edge-LLM 0.11's real export (tests/fixtures, made by make_fixture.sh),
//! byte-identical output when nothing fuses, external data, dry runs and bad input.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use edgellm_allreduce_fuse::graph::{float_attr, int_attr};
use edgellm_allreduce_fuse::proto::ModelProto;
use edgellm_allreduce_fuse::{check_structure, model_file};

const FIXTURE: &str = "tests/fixtures/edgellm-0.11-qwen3-tp2";
const MODEL: &str = "model_world2_rank0.onnx";

/// A fresh folder holding a copy of the fixture (model and external data).
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("edgellm-fuse-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for f in [MODEL, "model_world2_rank0.onnx.data"] {
        std::fs::copy(Path::new(env!("CARGO_MANIFEST_DIR")).join(FIXTURE).join(f), dir.join(f)).unwrap();
    }
    dir
}

fn fuse_cmd(args: &[&Path]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_edgellm-allreduce-fuse")).args(args).output().expect("the command runs")
}

fn text(out: &Output) -> (String, String) {
    (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn load(path: &Path) -> ModelProto {
    model_file::read(path).expect("a readable model").1
}

fn count(model: &ModelProto, op: &str) -> usize {
    model.graph.as_ref().unwrap().node.iter().filter(|n| n.op_type == op).count()
}

#[test]
fn edge_llm_export_every_decoder_layer_chain_is_fused() {
    let dir = scratch("export");
    let out = fuse_cmd(&[&dir.join(MODEL), Path::new("-o"), &dir.join("fused.onnx")]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    // 2 layers: o_proj's all-reduce into post_attention_layernorm, down_proj's into the next
    // layer's input_layernorm (the last one's into the final norm).
    for k in 1..=4 {
        assert!(lines[k - 1].starts_with(&format!("#{k} fused ")), "{stdout}");
    }
    assert!(stdout.contains("fused 4 of 4 AllReducePlugin nodes"), "{stdout}");

    let before = load(&dir.join(MODEL));
    let after = load(&dir.join("fused.onnx"));
    check_structure(&after).expect("the rewritten export is valid");
    let fused: Vec<_> = after.graph.as_ref().unwrap().node.iter().filter(|n| n.op_type == "AllReducePlugin").collect();
    assert_eq!(fused.len(), 4);
    let gammas = [
        "_model.model.layers.0.post_attention_layernorm.weight",
        "_model.model.layers.1.input_layernorm.weight",
        "_model.model.layers.1.post_attention_layernorm.weight",
        "_model.model.norm.weight",
    ];
    for (node, gamma) in fused.iter().zip(gammas) {
        assert_eq!(
            (node.domain.as_str(), int_attr(node, "tp_size"), int_attr(node, "fusion_op")),
            ("trt_edgellm", Some(2), Some(1))
        );
        assert_eq!(float_attr(node, "eps"), Some(1e-6), "the checkpoint's rms_norm_eps");
        assert_eq!(int_attr(node, "has_bias"), None);
        assert_eq!(node.input.len(), 3);
        assert_eq!(node.input[2], gamma);
        assert_eq!(node.output.len(), 2);
    }
    // What is left of RMSNorm: layer 0's input_layernorm, which reads the embeddings.
    assert_eq!((count(&before, "Pow"), count(&after, "Pow")), (5, 1));
    assert_eq!((count(&before, "ReduceMean"), count(&after, "ReduceMean")), (5, 1));
    // The external data file is referenced as it was.
    assert_eq!(model_file::external_files(&after), model_file::external_files(&before));
    assert!(!model_file::external_files(&after).is_empty(), "the exporter writes external data");

    // A second pass finds nothing to fuse and writes the file back byte for byte.
    let again = fuse_cmd(&[&dir.join("fused.onnx"), Path::new("-o"), &dir.join("again.onnx")]);
    let (stdout, _) = text(&again);
    assert!(again.status.success());
    assert_eq!(stdout.matches("already fused").count(), 4, "{stdout}");
    assert_eq!(std::fs::read(dir.join("again.onnx")).unwrap(), std::fs::read(dir.join("fused.onnx")).unwrap());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn nothing_to_fuse_is_written_byte_identical() {
    let dir = scratch("identity");
    // The export with its all-reduces renamed: no candidate at all.
    let mut model = load(&dir.join(MODEL));
    model.graph.as_mut().unwrap().node.iter_mut().filter(|n| n.op_type == "AllReducePlugin").for_each(|n| {
        n.op_type = "SomeOtherPlugin".into();
    });
    let bytes = model_file::serialize(&model).unwrap();
    std::fs::write(dir.join("plain.onnx"), &bytes).unwrap();
    let out = fuse_cmd(&[&dir.join("plain.onnx"), Path::new("-o"), &dir.join("out.onnx")]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("fused 0 of 0"), "{stdout}");
    assert_eq!(std::fs::read(dir.join("out.onnx")).unwrap(), bytes);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn external_data_output_elsewhere_is_refused_and_dry_run_writes_nothing() {
    let dir = scratch("elsewhere");
    let other = dir.join("other");
    std::fs::create_dir_all(&other).unwrap();
    let out = fuse_cmd(&[&dir.join(MODEL), Path::new("-o"), &other.join("fused.onnx")]);
    let (_, stderr) = text(&out);
    assert!(!out.status.success());
    assert!(stderr.contains("external data") && stderr.contains("model_world2_rank0.onnx.data"), "{stderr}");
    assert!(!other.join("fused.onnx").exists());

    let out = fuse_cmd(&[&dir.join(MODEL), Path::new("--dry-run"), Path::new("-o"), &dir.join("dry.onnx")]);
    let (stdout, _) = text(&out);
    assert!(out.status.success());
    assert!(stdout.contains("fused 4 of 4") && stdout.contains("dry run: nothing written"), "{stdout}");
    assert!(!dir.join("dry.onnx").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    let dir = scratch("bad");
    std::fs::write(dir.join("junk.onnx"), b"\xff\xff\xff not a protobuf").unwrap();
    for (input, says) in [(dir.join("junk.onnx"), "is not an ONNX model"), (dir.join("missing.onnx"), "cannot read")] {
        let out = fuse_cmd(&[&input, Path::new("-o"), &dir.join("out.onnx")]);
        let (_, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains(says) && !stderr.contains("panicked"), "{stderr}");
    }
    let out = fuse_cmd(&[&dir.join(MODEL), Path::new("--only"), Path::new("9"), Path::new("--dry-run")]);
    assert!(text(&out).1.contains("there are only 4 candidate chains"));
    std::fs::remove_dir_all(&dir).unwrap();
}
