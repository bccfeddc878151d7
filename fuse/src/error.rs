//! What can go wrong reading, rewriting or writing a model. Refusing a candidate chain is not an
//! error (it is a line of the report); these stop the command.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read {0}: {1}")]
    Read(PathBuf, std::io::Error),
    #[error("{0} is not an ONNX model: {1}")]
    Parse(PathBuf, protobuf::Error),
    #[error("cannot write {0}: {1}")]
    Write(PathBuf, std::io::Error),
    #[error("cannot serialize the rewritten model: {0}")]
    Serialize(protobuf::Error),
    #[error("the model has no graph")]
    NoGraph,
    #[error(
        "the model keeps tensors in external data files ({files}) referenced relative to {in_dir}; \
         write the output into that folder (e.g. -o {in_dir}/NAME.onnx) so the references stay valid"
    )]
    ExternalDataElsewhere { files: String, in_dir: String },
    #[error("external data of tensor '{tensor}': {reason}")]
    ExternalData { tensor: String, reason: String },
    #[error("--only {0}: there are only {1} candidate chains")]
    NoSuchCandidate(usize, usize),
    #[error("the rewritten graph is not valid ({0}); nothing was written")]
    Invalid(String),
}

pub type Result<T> = std::result::Result<T, Error>;
