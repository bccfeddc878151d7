//! Generates ONNX's messages from proto/onnx.proto (ONNX 1.19, proto2 as ONNX ships it). The
//! proto2 text is turned into proto3 first, as ONNX's own onnx.proto3 is: same messages, field
//! numbers and wire format, but plain fields instead of `Option`s in the generated code.

use std::path::PathBuf;

fn main() {
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let proto2 = std::fs::read_to_string("proto/onnx.proto").expect("proto/onnx.proto is vendored");
    let proto3: String = proto2
        .lines()
        .map(|l| if l.trim_start().starts_with("optional ") { l.replacen("optional ", "", 1) } else { l.to_owned() })
        .map(|l| if l.trim() == "syntax = \"proto2\";" { "syntax = \"proto3\";".to_owned() } else { l })
        .collect::<Vec<_>>()
        .join("\n");
    let dir = out.join("proto3");
    std::fs::create_dir_all(&dir).expect("OUT_DIR is writable");
    std::fs::write(dir.join("onnx.proto"), proto3).expect("OUT_DIR is writable");
    protobuf_codegen::Codegen::new()
        .pure()
        .include(&dir)
        .input(dir.join("onnx.proto"))
        .cargo_out_dir("onnx")
        .run_from_script();
    println!("cargo:rerun-if-changed=proto/onnx.proto");
}
