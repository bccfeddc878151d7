//! ONNX element types (`TensorProto.DataType` codes) the pass reads or writes.

pub const FLOAT: i32 = 1;
pub const INT32: i32 = 6;
pub const INT64: i32 = 7;
pub const FLOAT16: i32 = 10;
pub const DOUBLE: i32 = 11;
pub const BFLOAT16: i32 = 16;

/// The types the fused plugin computes in (all its tensors share one).
pub fn plugin_supports(t: i32) -> bool {
    matches!(t, FLOAT | FLOAT16 | BFLOAT16)
}

pub fn name(t: i32) -> String {
    match t {
        FLOAT => "fp32".into(),
        FLOAT16 => "fp16".into(),
        BFLOAT16 => "bf16".into(),
        DOUBLE => "fp64".into(),
        INT32 => "int32".into(),
        INT64 => "int64".into(),
        other => format!("type {other}"),
    }
}
