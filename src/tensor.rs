//! TensorRT tensor descriptions as the plugin sees them: data types, formats, element counts.

use crate::error::{Error, Result};

/// A tensor as TensorRT describes it, flattened (the bridge converts TensorRT's at the edge):
/// `PluginTensorDesc` at run time, `DynamicPluginTensorDesc::desc` at build time, and `DimsExprs`
/// in `getOutputShapes` (where a dimension that is not a build-time constant is -1).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TensorDesc {
    pub nb_dims: i32,
    pub dims: [i64; MAX_DIMS],
    pub dtype: i32,
    pub format: i32,
}

/// The most tensors one call describes (the fused op has 4 inputs and 2 outputs).
pub(crate) const MAX_TENSORS: usize = 8;

/// Up to [`MAX_TENSORS`] descriptions on the stack: the bridge's conversion allocates nothing
/// (it runs in enqueue).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Descs {
    items: [TensorDesc; MAX_TENSORS],
    len: usize,
}

impl Descs {
    /// `descs` converted one by one; an error when there are more than [`MAX_TENSORS`].
    pub(crate) fn collect<T>(descs: &[T], convert: impl Fn(&T) -> TensorDesc) -> Result<Descs> {
        if descs.len() > MAX_TENSORS {
            return Err(Error::shape(format!("{} tensors described; a call has at most {MAX_TENSORS}", descs.len())));
        }
        let mut items = [TensorDesc::default(); MAX_TENSORS];
        items.iter_mut().zip(descs).for_each(|(to, from)| *to = convert(from));
        Ok(Descs { items, len: descs.len() })
    }
}

impl std::ops::Deref for Descs {
    type Target = [TensorDesc];
    fn deref(&self) -> &[TensorDesc] {
        &self.items[..self.len]
    }
}

/// TensorRT `DataType` codes of the types the all-reduce accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DataType {
    Float,
    Half,
    Bf16,
}

impl DataType {
    pub fn from_trt(code: i32) -> Option<Self> {
        match code {
            0 => Some(DataType::Float),
            1 => Some(DataType::Half),
            7 => Some(DataType::Bf16),
            _ => None,
        }
    }
    pub fn size(self) -> usize {
        match self {
            DataType::Float => 4,
            DataType::Half | DataType::Bf16 => 2,
        }
    }
}

/// TensorRT `TensorFormat::kLINEAR`.
pub(crate) const LINEAR: i32 = 0;
/// `Dims::MAX_DIMS`.
pub(crate) const MAX_DIMS: usize = 8;

pub(crate) fn data_type(desc: &TensorDesc) -> Result<DataType> {
    DataType::from_trt(desc.dtype).ok_or(Error::UnsupportedType(desc.dtype))
}

/// Number of elements of a run-time tensor; every dimension must be known and non-negative.
pub(crate) fn element_count(desc: &TensorDesc) -> Result<usize> {
    let rank = usize::try_from(desc.nb_dims).ok().filter(|&r| r <= MAX_DIMS);
    let Some(rank) = rank else {
        return Err(Error::shape(format!("tensor has an invalid number of dimensions {}", desc.nb_dims)));
    };
    desc.dims[..rank].iter().try_fold(1usize, |n, &d| {
        usize::try_from(d)
            .ok()
            .and_then(|d| n.checked_mul(d))
            .ok_or_else(|| Error::shape(format!("tensor has an invalid shape {:?}", &desc.dims[..rank])))
    })
}

/// Bytes of `count` elements of `dtype`; an error past 2^63 - 1 (TensorRT's int64 volumes: a
/// larger tensor cannot exist, and the sizes computed from it would wrap).
pub(crate) fn byte_count(count: usize, dtype: DataType) -> Result<u64> {
    u64::try_from(count)
        .ok()
        .and_then(|c| c.checked_mul(dtype.size() as u64))
        .filter(|&b| b <= i64::MAX as u64)
        .ok_or_else(|| {
            Error::shape(format!(
                "a tensor of {count} elements of {} bytes is larger than 2^63 - 1 bytes",
                dtype.size()
            ))
        })
}

#[cfg(test)]
pub(crate) fn desc(dims: &[i64], dtype: i32) -> TensorDesc {
    let mut d = [0i64; MAX_DIMS];
    d[..dims.len()].copy_from_slice(dims);
    TensorDesc { nb_dims: dims.len() as i32, dims: d, dtype, format: LINEAR }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn element_counts() {
        assert_eq!(element_count(&desc(&[2, 3, 4096], 1)).unwrap(), 2 * 3 * 4096);
        assert_eq!(element_count(&desc(&[], 1)).unwrap(), 1, "a scalar has one element");
        assert_eq!(element_count(&desc(&[4, 0], 1)).unwrap(), 0);
        assert!(element_count(&desc(&[-1, 8], 1)).is_err(), "unknown dims are not a run-time shape");
        assert!(element_count(&desc(&[i64::MAX, 4], 1)).is_err(), "overflow is an error");
        let mut bad = desc(&[1], 1);
        bad.nb_dims = 9;
        assert!(element_count(&bad).is_err());
    }

    #[test]
    fn byte_counts_that_overflow_are_errors() {
        assert_eq!(byte_count(1 << 20, DataType::Float).unwrap(), 4 << 20);
        // [2^31, 2^31] FP32: 2^62 elements, 2^64 bytes.
        let count = element_count(&desc(&[1 << 31, 1 << 31], 0)).unwrap();
        assert!(byte_count(count, DataType::Float).is_err());
        // [INT64_MAX, 2]: 2^64 - 2 elements.
        let count = element_count(&desc(&[i64::MAX, 2], 1)).unwrap();
        assert!(byte_count(count, DataType::Half).is_err());
        assert_eq!(
            byte_count((i64::MAX / 2) as usize, DataType::Half).unwrap(),
            i64::MAX as u64 - 1,
            "just under the bound"
        );
    }

    #[test]
    fn data_types() {
        assert_eq!(data_type(&desc(&[1], 0)).unwrap(), DataType::Float);
        assert_eq!(data_type(&desc(&[1], 1)).unwrap(), DataType::Half);
        assert_eq!(data_type(&desc(&[1], 7)).unwrap(), DataType::Bf16);
        for unsupported in [2, 3, 4, 5, 6, 8, 9, 10, 11, -1] {
            assert!(data_type(&desc(&[1], unsupported)).is_err(), "type {unsupported}");
        }
    }
}
