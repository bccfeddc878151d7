//! The file's text: tokens, rows, sections, and [`Tuning::parse`] / [`Tuning::to_text`].

use super::*;

pub(super) fn dtype_token(dtype: Option<DataType>) -> &'static str {
    match dtype {
        None => "any",
        Some(DataType::Float) => "fp32",
        Some(DataType::Half) => "fp16",
        Some(DataType::Bf16) => "bf16",
    }
}

pub(super) fn parse_dtype(token: &str) -> Option<Option<DataType>> {
    match token {
        "any" => Some(None),
        "fp32" => Some(Some(DataType::Float)),
        "fp16" => Some(Some(DataType::Half)),
        "bf16" => Some(Some(DataType::Bf16)),
        _ => None,
    }
}

pub(super) fn width_token(width: RowWidth) -> &'static str {
    match width {
        RowWidth::Narrow => "narrow",
        RowWidth::Wide => "wide",
        RowWidth::Any => "any",
    }
}

pub(super) fn family_token(family: Family) -> &'static str {
    family.name()
}

pub(super) fn parse_family(token: &str) -> Option<Family> {
    Family::ALL.into_iter().find(|f| f.name() == token)
}

/// The word of a way in a section of `op`: `oneshot` / `nccl` (plain), `fused:lamport` /
/// `split:twoshot` / `nccl` (fused).
pub(super) fn way_token(op: TunedOp, way: FusedChoice) -> String {
    match (op, way) {
        (_, FusedChoice::Nccl) => "nccl".to_owned(),
        (TunedOp::Plain, FusedChoice::Fused(f)) => family_token(f).to_owned(),
        (TunedOp::Plain, FusedChoice::Split(f)) => format!("split:{}", family_token(f)),
        (TunedOp::Fused, FusedChoice::Fused(f)) => format!("fused:{}", family_token(f)),
        (TunedOp::Fused, FusedChoice::Split(f)) => format!("split:{}", family_token(f)),
    }
}

pub(super) fn parse_way(op: TunedOp, token: &str) -> Option<FusedChoice> {
    if token == "nccl" {
        return Some(FusedChoice::Nccl);
    }
    match (op, token.split_once(':')) {
        (TunedOp::Plain, None) => parse_family(token).map(FusedChoice::Fused),
        (TunedOp::Fused, Some(("fused", f))) => parse_family(f).map(FusedChoice::Fused),
        (TunedOp::Fused, Some(("split", f))) => parse_family(f).map(FusedChoice::Split),
        _ => None,
    }
}

/// `4096`, `64K`, `2M`, `1G` (powers of 1024), or `max`.
pub(super) fn parse_bound(token: &str) -> Option<u64> {
    if token == "max" {
        return Some(u64::MAX);
    }
    let (digits, shift) = match token.as_bytes().last()? {
        b'K' => (&token[..token.len() - 1], 10),
        b'M' => (&token[..token.len() - 1], 20),
        b'G' => (&token[..token.len() - 1], 30),
        _ => (token, 0),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let value: u64 = digits.parse().ok()?;
    // u64::MAX is spelled `max`: a number that large (or larger once scaled) is refused.
    value.checked_mul(1u64 << shift).filter(|&b| b != u64::MAX && b > 0)
}

pub(super) fn bound_token(bound: u64) -> String {
    if bound == u64::MAX {
        "max".to_owned()
    } else {
        bound.to_string()
    }
}

impl fmt::Display for SectionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = match self.op {
            TunedOp::Plain => "plain",
            TunedOp::Fused => "fused",
        };
        write!(f, "{op} ranks={} dtype={}", self.nranks, dtype_token(self.dtype))?;
        if let Some(w) = self.width {
            write!(f, " rows={}", width_token(w))?;
        }
        Ok(())
    }
}

/// A grid line as the file spells it.
pub(super) fn grid_text(g: GridCap) -> String {
    format!("grid ranks={} {} ctas={}", g.nranks, family_token(g.family), g.ctas)
}

/// One grid line: `grid ranks=<n> <family> ctas=<c>`.
pub(super) fn parse_grid(n: usize, line: &str) -> Result<GridCap, TuningError> {
    let syntax = |m: String| TuningError::new(TuningErrorKind::Syntax, Some(n), m);
    let words: Vec<&str> = line.split_whitespace().collect();
    let [_, ranks, family, ctas] = words.as_slice() else {
        return Err(syntax(format!("'{line}': expected 'grid ranks=<n> <family> ctas=<c>'")));
    };
    let nranks = ranks.strip_prefix("ranks=").and_then(|v| v.parse::<i32>().ok());
    let count =
        ctas.strip_prefix("ctas=").and_then(|v| v.parse::<u32>().ok()).filter(|c| (1..=EAR_MAX_BLOCKS).contains(c));
    match (nranks, parse_family(family), count) {
        (Some(nranks), Some(family), Some(ctas)) => Ok(GridCap { nranks, family, ctas }),
        (None, _, _) => Err(syntax(format!("'{ranks}': expected ranks=<n>"))),
        (_, None, _) => Err(syntax(format!("'{family}' is not a family"))),
        (_, _, None) => Err(syntax(format!("'{ctas}': expected ctas=<1..{EAR_MAX_BLOCKS}>"))),
    }
}

