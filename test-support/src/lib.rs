//! Input data and the correctness check that edgellm-allreduce's GPU tests (`tests/gpu_*.rs`)
//! and its benchmark (`bench/`) share: pseudo-random values in [-2, 2) per rank, an fp64
//! reference sum, and a check that every rank's output is bit-identical and within the type's
//! tolerance of the reference (relative L2 error), with no unwritten (poisoned: NaN) or
//! non-finite element. The fused op's shared inputs (residual, gamma, bias) and fp64 references
//! come with it.

use edgellm_allreduce::DataType;

/// The type's name in the benchmark's tables and options: "fp32", "fp16", "bf16".
pub fn dtype_name(dtype: DataType) -> &'static str {
    match dtype {
        DataType::Float => "fp32",
        DataType::Half => "fp16",
        DataType::Bf16 => "bf16",
    }
}

/// A type from its name (bf16 / bfloat16, fp16 / f16 / half, fp32 / f32 / float; any case).
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

/// What one rank's output (or, in simulation, one output) looks like.
#[derive(Clone, Debug, PartialEq)]
pub struct OutputCheck {
    /// Which output: "out" (plain), "normed" or "residual_out" (fused). Outputs of one name are
    /// compared across ranks; the k-th check of a name is rank k's.
    pub output: &'static str,
    /// The relative L2 error allowed.
    pub tolerance: f64,
    pub digest: u64,
    /// Relative L2 error against the reference (infinite if any element is not finite).
    pub rel_err: f64,
    /// First element that is not finite (unwritten, NaN), if any.
    pub first_bad: Option<usize>,
}

/// The plain all-reduce's output against the fp64 sum, with the type's tolerance.
pub fn check_output(bytes: &[u8], reference: &[f64], dtype: DataType) -> OutputCheck {
    check_named(bytes, reference, dtype, "out", tolerance(dtype))
}

/// One named output against its reference, within `tolerance` (relative L2 error).
pub fn check_named(
    bytes: &[u8],
    reference: &[f64],
    dtype: DataType,
    output: &'static str,
    tolerance: f64,
) -> OutputCheck {
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
    OutputCheck { output, tolerance, digest: digest(bytes), rel_err, first_bad }
}

