//! Pure arithmetic of the benchmark: percentiles, message-size lists, byte units, bandwidths.

/// Median and spread of the per-call times of the timed batches (µs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    pub median: f64,
    pub p10: f64,
    pub p90: f64,
}

/// The `q`-quantile (0..=1) of `values`, linearly interpolated between order statistics.
pub fn percentile(values: &[f64], q: f64) -> f64 {
    assert!(!values.is_empty(), "percentile of nothing");
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let pos = q.clamp(0.0, 1.0) * (v.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    v[lo] + (v[hi] - v[lo]) * (pos - lo as f64)
}

pub fn summarize(values: &[f64]) -> Summary {
    Summary { median: percentile(values, 0.5), p10: percentile(values, 0.1), p90: percentile(values, 0.9) }
}

/// Per-batch time of a team: the slowest rank of each batch (`per_rank[rank][batch]`).
pub fn slowest_per_batch(per_rank: &[Vec<f64>]) -> Vec<f64> {
    let batches = per_rank.iter().map(Vec::len).min().unwrap_or(0);
    (0..batches).map(|b| per_rank.iter().map(|r| r[b]).fold(f64::MIN, f64::max)).collect()
}

/// Algorithm bandwidth in GB/s (1e9 B/s): message bytes over time.
pub fn algbw_gbps(bytes: u64, us: f64) -> f64 {
    bytes as f64 / (us * 1e-6) / 1e9
}

/// Bus bandwidth (nccl-tests' convention for all-reduce): algbw · 2(N−1)/N, the per-rank link
/// traffic of a bandwidth-optimal all-reduce, comparable across rank counts.
pub fn busbw_gbps(bytes: u64, us: f64, nranks: i32) -> f64 {
    let n = nranks as f64;
    algbw_gbps(bytes, us) * 2.0 * (n - 1.0) / n
}

/// Bytes one rank's kernel reads plus writes in device memory for an all-reduce of `bytes` by
/// the family `path` (the kernels' own accounting at the top of each kernels/*.cu), on
/// simulated ranks, where every "remote" access is one of the same GPU's memory too. Nominal:
/// each access counted once at memory; the L2 serves part of it (the N ranks of a one-shot
/// read the same lines at about the same time), so the roofline fraction computed from it can
/// exceed 100%. The benchmark's simulated ranks are a group of one process whose inputs are not
/// its outputs, so the one-shot and the 4+ rank two-shot read their peers' inputs in place
/// (kernels from compute_90 or newer: `EAR_CALL_POINTERS`). With S the message and f = (N-1)/N:
///   oneshot  (in place) N·S input reads + S output = (N+1)·S;
///   twoshot  2 ranks (twoshot.cu): S input + f·S scatter + f·S stage reads + f·S gather
///            pushes + f·S gather reads + S output + f·S gather zeroing + f·min(S, 8 MiB)
///            stage zeroing; 4+ ranks (twoshot_wide.cu, in place): S input reads (N segments of
///            S/N) + S/N output + S/N sums + f·S sum reads + f·S output = 3·S;
///   lamport  S input + (N-1)·S pushes + (N-1)·S clears + (N-1)·S polls + S output.
pub fn sim_rank_bytes(path: &str, bytes: u64, nranks: i32) -> Option<f64> {
    let (s, n) = (bytes as f64, nranks as f64);
    let f = (n - 1.0) / n;
    // A grid row's path is the family at a grid (`lamport@16`): the same bytes move.
    match path.split('@').next().unwrap_or(path) {
        "oneshot" => Some((n + 1.0) * s),
        "twoshot" if nranks <= 2 => Some((2.0 + 5.0 * f) * s + f * s.min((8u64 << 20) as f64)),
        "twoshot" => Some(3.0 * s),
        "lamport" => Some((3.0 * n - 1.0) * s),
        _ => None,
    }
}

/// Powers of two from `min` (rounded up to one) to `max`, each a multiple of `elem` bytes.
/// `quick` keeps every fourth (×16 apart) plus the largest.
pub fn sizes(min: u64, max: u64, elem: u64, quick: bool) -> Vec<u64> {
    let mut out = Vec::new();
    let mut s = min.max(elem).max(1).next_power_of_two();
    while s <= max {
        if s.is_multiple_of(elem) {
            out.push(s);
        }
        s = match s.checked_mul(2) {
            Some(v) => v,
            None => break,
        };
    }
    if quick && out.len() > 2 {
        let last = *out.last().unwrap();
        let mut q: Vec<u64> = out.iter().copied().step_by(4).collect();
        if q.last() != Some(&last) {
            q.push(last);
        }
        out = q;
    }
    out
}

/// "4096", "4K", "4KB", "4KiB", "64M", "1.5G" (K/M/G are powers of 1024 in every spelling).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num.parse().map_err(|_| format!("'{s}' is not a byte count (e.g. 4096, 64K, 16M, 1G)"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => return Err(format!("'{s}': unknown unit '{unit}' (use K, M or G)")),
    };
    let bytes = value * mult as f64;
    if !(bytes.is_finite() && bytes >= 1.0 && bytes.fract() == 0.0) {
        return Err(format!("'{s}' is not a whole, positive number of bytes"));
    }
    Ok(bytes as u64)
}