/// One row as the file spells it.
pub(super) fn row_text(key: &SectionKey, bound: u64, way: FusedChoice) -> String {
    format!("{key} upto={} {}", bound_token(bound), way_token(key.op, way))
}

/// The lines that matter, numbered from 1: blank lines and `#` comments skipped, ends trimmed.
pub(super) fn content_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines().enumerate().map(|(i, l)| (i + 1, l.trim())).filter(|(_, l)| !l.is_empty() && !l.starts_with('#'))
}

/// Checks the table rules of `sections`; `line(s, r)` is the line of row `r` of section `s`
/// (None for tables not read from a file).
pub(super) fn check_sections(
    sections: &[Section],
    line: &dyn Fn(usize, usize) -> Option<usize>,
) -> Result<(), TuningError> {
    let table = |l: Option<usize>, m: String| Err(TuningError::new(TuningErrorKind::Table, l, m));
    if sections.is_empty() {
        return table(None, "no table rows".to_owned());
    }
    for (s, section) in sections.iter().enumerate() {
        let key = &section.key;
        let first = line(s, 0);
        if !RANK_COUNTS.contains(&key.nranks) {
            return table(first, format!("ranks={}: the kernels exist for {RANK_COUNTS:?} ranks", key.nranks));
        }
        if (key.op == TunedOp::Fused) != key.width.is_some() {
            return table(first, format!("{key}: a fused section has a rows= class, a plain one none"));
        }
        if let Some(other) = sections[..s].iter().position(|o| o.key == section.key) {
            let at = |l: Option<usize>| l.map_or(String::new(), |l| format!(" (line {l})"));
            return table(
                first,
                format!(
                    "the rows of {key} are in two places{} and{}: a section's rows are together",
                    at(line(other, 0)),
                    at(first)
                ),
            );
        }
        let Some(&(last, _)) = section.rows.last() else {
            return table(first, format!("{key} has no rows"));
        };
        for (r, &(bound, way)) in section.rows.iter().enumerate() {
            if key.op == TunedOp::Plain && matches!(way, FusedChoice::Split(_)) {
                return table(line(s, r), format!("{key}: only the fused op splits"));
            }
            if r > 0 && bound <= section.rows[r - 1].0 {
                return table(
                    line(s, r),
                    format!(
                        "{key}: upto={} after upto={}: the bounds must increase",
                        bound_token(bound),
                        bound_token(section.rows[r - 1].0)
                    ),
                );
            }
        }
        if last != u64::MAX {
            return table(
                line(s, section.rows.len() - 1),
                format!("{key}: the last row ends at {last} bytes: it must be upto=max"),
            );
        }
    }
    Ok(())
}

