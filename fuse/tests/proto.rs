//! ONNX's messages as generated from the vendored onnx.proto3: fields this schema does not know
//! (a newer ONNX's) survive a pass, on the model, the graph and the nodes the pass keeps or
//! turns into the fused node.

mod common;

use std::path::Path;

use common::{build, Spec};
use edgellm_allreduce_fuse::proto::ModelProto;
use edgellm_allreduce_fuse::{fuse, model_file, Options};
use protobuf::{Message, UnknownValueRef};

const FIELD: u32 = 1999;

fn unknown(fields: &protobuf::SpecialFields) -> Option<u64> {
    match fields.unknown_fields().get(FIELD) {
        Some(UnknownValueRef::Varint(v)) => Some(v),
        _ => None,
    }
}

#[test]
fn unknown_fields_survive_the_pass() {
    let mut model = build(&Spec::default());
    model.special_fields.mut_unknown_fields().add_varint(FIELD, 1);
    let graph = model.graph.as_mut().unwrap();
    graph.special_fields.mut_unknown_fields().add_varint(FIELD, 2);
    graph.node[0].special_fields.mut_unknown_fields().add_varint(FIELD, 3); // the all-reduce
    graph.node.last_mut().unwrap().special_fields.mut_unknown_fields().add_varint(FIELD, 4); // the consumer
                                                                                             // Through bytes, as a file would be read.
    let mut model = ModelProto::parse_from_bytes(&model.write_to_bytes().unwrap()).unwrap();
    let report = fuse(&mut model, &Options::default(), Path::new(".")).unwrap();
    assert_eq!(report.fused(), 1, "{report}");
    let again = ModelProto::parse_from_bytes(&model_file::serialize(&model).unwrap()).unwrap();
    assert_eq!(unknown(&again.special_fields), Some(1));
    let graph = again.graph.as_ref().unwrap();
    assert_eq!(unknown(&graph.special_fields), Some(2));
    let fused = graph.node.iter().find(|n| n.op_type == "AllReducePlugin").unwrap();
    assert_eq!(unknown(&fused.special_fields), Some(3), "the fused node keeps the all-reduce's fields");
    assert_eq!(unknown(&graph.node.last().unwrap().special_fields), Some(4));
}
