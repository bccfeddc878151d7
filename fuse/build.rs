//! Generates ONNX's messages from proto/onnx.proto3, ONNX's own proto3 edition of its schema
//! (ONNX 1.19.0, vendored as released): the same messages, field numbers and wire format as
//! onnx.proto, with plain fields instead of `Option`s in the generated code. rust-protobuf's
//! pure-Rust parser reads it: no protoc.

fn main() {
    protobuf_codegen::Codegen::new()
        .pure()
        .include("proto")
        .input("proto/onnx.proto3")
        .cargo_out_dir("onnx")
        .run_from_script();
    println!("cargo:rerun-if-changed=proto/onnx.proto3");
}
