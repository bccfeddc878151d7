//! Values of constant tensors (initializers and `Constant` nodes): eps, exponents, axes, and the
//! norm weight when it must be converted to the plugin's type.

use std::path::Path;

use crate::proto::{tensor_proto::DataLocation, TensorProto};
use half::{bf16, f16};

use crate::dtype;
use crate::error::{Error, Result};

/// The number of elements, None for negative or overflowing dimensions.
pub fn element_count(t: &TensorProto) -> Option<usize> {
    t.dims.iter().try_fold(1usize, |n, &d| n.checked_mul(usize::try_from(d).ok()?))
}

pub fn is_external(t: &TensorProto) -> bool {
    t.data_location.value() == DataLocation::EXTERNAL as i32
}

/// The tensor's bytes in little-endian element order, from `raw_data` or, for external data,
/// from its file (`location` relative to `data_dir`, optional `offset` and `length`).
pub fn raw_bytes(t: &TensorProto, data_dir: &Path) -> Result<Vec<u8>> {
    if !is_external(t) {
        return Ok(t.raw_data.clone());
    }
    let err = |reason: String| Error::ExternalData { tensor: t.name.clone(), reason };
    let entry = |key: &str| t.external_data.iter().find(|e| e.key == key).map(|e| e.value.as_str());
    let location = entry("location").ok_or_else(|| err("no location".into()))?;
    let number = |key: &str| -> Result<Option<u64>> {
        entry(key).map(|v| v.parse::<u64>().map_err(|_| err(format!("{key} '{v}' is not a number")))).transpose()
    };
    let (offset, length) = (number("offset")?.unwrap_or(0), number("length")?);
    let path = data_dir.join(location);
    let bytes = std::fs::read(&path).map_err(|e| err(format!("{}: {e}", path.display())))?;
    let start = usize::try_from(offset).ok().filter(|&s| s <= bytes.len());
    let start = start.ok_or_else(|| err(format!("offset {offset} is past the end of {}", path.display())))?;
    let end = match length {
        Some(n) => usize::try_from(n).ok().and_then(|n| start.checked_add(n)).filter(|&e| e <= bytes.len()),
        None => Some(bytes.len()),
    };
    let end = end.ok_or_else(|| err(format!("offset + length is past the end of {}", path.display())))?;
    Ok(bytes[start..end].to_vec())
}

/// Every element as f64, for float types (FLOAT, DOUBLE, FLOAT16, BFLOAT16) and integer ones
/// (INT32, INT64); None for other types or a malformed payload.
pub fn as_f64(t: &TensorProto, data_dir: &Path) -> Result<Option<Vec<f64>>> {
    let Some(n) = element_count(t) else { return Ok(None) };
    let raw = raw_bytes(t, data_dir)?;
    let from_raw = |size: usize, f: &dyn Fn(&[u8]) -> f64| -> Option<Vec<f64>> {
        (raw.len() == n.checked_mul(size)?).then(|| raw.chunks_exact(size).map(f).collect())
    };
    let half_bits = |bits: &[i32], f: fn(u16) -> f64| -> Option<Vec<f64>> {
        (bits.len() == n).then(|| bits.iter().map(|&b| f(b as u16)).collect())
    };
    let values = if !raw.is_empty() {
        match t.data_type {
            dtype::FLOAT => from_raw(4, &|b| f32::from_le_bytes(b.try_into().unwrap()) as f64),
            dtype::DOUBLE => from_raw(8, &|b| f64::from_le_bytes(b.try_into().unwrap())),
            dtype::FLOAT16 => from_raw(2, &|b| f16::from_le_bytes(b.try_into().unwrap()).to_f64()),
            dtype::BFLOAT16 => from_raw(2, &|b| bf16::from_le_bytes(b.try_into().unwrap()).to_f64()),
            dtype::INT32 => from_raw(4, &|b| i32::from_le_bytes(b.try_into().unwrap()) as f64),
            dtype::INT64 => from_raw(8, &|b| i64::from_le_bytes(b.try_into().unwrap()) as f64),
            _ => None,
        }
    } else {
        match t.data_type {
            dtype::FLOAT => (t.float_data.len() == n).then(|| t.float_data.iter().map(|&v| v as f64).collect()),
            dtype::DOUBLE => (t.double_data.len() == n).then(|| t.double_data.clone()),
            dtype::FLOAT16 => half_bits(&t.int32_data, |b| f16::from_bits(b).to_f64()),
            dtype::BFLOAT16 => half_bits(&t.int32_data, |b| bf16::from_bits(b).to_f64()),
            dtype::INT32 => (t.int32_data.len() == n).then(|| t.int32_data.iter().map(|&v| v as f64).collect()),
            dtype::INT64 => (t.int64_data.len() == n).then(|| t.int64_data.iter().map(|&v| v as f64).collect()),
            _ => None,
        }
    };
    Ok(values)
}

/// The value of a one-element numeric tensor.
pub fn scalar(t: &TensorProto, data_dir: &Path) -> Result<Option<f64>> {
    Ok(as_f64(t, data_dir)?.filter(|v| v.len() == 1).map(|v| v[0]))
}

/// `t` converted to `to` (FLOAT16, BFLOAT16 or FLOAT), rounding to nearest even, as an inline
/// tensor named `name` with `t`'s shape.
pub fn converted(t: &TensorProto, to: i32, name: &str, data_dir: &Path) -> Result<Option<TensorProto>> {
    let Some(values) = as_f64(t, data_dir)? else {
        return Ok(None);
    };
    let raw_data: Vec<u8> = match to {
        dtype::FLOAT16 => values.iter().flat_map(|&v| f16::from_f64(v).to_le_bytes()).collect(),
        dtype::BFLOAT16 => values.iter().flat_map(|&v| bf16::from_f64(v).to_le_bytes()).collect(),
        dtype::FLOAT => values.iter().flat_map(|&v| (v as f32).to_le_bytes()).collect(),
        _ => return Ok(None),
    };
    Ok(Some(TensorProto { name: name.to_owned(), dims: t.dims.clone(), data_type: to, raw_data, ..Default::default() }))
}
