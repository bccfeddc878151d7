//! The PNG: per-call latency (graph replay median) against message size, log-log, one panel
//! per (mode, ranks, dtype) and one more per fused sweep (against the bytes of x), one line per
//! strategy, the simulation floor as a grey line. Text
//! needs a TrueType font loaded at run time; without one the plot is drawn without text.

use crate::record::{self, Record, Status, FLOOR};
use crate::stats::fmt_bytes_short;
use plotters::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

pub const DEFAULT_FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";
const OTHER_FONTS: &[&str] = &[
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/freefont/FreeSans.ttf",
    "/usr/share/fonts/truetype/noto/NotoSans-Regular.ttf",
    "/usr/share/fonts/noto/NotoSans-Regular.ttf",
    "/usr/share/fonts/google-noto/NotoSans-Regular.ttf",
    "/Library/Fonts/Arial Unicode.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
];
const FAMILY: &str = "sans-serif";

/// Registers the first readable font of `explicit`, then the common locations; the file used,
/// or None (the plot then has no text).
pub fn load_font(explicit: Option<&Path>) -> Option<PathBuf> {
    static LOADED: OnceLock<Option<PathBuf>> = OnceLock::new();
    LOADED
        .get_or_init(|| {
            let candidates = explicit
                .map(Path::to_path_buf)
                .into_iter()
                .chain(std::iter::once(PathBuf::from(DEFAULT_FONT)))
                .chain(OTHER_FONTS.iter().map(PathBuf::from));
            for path in candidates {
                let Ok(bytes) = std::fs::read(&path) else { continue };
                // plotters keeps fonts for the life of the process.
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font(FAMILY, FontStyle::Normal, bytes).is_ok() {
                    return Some(path);
                }
            }
            None
        })
        .clone()
}

fn color(strategy: &str, i: usize) -> RGBColor {
    match strategy {
        // Fused panels: a fused family in its plain family's colour, the baselines in brown
        // (our all-reduce, then the norm) and black (NCCL, then the norm).
        "nccl" | "nccl_then_norm" => RGBColor(0, 0, 0),
        "oneshot" | "fused_oneshot" => RGBColor(31, 119, 180),
        "twoshot" | "fused_twoshot" => RGBColor(44, 160, 44),
        "lamport" | "fused_lamport" => RGBColor(214, 39, 40),
        "auto" | "fused_auto" => RGBColor(255, 127, 14),
        "plugin" | "plugin_fused" => RGBColor(148, 103, 189),
        "ar_then_norm" => RGBColor(140, 86, 75),
        _ => [RGBColor(140, 86, 75), RGBColor(227, 119, 194), RGBColor(23, 190, 207), RGBColor(188, 189, 34)][i % 4],
    }
}

type Err = Box<dyn std::error::Error>;

fn panel(area: &DrawingArea<BitMapBackend, plotters::coord::Shift>, group: &[&Record], text: bool) -> Result<(), Err> {
    let first = group[0];
    let names = record::strategies(group);
    let series: Vec<(String, Vec<(f64, f64)>)> = names
        .iter()
        .map(|n| {
            let mut pts: Vec<(f64, f64)> = group
                .iter()
                .filter(|r| &r.strategy == n && r.status == Status::Ok && r.bytes > 0)
                .filter_map(|r| r.median_us.map(|t| ((r.bytes as f64).log2(), t)))
                .collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            (n.clone(), pts)
        })
        .filter(|(_, p)| !p.is_empty())
        .collect();
    let floor = group.iter().find(|r| r.strategy == FLOOR && r.status == Status::Ok).and_then(|r| r.median_us);
    let all = series.iter().flat_map(|(_, p)| p.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in all {
        (x0, x1, y0, y1) = (x0.min(x), x1.max(x), y0.min(y), y1.max(y));
    }
    if x0 > x1 {
        return Ok(()); // nothing measured
    }
    if let Some(f) = floor {
        (y0, y1) = (y0.min(f), y1.max(f));
    }
    // x is log2(bytes) on a linear axis, so that ticks fall on powers of two.
    (x0, x1) = (x0 - 0.3, x1 + 0.3);
    let (y0, y1) = (y0 * 0.8, y1 * 1.25);

    let mut builder = ChartBuilder::on(area);
    builder.margin(18);
    if text {
        let what = if first.is_fused() { " · fused AR + residual + RMSNorm" } else { "" };
        let title = format!("{} · {} ranks · {}{what} · {}", first.mode, first.ranks, first.dtype, first.device);
        builder.caption(title, (FAMILY, 20)).x_label_area_size(48).y_label_area_size(64);
    }
    let mut chart = builder.build_cartesian_2d(x0..x1, (y0..y1).log_scale())?;
    let span = (x1 - x0).round() as usize;
    let mut mesh = chart.configure_mesh();
    mesh.light_line_style(RGBColor(235, 235, 235)).bold_line_style(RGBColor(205, 205, 205));
    if text {
        let (x_desc, y_desc) = if first.is_fused() {
            ("x size (tokens · hidden · element bytes)", "µs per fused op (graph replay, median)")
        } else {
            ("message size (bytes)", "µs per all-reduce (graph replay, median)")
        };
        mesh.x_desc(x_desc)
            .y_desc(y_desc)
            .x_labels(if span > 12 { span / 2 + 1 } else { span + 1 })
            .x_label_formatter(&|x| fmt_bytes_short(x.exp2()))
            .y_labels(12)
            .y_label_formatter(&|y| if *y >= 10.0 { format!("{y:.0}") } else { format!("{y:.1}") })
            .label_style((FAMILY, 14))
            .axis_desc_style((FAMILY, 15));
    } else {
        mesh.x_labels(0).y_labels(0);
    }
    mesh.draw()?;
    for (i, (name, pts)) in series.iter().enumerate() {
        let c = color(name, i);
        let width = if record::is_meta(name) { 1 } else { 2 };
        chart
            .draw_series(LineSeries::new(pts.clone(), c.stroke_width(width)))?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 22, y)], c.stroke_width(3)));
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, if width == 1 { 2 } else { 3 }, c.filled())))?;
    }
    if let Some(f) = floor {
        let grey = RGBColor(150, 150, 150);
        chart
            .draw_series(LineSeries::new(vec![(x0, f), (x1, f)], grey.stroke_width(1)))?
            .label("floor (fork/join, empty kernels)")
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 22, y)], grey.stroke_width(1)));
    }
    if text {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(120, 120, 120))
            .label_font((FAMILY, 14))
            .draw()?;
    }
    Ok(())
}

