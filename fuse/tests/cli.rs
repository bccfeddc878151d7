//! The command on files: Edge-LLM 0.11's real export (tests/fixtures, made by make_fixture.sh),
//! byte-identical output when nothing fuses, external data, dry runs and bad input.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use edgellm_allreduce_fuse::graph::{float_attr, int_attr};
use edgellm_allreduce_fuse::proto::{ModelProto, NodeProto};
use edgellm_allreduce_fuse::{check_structure, model_file};

const FIXTURE: &str = "tests/fixtures/edgellm-0.11-qwen3-tp2";
/// A Qwen3.5 hybrid (3 gated-delta-net layers, 1 full-attention layer), make_fixture_hybrid.py.
const HYBRID: &str = "tests/fixtures/edgellm-0.11-qwen3.5-tp2";
const MODEL: &str = "model_world2_rank0.onnx";

/// A fresh folder holding a copy of the Qwen3 fixture (model and external data).
fn scratch(name: &str) -> PathBuf {
    scratch_of(FIXTURE, name)
}

fn scratch_of(fixture: &str, name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("edgellm-fuse-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for f in [MODEL, "model_world2_rank0.onnx.data"] {
        std::fs::copy(Path::new(env!("CARGO_MANIFEST_DIR")).join(fixture).join(f), dir.join(f)).unwrap();
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

fn nodes(model: &ModelProto) -> &[NodeProto] {
    &model.graph.as_ref().unwrap().node
}

/// The rewrite kept everything else as it was: every node but the fused ones is a node of the
/// export with the same op, inputs and outputs (a Reshape moved before a fused node now reads
/// that all-reduce's input instead of its output); every removed node is of the chains' kinds;
/// each fused node's outputs are values the export had, so their readers read them unchanged.
fn assert_rewired(before: &ModelProto, after: &ModelProto) {
    let by_name: HashMap<&str, &NodeProto> = nodes(before).iter().map(|n| (n.name.as_str(), n)).collect();
    let produced: HashSet<&str> = nodes(before).iter().flat_map(|n| n.output.iter().map(String::as_str)).collect();
    let ar_input: HashMap<&str, &str> = nodes(before)
        .iter()
        .filter(|n| n.op_type == "AllReducePlugin")
        .map(|n| (n.output[0].as_str(), n.input[0].as_str()))
        .collect();
    let mut kept = HashSet::new();
    for node in nodes(after) {
        if int_attr(node, "fusion_op") == Some(1) {
            assert!(node.output.iter().all(|o| produced.contains(o.as_str())), "{node:?}");
            continue;
        }
        let old = by_name.get(node.name.as_str()).unwrap_or_else(|| panic!("new node {node:?}"));
        assert_eq!((&node.op_type, &node.output), (&old.op_type, &old.output));
        if node.input != old.input {
            let hoisted =
                node.op_type == "Reshape" && ar_input.get(old.input[0].as_str()) == Some(&node.input[0].as_str());
            assert!(
                hoisted && node.input[1..] == old.input[1..],
                "{} reads {:?}, was {:?}",
                node.name,
                node.input,
                old.input
            );
        }
        kept.insert(node.name.as_str());
    }
    let chain_ops = ["AllReducePlugin", "Add", "Cast", "Pow", "ReduceMean", "Sqrt", "Reciprocal", "Mul", "Constant"];
    for node in nodes(before).iter().filter(|n| !kept.contains(n.name.as_str())) {
        assert!(chain_ops.contains(&node.op_type.as_str()), "removed {} '{}'", node.op_type, node.name);
    }
}

#[test]
fn edge_llm_hybrid_export_every_chain_is_fused() {
    let dir = scratch_of(HYBRID, "hybrid");
    let out = fuse_cmd(&[&dir.join(MODEL), Path::new("-o"), &dir.join(MODEL)]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    // 4 layers (3 gated-delta-net, 1 full attention), two all-reduces each: out_proj / o_proj
    // into post_attention_layernorm, down_proj into the next input_layernorm (the last into the
    // final norm). The MLP's sum reaches the next layer through a Reshape to [-1, hidden] (the
    // shape it has), which also feeds the next residual Add.
    assert!(stdout.contains("fused 8 of 8 AllReducePlugin nodes"), "{stdout}");
    let through: Vec<&str> = stdout.lines().filter(|l| l.contains("norm read through Reshape")).collect();
    assert_eq!(through.len(), 3, "{stdout}");
    assert!(through.iter().all(|l| l.contains(", kept)")), "the Reshape keeps the shape: no copy\n{stdout}");

    let before = load(&Path::new(env!("CARGO_MANIFEST_DIR")).join(HYBRID).join(MODEL));
    let after = load(&dir.join(MODEL));
    check_structure(&after).expect("the rewritten export is valid");
    assert_rewired(&before, &after);
    let fused: Vec<&NodeProto> = nodes(&after).iter().filter(|n| n.op_type == "AllReducePlugin").collect();
    assert_eq!(fused.len(), 8);
    for node in &fused {
        assert_eq!((int_attr(node, "tp_size"), int_attr(node, "fusion_op")), (Some(2), Some(1)));
        assert_eq!(float_attr(node, "eps"), Some(1e-6));
        assert_eq!((node.input.len(), node.output.len()), (3, 2));
    }
    // Each Reshape between a fused sum and the next norm reads the fused node's residual_out and
    // feeds the next fused node as its residual.
    for k in [1, 3, 5] {
        let sum = &fused[k].output[1];
        let readers: Vec<&NodeProto> = nodes(&after).iter().filter(|n| n.input.contains(sum)).collect();
        assert_eq!(readers.len(), 1, "{readers:?}");
        assert_eq!(readers[0].op_type, "Reshape");
        assert_eq!(fused[k + 1].input[1], readers[0].output[0], "the next chain's residual is the Reshape's output");
    }
    // Left of RMSNorm: layer 0's input_layernorm, the gated-delta-net per-head norms (3), q_norm and k_norm.
    assert_eq!((count(&before, "ReduceMean"), count(&after, "ReduceMean")), (14, 6));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn without_value_info_every_chain_still_fuses_the_same_way() {
    for (fixture, chains) in [(FIXTURE, 4), (HYBRID, 8)] {
        let dir = scratch_of(fixture, "no-value-info");
        let out = fuse_cmd(&[&dir.join(MODEL), Path::new("-o"), &dir.join("fused.onnx")]);
        assert!(out.status.success(), "{}", text(&out).0);
        let mut bare = load(&dir.join(MODEL));
        bare.graph.as_mut().unwrap().value_info.clear();
        std::fs::write(dir.join("bare.onnx"), model_file::serialize(&bare).unwrap()).unwrap();
        let out = fuse_cmd(&[&dir.join("bare.onnx"), Path::new("-o"), &dir.join("bare-fused.onnx")]);
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "{stdout}{stderr}");
        assert!(stdout.contains(&format!("fused {chains} of {chains} AllReducePlugin nodes")), "{stdout}");
        let with = load(&dir.join("fused.onnx"));
        let without = load(&dir.join("bare-fused.onnx"));
        check_structure(&without).unwrap();
        assert_rewired(&bare, &without);
        assert_eq!(nodes(&without), nodes(&with), "the same rewrite as with value_info");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