/// The verdict over all ranks' outputs: Ok (the worst relative error), or what is wrong.
/// Outputs of the same name must be bit-identical across ranks.
pub fn verdict(checks: &[OutputCheck]) -> Result<f64, String> {
    let mut worst = 0f64;
    let mut seen: Vec<(&'static str, u64, usize)> = Vec::new(); // name, rank 0's digest, ranks so far
    for c in checks {
        let rank = match seen.iter_mut().find(|s| s.0 == c.output) {
            Some(s) => {
                s.2 += 1;
                s.2 - 1
            }
            None => {
                seen.push((c.output, c.digest, 1));
                0
            }
        };
        let what = if c.output == "out" { format!("rank {rank}") } else { format!("rank {rank} {}", c.output) };
        if let Some(i) = c.first_bad {
            return Err(format!("{what}: element {i} is not finite (unwritten or NaN)"));
        }
        if c.rel_err >= c.tolerance {
            return Err(format!("{what}: relative error {:.3e} >= {:.0e}", c.rel_err, c.tolerance));
        }
        let first = seen.iter().find(|s| s.0 == c.output).expect("recorded").1;
        if c.digest != first {
            return Err(format!("{what} differs from rank 0's"));
        }
        worst = worst.max(c.rel_err);
    }
    Ok(worst)
}

/// Seed of the fused inputs that every rank shares (residual, gamma, bias): `tag` 1, 2, 3.
pub fn shared_seed(nranks: i32, bytes: u64, hidden: u32, tag: u64) -> u64 {
    seed(nranks, bytes ^ ((hidden as u64) << 40), 1000 + tag as usize)
}

/// The inputs of a fused call that are identical on every rank (tensor parallelism): raw
/// bytes to upload and the stored values.
#[derive(Clone, Debug, PartialEq)]
pub struct SharedInputs {
    pub residual: Vec<u8>,
    pub gamma: Vec<u8>,
    /// Empty without a bias.
    pub bias: Vec<u8>,
    pub residual_f64: Vec<f64>,
    pub gamma_f64: Vec<f64>,
    /// Empty without a bias.
    pub bias_f64: Vec<f64>,
}

/// Pseudo-random residual (tokens × hidden), gamma and bias (hidden) in [-2, 2), the same on
/// every rank.
pub fn shared_inputs(nranks: i32, dtype: DataType, tokens: u64, hidden: u32, bias: bool) -> SharedInputs {
    let count = tokens as usize * hidden as usize;
    let bytes = (count * dtype.size()) as u64;
    let make = |n: usize, tag: u64| {
        let mut v = vec![0f64; n];
        let b = generate(n, dtype, shared_seed(nranks, bytes, hidden, tag), Some(&mut v));
        (b, v)
    };
    let (residual, residual_f64) = make(count, 1);
    let (gamma, gamma_f64) = make(hidden as usize, 2);
    let (bias, bias_f64) = if bias { make(hidden as usize, 3) } else { (Vec::new(), Vec::new()) };
    SharedInputs { residual, gamma, bias, residual_f64, gamma_f64, bias_f64 }
}

/// fp64 references of the fused op from the fp64 sum of the ranks' x:
/// residual_out = sum + bias + residual; normed = residual_out / sqrt(mean(residual_out²) + eps)
/// · gamma, per row of `hidden` elements. Returns (residual_out, normed).
pub fn fused_reference(sum: &[f64], shared: &SharedInputs, hidden: u32, eps: f32) -> (Vec<f64>, Vec<f64>) {
    let h = hidden as usize;
    let mut res = vec![0f64; sum.len()];
    let mut normed = vec![0f64; sum.len()];
    for (row, (s, r)) in sum.chunks(h).zip(shared.residual_f64.chunks(h)).enumerate() {
        let out = &mut res[row * h..row * h + s.len()];
        for i in 0..s.len() {
            out[i] = s[i] + shared.bias_f64.get(i).copied().unwrap_or(0.0) + r[i];
        }
        let ms = out.iter().map(|v| v * v).sum::<f64>() / h as f64;
        let scale = 1.0 / (ms + eps as f64).sqrt();
        for i in 0..s.len() {
            normed[row * h + i] = out[i] * scale * shared.gamma_f64[i];
        }
    }
    (res, normed)
}

/// Relative L2 error allowed for the fused outputs: (residual_out, normed).
pub fn fused_tolerances(dtype: DataType) -> (f64, f64) {
    (tolerance(dtype), 2.0 * tolerance(dtype))
}

/// One rank's fused outputs against the references.
pub fn check_fused(
    normed: &[u8],
    residual_out: &[u8],
    reference: &(Vec<f64>, Vec<f64>),
    dtype: DataType,
) -> [OutputCheck; 2] {
    let (tol_res, tol_norm) = fused_tolerances(dtype);
    [
        check_named(normed, &reference.1, dtype, "normed", tol_norm),
        check_named(residual_out, &reference.0, dtype, "residual_out", tol_res),
    ]
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
            assert!(verdict(&[good.clone(), good.clone()]).is_ok(), "{dtype:?}: {good:?}");
            let wrong = check_output(&a, &reference, dtype);
            assert!(verdict(&[wrong]).unwrap_err().contains("relative error"));
            let mut poisoned = sum.clone();
            poisoned[dtype.size() * 7..dtype.size() * 8].fill(POISON);
            let p = check_output(&poisoned, &reference, dtype);
            assert_eq!(p.first_bad, Some(7));
            assert!(verdict(&[good.clone(), p]).unwrap_err().contains("element 7"));
            let mut other = sum.clone();
            other[0] ^= 1; // one ulp: within tolerance, but not the same bits
            let o = check_output(&other, &reference, dtype);
            assert!(verdict(&[good, o]).unwrap_err().contains("differs"));
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

    #[test]
    fn fused_reference_and_two_outputs_per_rank() {
        let (tokens, hidden) = (3u64, 64u32);
        let count = (tokens * hidden as u64) as usize;
        for dtype in [DataType::Float, DataType::Half, DataType::Bf16] {
            let shared = shared_inputs(2, dtype, tokens, hidden, true);
            assert_eq!(shared, shared_inputs(2, dtype, tokens, hidden, true), "identical on every rank");
            assert_eq!(
                (shared.residual.len(), shared.gamma.len(), shared.bias.len()),
                (count * dtype.size(), hidden as usize * dtype.size(), hidden as usize * dtype.size())
            );
            assert_ne!(shared.residual_f64[..hidden as usize], shared.gamma_f64[..], "different tensors");
            assert!(shared_inputs(2, dtype, tokens, hidden, false).bias.is_empty());
            let mut sum = vec![0f64; count];
            generate(count, dtype, seed(2, 0, 0), Some(&mut sum));
            let reference = fused_reference(&sum, &shared, hidden, 1e-6);
            // Row 1 by hand.
            let h = hidden as usize;
            let row: Vec<f64> = (0..h).map(|i| sum[h + i] + shared.bias_f64[i] + shared.residual_f64[h + i]).collect();
            let rms = (row.iter().map(|v| v * v).sum::<f64>() / h as f64 + 1e-6).sqrt();
            for (i, v) in row.iter().enumerate() {
                assert!((reference.0[h + i] - v).abs() < 1e-12);
                assert!((reference.1[h + i] - v / rms * shared.gamma_f64[i]).abs() < 1e-12);
            }
            let encode = |v: &[f64]| -> Vec<u8> {
                v.iter()
                    .flat_map(|&x| match dtype {
                        DataType::Float => (x as f32).to_ne_bytes().to_vec(),
                        DataType::Half => half::f16::from_f64(x).to_bits().to_ne_bytes().to_vec(),
                        DataType::Bf16 => half::bf16::from_f64(x).to_bits().to_ne_bytes().to_vec(),
                    })
                    .collect()
            };
            let (res, normed) = (encode(&reference.0), encode(&reference.1));
            let good = check_fused(&normed, &res, &reference, dtype);
            let checks: Vec<OutputCheck> = good.iter().chain(good.iter()).cloned().collect();
            assert!(verdict(&checks).is_ok(), "{dtype:?}: {checks:?}");
            let mut other = normed.clone();
            other[0] ^= 1;
            let bad = check_fused(&other, &res, &reference, dtype);
            let checks: Vec<OutputCheck> = good.iter().chain(bad.iter()).cloned().collect();
            assert_eq!(verdict(&checks).unwrap_err(), "rank 1 normed differs from rank 0's");
            // The normed output in place of residual_out is far off.
            let swapped = check_fused(&normed, &normed, &reference, dtype);
            assert!(verdict(&swapped).unwrap_err().contains("rank 0 residual_out: relative error"));
        }
    }
}