/// Writes the PNG of `records` to `path`; returns the font used (None: no text).
pub fn render(records: &[Record], path: &Path, font: Option<&Path>) -> Result<Option<PathBuf>, String> {
    let font = load_font(font);
    draw(records, path, font.is_some())?;
    Ok(font)
}

fn draw(records: &[Record], path: &Path, text: bool) -> Result<(), String> {
    let groups: Vec<Vec<&Record>> = record::groups(records)
        .into_iter()
        .filter(|g| {
            g.iter().any(|r| r.status == Status::Ok && r.bytes > 0 && r.strategy != FLOOR && r.strategy != record::COPY)
        })
        .collect();
    if groups.is_empty() {
        return Err("nothing to plot: no row was measured".into());
    }
    let n = groups.len();
    let cols = n.min(2);
    let rows = n.div_ceil(cols);
    let (w, h) = (900u32, 620u32);
    let draw = || -> Result<(), Err> {
        let root = BitMapBackend::new(path, (w * cols as u32, h * rows as u32)).into_drawing_area();
        root.fill(&WHITE)?;
        for (area, group) in root.split_evenly((rows, cols)).iter().zip(&groups) {
            panel(area, group, text)?;
        }
        root.present()?;
        Ok(())
    };
    draw().map_err(|e| format!("drawing {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Synthetic results: two groups, every kind of row.
    pub(crate) fn sample() -> Vec<Record> {
        let mut out = Vec::new();
        for (mode, ranks) in [("sim", 2), ("real", 8)] {
            let mut floor = Record::new(mode, ranks, "bf16", 0, FLOOR, "GPU 0");
            floor.status = Status::Ok;
            floor.median_us = Some(3.0);
            out.push(floor);
            for k in 10..=26u32 {
                let bytes = 1u64 << k;
                for (i, s) in ["nccl", "oneshot", "twoshot", "lamport", "auto"].iter().enumerate() {
                    let mut r = Record::new(mode, ranks, "bf16", bytes, s, "GPU 0");
                    r.status = if *s == "lamport" && k > 21 { Status::NotApplicable } else { Status::Ok };
                    if r.status == Status::Ok {
                        r.median_us = Some(4.0 + i as f64 + bytes as f64 / (200_000.0 + 50_000.0 * i as f64));
                        r.path = "oneshot".into();
                    }
                    out.push(r);
                }
            }
        }
        out
    }

    #[test]
    fn draws_without_a_font() {
        // No font is registered in this process: any text drawn would fail.
        let path = std::env::temp_dir().join(format!("edgellm-bench-plot-{}.png", std::process::id()));
        draw(&sample(), &path, false).unwrap();
        let png = std::fs::read(&path).unwrap();
        assert_eq!(&png[1..4], b"PNG");
        assert!(png.len() > 10_000, "{} bytes", png.len());
        std::fs::remove_file(&path).ok();
        assert!(draw(&[], &path, false).is_err(), "nothing to plot");
    }
}