impl Tuning {
    /// Parses and checks a file's text (everything but whether it was measured here:
    /// [`Tuning::check`]).
    pub fn parse(text: &str) -> Result<Tuning, TuningError> {
        use TuningErrorKind::*;
        let mut lines = content_lines(text).peekable();
        // The version line.
        let Some((n, first)) = lines.next() else {
            return Err(TuningError::new(NotTuning, None, "the file is empty"));
        };
        let Some(version) = first.strip_prefix(MAGIC) else {
            return Err(TuningError::new(
                NotTuning,
                Some(n),
                format!("not a tuning file: the first line must be '{MAGIC} v{FORMAT_VERSION}'"),
            ));
        };
        let version = version
            .trim()
            .strip_prefix('v')
            .and_then(|v| v.parse::<u32>().ok())
            .ok_or_else(|| TuningError::new(Syntax, Some(n), format!("'{first}': no version number")))?;
        if version != FORMAT_VERSION {
            let age = if version < FORMAT_VERSION {
                "an older format: tune again with this library's edgellm-allreduce-bench"
            } else {
                "a newer format than this library reads"
            };
            return Err(TuningError::new(
                Version,
                Some(n),
                format!("format v{version} is {age} (it reads v{FORMAT_VERSION})"),
            ));
        }
        // The header fields, in order.
        let (_, host) = next_field(&mut lines, "machine")?;
        let (_, driver) = next_field(&mut lines, "driver")?;
        let mut gpus: Vec<Gpu> = Vec::new();
        loop {
            let (n, value) = next_field(&mut lines, "gpu")?;
            let Some((bus_id, name)) = value.split_once(char::is_whitespace) else {
                return Err(TuningError::new(Syntax, Some(n), "'gpu:' needs a PCI bus id and a name"));
            };
            if gpus.last().is_some_and(|g| g.bus_id.as_str() >= bus_id) {
                return Err(TuningError::new(
                    Syntax,
                    Some(n),
                    format!("gpu {bus_id}: the GPUs are listed once each, by bus id"),
                ));
            }
            gpus.push(Gpu { bus_id: bus_id.to_owned(), name: name.trim().to_owned() });
            if !lines.peek().is_some_and(|(_, l)| l.starts_with("gpu:")) {
                break;
            }
        }
        let (n, links) = next_field(&mut lines, "links")?;
        let links = match LinkClass::from_token(&links) {
            Some(LinkClass::NoPeer) => {
                return Err(TuningError::new(
                    Table,
                    Some(n),
                    "links: no-peer: no custom kernel runs without peer access, so there is nothing to tune",
                ))
            }
            Some(class) => class,
            None => {
                return Err(TuningError::new(
                    Syntax,
                    Some(n),
                    format!("links: '{links}' is not same-device, nvlink or pcie"),
                ))
            }
        };
        let (_, library) = next_field(&mut lines, "library")?;
        // The grid lines (none in a file of an older tune), each (rank count, family) once.
        let mut grids: Vec<GridCap> = Vec::new();
        while let Some(&(n, l)) = lines.peek().filter(|(_, l)| l.starts_with("grid ")) {
            let g = parse_grid(n, l)?;
            if !RANK_COUNTS.contains(&g.nranks) || grids.iter().any(|o| o.nranks == g.nranks && o.family == g.family) {
                return Err(TuningError::new(
                    Table,
                    Some(n),
                    format!("'{l}': a rank count of {RANK_COUNTS:?}, each family once"),
                ));
            }
            grids.push(g);
            lines.next();
        }
        // The rows, then the end line.
        let mut sections: Vec<Section> = Vec::new();
        let mut row_lines: Vec<Vec<usize>> = Vec::new();
        let mut rows = 0usize;
        let (end_line, count) = loop {
            let Some((n, l)) = lines.next() else {
                return Err(cut_short("its end line"));
            };
            if let Some(count) = l.strip_prefix("end") {
                break (n, count.trim());
            }
            let (key, bound, way) = parse_row(n, l)?;
            match sections.last_mut() {
                Some(s) if s.key == key => s.rows.push((bound, way)),
                _ => {
                    sections.push(Section { key, rows: vec![(bound, way)] });
                    row_lines.push(Vec::new());
                }
            }
            if let Some(lines) = row_lines.last_mut() {
                lines.push(n);
            }
            rows += 1;
        };
        // `end rows=<r>`, and ` grids=<g>` where there are grid lines: a line lost or added is
        // caught either way.
        let (rows_text, grids_text) = count.split_once(' ').unwrap_or((count, "grids=0"));
        let number = |text: &str, key: &str| text.trim().strip_prefix(key).and_then(|c| c.parse::<usize>().ok());
        let (Some(counted), Some(counted_grids)) = (number(rows_text, "rows="), number(grids_text, "grids=")) else {
            return Err(TuningError::new(
                Syntax,
                Some(end_line),
                format!("'end {count}': expected 'end rows=<count>' or 'end rows=<count> grids=<count>'"),
            ));
        };
        if counted != rows || counted_grids != grids.len() {
            return Err(TuningError::new(
                Truncated,
                Some(end_line),
                format!(
                    "the end line counts {counted} rows and {counted_grids} grid lines, the file has {rows} and {}: lines were lost or added",
                    grids.len()
                ),
            ));
        }
        if let Some((n, l)) = lines.next() {
            return Err(TuningError::new(Syntax, Some(n), format!("'{l}' after the end line (line {end_line})")));
        }
        check_sections(&sections, &|s, r| row_lines.get(s).and_then(|l| l.get(r)).copied())?;
        Ok(Tuning { machine: Machine { host, driver, gpus }, links, library, grids, sections })
    }

    /// The file's text ([`Tuning::parse`] of it gives `self` back).
    pub fn to_text(&self) -> String {
        let mut out = format!("{MAGIC} v{FORMAT_VERSION}\n");
        out += &format!("machine: {}\n", self.machine.host);
        out += &format!("driver: {}\n", self.machine.driver);
        for g in &self.machine.gpus {
            out += &format!("gpu: {} {}\n", g.bus_id, g.name);
        }
        out += &format!("links: {}\n", self.links.token());
        out += &format!("library: {}\n", self.library);
        for &g in &self.grids {
            out += &grid_text(g);
            out.push('\n');
        }
        out += &self.rows_text();
        out += &format!("end rows={}", self.sections.iter().map(|s| s.rows.len()).sum::<usize>());
        if !self.grids.is_empty() {
            out += &format!(" grids={}", self.grids.len());
        }
        out.push('\n');
        out
    }

    fn rows_text(&self) -> String {
        let mut out = String::new();
        for s in &self.sections {
            for &(bound, way) in &s.rows {
                out += &row_text(&s.key, bound, way);
                out.push('\n');
            }
        }
        out
    }
}
