//! Reading and writing model files. Tensors in external data files stay where they are: the
//! rewritten model refers to them by the same relative locations, so it must be written into the
//! folder the input was read from (any other folder is refused, naming the files).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::proto::{GraphProto, ModelProto};
use protobuf::Message;

use crate::constant::is_external;
use crate::error::{Error, Result};
use crate::graph::subgraphs;

/// The file's bytes and the model they hold.
pub fn read(path: &Path) -> Result<(Vec<u8>, ModelProto)> {
    let bytes = std::fs::read(path).map_err(|e| Error::Read(path.to_owned(), e))?;
    let model = ModelProto::parse_from_bytes(&bytes).map_err(|e| Error::Parse(path.to_owned(), e))?;
    Ok((bytes, model))
}

pub fn serialize(model: &ModelProto) -> Result<Vec<u8>> {
    model.write_to_bytes().map_err(Error::Serialize)
}

pub fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes).map_err(|e| Error::Write(path.to_owned(), e))
}

/// The folder relative external-data locations are resolved against.
pub fn data_dir(model_path: &Path) -> PathBuf {
    match model_path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    }
}

/// The `location`s of every external tensor (initializers and tensor attributes, subgraphs too).
pub fn external_files(model: &ModelProto) -> BTreeSet<String> {
    let mut files = BTreeSet::new();
    if let Some(g) = model.graph.as_ref() {
        collect(g, &mut files);
    }
    files
}

fn collect(graph: &GraphProto, files: &mut BTreeSet<String>) {
    let tensors = graph.node.iter().flat_map(|n| &n.attribute).flat_map(|a| a.t.as_ref().into_iter().chain(&a.tensors));
    for t in graph.initializer.iter().chain(tensors).filter(|t| is_external(t)) {
        files.extend(t.external_data.iter().filter(|e| e.key == "location").map(|e| e.value.clone()));
    }
    for sub in graph.node.iter().flat_map(subgraphs) {
        collect(sub, files);
    }
}

/// Refuses an output folder other than the input's when the model has external data.
pub fn check_output_folder(input: &Path, output: &Path, model: &ModelProto) -> Result<()> {
    let files = external_files(model);
    if files.is_empty() {
        return Ok(());
    }
    let canonical = |p: &Path| std::fs::canonicalize(data_dir(p)).ok();
    let (a, b) = (canonical(input), canonical(output));
    if a.is_some() && a == b {
        return Ok(());
    }
    Err(Error::ExternalDataElsewhere {
        files: files.into_iter().collect::<Vec<_>>().join(", "),
        in_dir: data_dir(input).display().to_string(),
    })
}