/// "1 KiB", "64 MiB", "15.3 MiB", "100 B".
pub fn fmt_bytes(b: u64) -> String {
    for (unit, shift) in [("GiB", 30), ("MiB", 20), ("KiB", 10)] {
        if b >= 1 << shift {
            return if b.is_multiple_of(1 << shift) {
                format!("{} {unit}", b >> shift)
            } else {
                format!("{:.1} {unit}", b as f64 / (1u64 << shift) as f64)
            };
        }
    }
    format!("{b} B")
}

/// Axis label of a size: "1K", "64M".
pub fn fmt_bytes_short(b: f64) -> String {
    let b = b.round() as u64;
    for (unit, shift) in [("G", 30), ("M", 20), ("K", 10)] {
        if b >= 1 << shift {
            let v = b as f64 / (1u64 << shift) as f64;
            return if v.fract() == 0.0 { format!("{v}{unit}") } else { format!("{v:.1}{unit}") };
        }
    }
    format!("{b}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate() {
        let v = [5.0, 1.0, 3.0, 2.0, 4.0];
        assert_eq!(percentile(&v, 0.5), 3.0);
        assert_eq!(percentile(&v, 0.0), 1.0);
        assert_eq!(percentile(&v, 1.0), 5.0);
        assert!((percentile(&v, 0.1) - 1.4).abs() < 1e-12);
        assert_eq!(percentile(&[1.0, 2.0], 0.5), 1.5);
        assert_eq!(percentile(&[7.0], 0.9), 7.0);
        let s = summarize(&[10.0, 10.0, 10.0, 50.0]);
        assert_eq!(s.median, 10.0);
        assert!(s.p90 > s.median && s.p10 == 10.0);
    }

    #[test]
    fn the_slowest_rank_of_each_batch() {
        let per_rank = vec![vec![1.0, 5.0, 3.0], vec![2.0, 4.0, 3.5]];
        assert_eq!(slowest_per_batch(&per_rank), vec![2.0, 5.0, 3.5]);
        assert!(slowest_per_batch(&[]).is_empty());
    }

    #[test]
    fn bandwidths() {
        // 1 MB in 1 µs is 1000 GB/s; 2 ranks: busbw = algbw.
        assert!((algbw_gbps(1_000_000, 1.0) - 1000.0).abs() < 1e-9);
        assert!((busbw_gbps(1_000_000, 1.0, 2) - 1000.0).abs() < 1e-9);
        assert!((busbw_gbps(1_000_000, 1.0, 8) - 1750.0).abs() < 1e-9);
        assert_eq!(sim_rank_bytes("oneshot", 1 << 20, 2), Some(3.0 * (1 << 20) as f64), "2 ranks read inputs in place");
        assert_eq!(sim_rank_bytes("oneshot", 1 << 20, 4), Some(5.0 * (1 << 20) as f64), "4 ranks read inputs in place");
        assert_eq!(sim_rank_bytes("twoshot", 1 << 20, 4), Some(3.0 * (1 << 20) as f64));
        assert_eq!(sim_rank_bytes("twoshot", 1 << 20, 2), Some(5.0 * (1 << 20) as f64));
        assert_eq!(sim_rank_bytes("twoshot", 64 << 20, 2), Some(4.5 * (64 << 20) as f64 + (4 << 20) as f64));
        assert_eq!(sim_rank_bytes("lamport", 1 << 20, 8), Some(23.0 * (1 << 20) as f64));
        assert_eq!(sim_rank_bytes("nccl", 1 << 20, 8), None);
    }

    #[test]
    fn size_lists() {
        let all = sizes(1024, 64 << 20, 2, false);
        assert_eq!(all.len(), 17);
        assert_eq!((all[0], *all.last().unwrap()), (1024, 64 << 20));
        assert_eq!(sizes(1000, 5000, 2, false), vec![1024, 2048, 4096]);
        assert_eq!(sizes(1, 8, 4, false), vec![4, 8], "at least one element");
        let quick = sizes(1024, 64 << 20, 2, true);
        assert_eq!(quick, vec![1 << 10, 16 << 10, 256 << 10, 4 << 20, 64 << 20]);
        assert_eq!(sizes(1024, 32 << 20, 2, true).last(), Some(&(32 << 20)), "the largest is kept");
        assert!(sizes(4096, 1024, 2, false).is_empty());
    }

    #[test]
    fn byte_units() {
        assert_eq!(parse_bytes("4096").unwrap(), 4096);
        assert_eq!(parse_bytes("1K").unwrap(), 1024);
        assert_eq!(parse_bytes("64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_bytes("16mb").unwrap(), 16 << 20);
        assert_eq!(parse_bytes("1.5G").unwrap(), 3 << 29);
        assert!(
            parse_bytes("x").is_err()
                && parse_bytes("4Q").is_err()
                && parse_bytes("0").is_err()
                && parse_bytes("1.3").is_err()
        );
        assert_eq!(fmt_bytes(1024), "1 KiB");
        assert_eq!(fmt_bytes(64 << 20), "64 MiB");
        assert_eq!(fmt_bytes(16_000_000), "15.3 MiB");
        assert_eq!(fmt_bytes(100), "100 B");
        assert_eq!(fmt_bytes(1536), "1.5 KiB");
        assert_eq!(fmt_bytes_short(1024.0), "1K");
        assert_eq!(fmt_bytes_short((64u64 << 20) as f64), "64M");
        assert_eq!(fmt_bytes_short(512.0), "512");
    }
}
