//! Input data and the correctness check (the approach of tests/gpu_simulated_ranks.rs):
//! pseudo-random values in [-2, 2) per rank, an fp64 reference sum, and a check that every
//! rank's output is bit-identical and within the type's tolerance of the reference (relative
//! L2 error), with no unwritten (poisoned: NaN) or non-finite element.

use edgellm_allreduce::tensor::DataType;

pub fn dtype_name(dtype: DataType) -> &'static str {
    match dtype {
        DataType::Float => "fp32",
        DataType::Half => "fp16",
        DataType::Bf16 => "bf16",
    }
}

pub fn parse_dtype(s: &str) -> Result<DataType, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "bf16" | "bfloat16" => Ok(DataType::Bf16),
        "fp16" | "f16" | "half" => Ok(DataType::Half),
        "fp32" | "f32" | "float" => Ok(DataType::Float),
        _ => Err(format!("unknown dtype '{s}' (bf16, fp16, fp32)")),
    }
}

/// TensorRT `DataType` code (what a `PluginTensorDesc` carries).
pub fn trt_code(dtype: DataType) -> i32 {
    match dtype {
        DataType::Float => 0,
        DataType::Half => 1,
        DataType::Bf16 => 7,
    }
}

/// Relative L2 error allowed against the fp64 sum.
pub fn tolerance(dtype: DataType) -> f64 {
    match dtype {
        DataType::Float => 1e-5,
        DataType::Half => 2e-3,
        DataType::Bf16 => 1e-2,
    }
}

/// The byte all outputs are filled with before a checked call: 0xff.. is NaN in every type.
pub const POISON: u8 = 0xff;

/// Seed of rank `rank`'s input for one (ranks, bytes) case.
pub fn seed(nranks: i32, bytes: u64, rank: usize) -> u64 {
    (rank as u64 + 1) * 7919 + bytes * 31 + nranks as u64 * 1_000_003
}

/// Rank input: `count` values of `dtype` as raw bytes; each stored value is added to
/// `reference` (which must hold `count` elements) when given.
pub fn generate(count: usize, dtype: DataType, seed: u64, mut reference: Option<&mut [f64]>) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut bytes = Vec::with_capacity(count * dtype.size());
    for i in 0..count {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let x = ((state >> 40) as f64 / (1u64 << 24) as f64) * 4.0 - 2.0;
        let stored = match dtype {
            DataType::Float => {
                bytes.extend_from_slice(&(x as f32).to_ne_bytes());
                x as f32 as f64
            }
            DataType::Half => {
                let h = half::f16::from_f64(x);
                bytes.extend_from_slice(&h.to_bits().to_ne_bytes());
                h.to_f64()
            }
            DataType::Bf16 => {
                let h = half::bf16::from_f64(x);
                bytes.extend_from_slice(&h.to_bits().to_ne_bytes());
                h.to_f64()
            }
        };
        if let Some(r) = reference.as_deref_mut() {
            r[i] += stored;
        }
    }
    bytes
}

/// Adds the values of `bytes` (elements of `dtype`) into `reference`.
pub fn accumulate(bytes: &[u8], dtype: DataType, reference: &mut [f64]) {
    for (r, c) in reference.iter_mut().zip(bytes.chunks_exact(dtype.size())) {
        *r += decode(c, dtype);
    }
}

fn decode(c: &[u8], dtype: DataType) -> f64 {
    match dtype {
        DataType::Float => f32::from_ne_bytes(c.try_into().unwrap()) as f64,
        DataType::Half => half::f16::from_bits(u16::from_ne_bytes(c.try_into().unwrap())).to_f64(),
        DataType::Bf16 => half::bf16::from_bits(u16::from_ne_bytes(c.try_into().unwrap())).to_f64(),
    }
}

/// 64-bit digest of an output, to compare ranks without gathering their bytes.
pub fn digest(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ bytes.len() as u64;
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        h = (h ^ u64::from_ne_bytes(c.try_into().unwrap())).wrapping_mul(0x1000_0000_01b3).rotate_left(29);
    }
    for &b in chunks.remainder() {
        h = (h ^ b as u64).wrapping_mul(0x1000_0000_01b3);
    }
    h ^ (h >> 31)
}

