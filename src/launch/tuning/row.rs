//! One row of a tuning file: its fields, read strictly.

use super::*;

/// The file ends before `what`.
pub(super) fn cut_short(what: &str) -> TuningError {
    TuningError::new(TuningErrorKind::Truncated, None, format!("the file ends before {what}: it is cut short"))
}

/// The next line, which must be the header field `key:` with a value: its number and value.
pub(super) fn next_field<'a>(
    lines: &mut impl Iterator<Item = (usize, &'a str)>,
    key: &str,
) -> Result<(usize, String), TuningError> {
    let syntax = |n: usize, m: String| TuningError::new(TuningErrorKind::Syntax, Some(n), m);
    let Some((n, l)) = lines.next() else {
        return Err(cut_short(&format!("its '{key}:' line")));
    };
    match l.strip_prefix(key).and_then(|r| r.strip_prefix(':')) {
        Some(v) if !v.trim().is_empty() => Ok((n, v.trim().to_owned())),
        Some(_) => Err(syntax(n, format!("'{key}:' is empty"))),
        None => Err(syntax(n, format!("expected the '{key}:' line, found '{l}'"))),
    }
}

/// One row line: `<op> ranks=<n> dtype=<t> [rows=<w>] upto=<bytes> <way>`.
pub(super) fn parse_row(n: usize, line: &str) -> Result<(SectionKey, u64, FusedChoice), TuningError> {
    let syntax = |m: String| Err(TuningError::new(TuningErrorKind::Syntax, Some(n), m));
    let words: Vec<&str> = line.split_whitespace().collect();
    let op = match words.first() {
        Some(&"plain") => TunedOp::Plain,
        Some(&"fused") => TunedOp::Fused,
        _ => return syntax(format!("'{line}' is not a row (plain ... or fused ...) nor the end line")),
    };
    let keys: &[&str] = match op {
        TunedOp::Plain => &["ranks", "dtype", "upto"],
        TunedOp::Fused => &["ranks", "dtype", "rows", "upto"],
    };
    if words.len() != keys.len() + 2 {
        let shape = keys.iter().map(|k| format!("{k}=...")).collect::<Vec<_>>().join(" ");
        return syntax(format!("'{line}': expected '{} {shape} <way>'", words[0]));
    }
    let mut values = Vec::new();
    for (key, word) in keys.iter().zip(&words[1..]) {
        match word.split_once('=') {
            Some((k, v)) if k == *key => values.push(v),
            _ => return syntax(format!("'{word}': expected {key}=...")),
        }
    }
    let Some(nranks) = values[0].parse::<i32>().ok() else {
        return syntax(format!("ranks={}: not a rank count", values[0]));
    };
    let Some(dtype) = parse_dtype(values[1]) else {
        return syntax(format!("dtype={}: not fp32, fp16, bf16 or any", values[1]));
    };
    let width = match op {
        TunedOp::Plain => None,
        TunedOp::Fused => Some(match values[2] {
            "narrow" => RowWidth::Narrow,
            "wide" => RowWidth::Wide,
            "any" => RowWidth::Any,
            w => return syntax(format!("rows={w}: not narrow, wide or any")),
        }),
    };
    let bound_text = values[values.len() - 1];
    let Some(bound) = parse_bound(bound_text) else {
        return syntax(format!("upto={bound_text}: not a byte count (4096, 64K, 2M, 1G) nor max"));
    };
    let way_text = words[words.len() - 1];
    let Some(way) = parse_way(op, way_text) else {
        let known = match op {
            TunedOp::Plain => "lamport, oneshot, twoshot, nccl",
            TunedOp::Fused => "fused:<family>, split:<family>, nccl; families lamport, oneshot, twoshot",
        };
        return syntax(format!("'{way_text}' is not a way ({known})"));
    };
    Ok((SectionKey { op, nranks, dtype, width }, bound, way))
}