/// What one rank (or, in simulation, one output) looks like.
#[derive(Clone, Debug, PartialEq)]
pub struct OutputCheck {
    pub digest: u64,
    /// Relative L2 error against the reference (infinite if any element is not finite).
    pub rel_err: f64,
    /// First element that is not finite (unwritten, NaN), if any.
    pub first_bad: Option<usize>,
}

pub fn check_output(bytes: &[u8], reference: &[f64], dtype: DataType) -> OutputCheck {
    let (mut err, mut norm, mut first_bad) = (0f64, 0f64, None);
    for (i, (c, r)) in bytes.chunks_exact(dtype.size()).zip(reference).enumerate() {
        let got = decode(c, dtype);
        if !got.is_finite() {
            first_bad.get_or_insert(i);
            continue;
        }
        err += (got - r) * (got - r);
        norm += r * r;
    }
    let rel_err = if first_bad.is_some() { f64::INFINITY } else { (err / norm.max(1e-30)).sqrt() };
    OutputCheck { digest: digest(bytes), rel_err, first_bad }
}

/// The verdict over all ranks' outputs: Ok, or what is wrong.
pub fn verdict(checks: &[OutputCheck], dtype: DataType) -> Result<f64, String> {
    let mut worst = 0f64;
    for (rank, c) in checks.iter().enumerate() {
        if let Some(i) = c.first_bad {
            return Err(format!("rank {rank}: element {i} is not finite (unwritten or NaN)"));
        }
        if c.rel_err >= tolerance(dtype) {
            return Err(format!("rank {rank}: relative error {:.3e} >= {:.0e}", c.rel_err, tolerance(dtype)));
        }
        if c.digest != checks[0].digest {
            return Err(format!("rank {rank}'s output differs from rank 0's"));
        }
        worst = worst.max(c.rel_err);
    }
    Ok(worst)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_data_is_random_and_sums_into_the_reference() {
        for dtype in [DataType::Float, DataType::Half, DataType::Bf16] {
            let n = 1000;
            let mut reference = vec![0.0; n];
            let a = generate(n, dtype, seed(4, 2048, 0), Some(&mut reference));
            let b = generate(n, dtype, seed(4, 2048, 1), None);
            accumulate(&b, dtype, &mut reference);
            assert_eq!(a.len(), n * dtype.size());
            assert_ne!(a, b, "ranks get different data");
            assert!(a.iter().filter(|&&x| x == 0).count() < a.len() / 4, "not zeros");
            let mut sum = a.clone();
            for (i, c) in sum.chunks_exact_mut(dtype.size()).enumerate() {
                let v = decode(c, dtype) + decode(&b[i * dtype.size()..(i + 1) * dtype.size()], dtype);
                match dtype {
                    DataType::Float => c.copy_from_slice(&(v as f32).to_ne_bytes()),
                    DataType::Half => c.copy_from_slice(&half::f16::from_f64(v).to_bits().to_ne_bytes()),
                    DataType::Bf16 => c.copy_from_slice(&half::bf16::from_f64(v).to_bits().to_ne_bytes()),
                }
            }
            let good = check_output(&sum, &reference, dtype);
            assert!(verdict(&[good.clone(), good.clone()], dtype).is_ok(), "{dtype:?}: {good:?}");
            let wrong = check_output(&a, &reference, dtype);
            assert!(verdict(&[wrong], dtype).unwrap_err().contains("relative error"));
            let mut poisoned = sum.clone();
            poisoned[dtype.size() * 7..dtype.size() * 8].fill(POISON);
            let p = check_output(&poisoned, &reference, dtype);
            assert_eq!(p.first_bad, Some(7));
            assert!(verdict(&[good.clone(), p], dtype).unwrap_err().contains("element 7"));
            let mut other = sum.clone();
            other[0] ^= 1; // one ulp: within tolerance, but not the same bits
            let o = check_output(&other, &reference, dtype);
            assert!(verdict(&[good, o], dtype).unwrap_err().contains("differs"));
        }
    }

    #[test]
    fn names_and_codes() {
        for d in [DataType::Float, DataType::Half, DataType::Bf16] {
            assert_eq!(parse_dtype(dtype_name(d)).unwrap(), d);
            assert_eq!(DataType::from_trt(trt_code(d)), Some(d));
        }
        assert!(parse_dtype("int8").is_err());
        assert_ne!(digest(&[1, 2, 3]), digest(&[1, 2, 4]));
        assert_ne!(digest(&[0; 16]), digest(&[0; 17]));
    }
}
