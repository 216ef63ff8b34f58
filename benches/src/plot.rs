//! `--plot` and `ampccl-perf plot`: bus bandwidth against size (log-x axis) of one or more
//! ampccl-perf CSV files, one line per file, into a PNG.
//!
//! Text is drawn with DejaVu Sans compiled into the binary (plotters' `ab_glyph` backend), so
//! plotting needs no system fonts.

use std::path::{Path, PathBuf};
use std::sync::Once;

use plotters::prelude::*;

use crate::cli::human_bytes;
use crate::csv::{self, Row};

/// Which half of a sweep to plot.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Out-of-place (what MPI benchmarks measure).
    Out,
    /// In-place.
    In,
}

impl Placement {
    fn csv_name(self) -> &'static str {
        match self {
            Placement::Out => "out",
            Placement::In => "in",
        }
    }
}

/// One line of the plot.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub label: String,
    /// (bytes, busbw GB/s), sorted by bytes.
    pub points: Vec<(usize, f64)>,
}

/// A run inside a CSV: (collective, ranks).
type RunKey = (String, usize);

/// The series of one CSV's rows: one per (collective, ranks) found, labelled `label` (with the
/// collective and rank count added when the file holds more than one).
pub fn series(label: &str, rows: &[Row], placement: Placement) -> Result<Vec<Series>, String> {
    let mut groups: Vec<(RunKey, Vec<(usize, f64)>)> = Vec::new();
    for r in rows.iter().filter(|r| r.placement == placement.csv_name()) {
        let key = (r.collective.clone(), r.ranks);
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, pts)) => pts.push((r.bytes, r.busbw_gbs)),
            None => groups.push((key, vec![(r.bytes, r.busbw_gbs)])),
        }
    }
    if groups.is_empty() {
        return Err(format!(
            "{label}: no {}-of-place rows",
            placement.csv_name()
        ));
    }
    let many = groups.len() > 1;
    Ok(groups
        .into_iter()
        .map(|((coll, ranks), mut points)| {
            points.sort_by_key(|p| p.0);
            let label = if many {
                format!("{label} ({coll}, {ranks} ranks)")
            } else {
                label.to_string()
            };
            Series { label, points }
        })
        .collect())
}

/// Line colours (matplotlib's "tab10"), distinct and readable on white; reused past ten.
const COLORS: [RGBColor; 10] = [
    RGBColor(214, 39, 40),
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

fn color(i: usize) -> RGBColor {
    COLORS[i % COLORS.len()]
}

/// The legend of a CSV file: its file stem.
pub fn label_of(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

/// Reads every CSV and returns their series, in order.
pub fn read_series(paths: &[PathBuf], placement: Placement) -> Result<Vec<Series>, String> {
    let mut all = Vec::new();
    for p in paths {
        all.extend(series(&label_of(p), &csv::read(p)?, placement)?);
    }
    Ok(all)
}

/// `ampccl-perf plot`: every CSV as one line (or more, see [`series`]) into `--out`.
pub fn run(a: &crate::cli::PlotArgs) -> Result<(), String> {
    let series = read_series(&a.csv, a.placement)?;
    let title = match &a.title {
        Some(t) => t.clone(),
        None => {
            let first = csv::read(&a.csv[0])?;
            match first.first() {
                Some(r) => format!("{}, {} ranks, {}", r.collective, r.ranks, r.dtype),
                None => "busbw".to_string(),
            }
        }
    };
    draw(&a.out, &title, &series)
}

fn register_font() -> Result<(), String> {
    static ONCE: Once = Once::new();
    let mut result = Ok(());
    ONCE.call_once(|| {
        result = plotters::style::register_font(
            "sans-serif",
            FontStyle::Normal,
            dejavu::sans::regular(),
        )
        .map_err(|_| "the embedded DejaVu Sans font does not load".to_string());
    });
    result
}

/// Draws `series` as busbw (GB/s) against size (log2 axis) into the PNG `out`.
pub fn draw(out: &Path, title: &str, series: &[Series]) -> Result<(), String> {
    register_font()?;
    let pts = || series.iter().flat_map(|s| s.points.iter());
    let (lo, hi) = pts().fold((usize::MAX, 0usize), |(lo, hi), &(b, _)| {
        (lo.min(b.max(1)), hi.max(b))
    });
    if hi == 0 {
        return Err("nothing to plot: no points".into());
    }
    let x0 = (lo as f64).log2().floor();
    let x1 = (hi as f64).log2().ceil().max(x0 + 1.0);
    let ymax = pts().map(|p| p.1).fold(0.0f64, f64::max).max(1e-3) * 1.1;
    let err = |e: &dyn std::fmt::Display| format!("cannot plot {}: {e}", out.display());

    let root = BitMapBackend::new(out, (960, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .margin_right(40)
        .x_label_area_size(44)
        .y_label_area_size(60)
        .build_cartesian_2d(x0..x1, 0.0..ymax)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_labels((x1 - x0) as usize / 2 + 1)
        .x_label_formatter(&|v| {
            if v.fract() == 0.0 && (0.0..63.0).contains(v) {
                human_bytes(1usize << *v as u32)
            } else {
                String::new()
            }
        })
        .x_desc("size (bytes, log scale)")
        .y_desc("busbw (GB/s)")
        .label_style(("sans-serif", 14))
        .light_line_style(WHITE)
        .draw()
        .map_err(|e| err(&e))?;
    for (i, s) in series.iter().enumerate() {
        let color = color(i);
        let xy = |&(b, y): &(usize, f64)| ((b.max(1) as f64).log2(), y);
        chart
            .draw_series(LineSeries::new(
                s.points.iter().map(xy),
                color.stroke_width(2),
            ))
            .map_err(|e| err(&e))?
            .label(s.label.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(3))
            });
        chart
            .draw_series(
                s.points
                    .iter()
                    .map(|p| Circle::new(xy(p), 3, color.filled())),
            )
            .map_err(|e| err(&e))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(("sans-serif", 15))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(coll: &str, bytes: usize, placement: &str, busbw: f64) -> Row {
        Row {
            collective: coll.into(),
            ranks: 2,
            bytes,
            count: bytes / 4,
            dtype: "float".into(),
            redop: "sum".into(),
            root: -1,
            placement: placement.into(),
            time_us: 1.0,
            algbw_gbs: busbw,
            busbw_gbs: busbw,
            wrong: 0,
        }
    }

    #[test]
    fn series_keep_one_placement_sorted_and_split_collectives() {
        let rows = vec![
            row("allreduce", 1024, "out", 2.0),
            row("allreduce", 8, "out", 0.1),
            row("allreduce", 8, "in", 9.0),
        ];
        let s = series("impi", &rows, Placement::Out).unwrap();
        assert_eq!(
            s,
            vec![Series {
                label: "impi".into(),
                points: vec![(8, 0.1), (1024, 2.0)]
            }]
        );
        let mixed = vec![
            row("allreduce", 8, "out", 0.1),
            row("allgather", 8, "out", 0.2),
        ];
        let s = series("x", &mixed, Placement::Out).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s[1].label, "x (allgather, 2 ranks)");
        assert!(series("x", &rows, Placement::In).is_ok());
        assert!(series("x", &[], Placement::Out).is_err());
    }

    #[test]
    fn png_has_both_lines_and_needs_no_system_font() {
        let dir = std::env::temp_dir().join(format!("ampccl-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("p.png");
        let a = Series {
            label: "ampccl".into(),
            points: (3..=26).map(|k| (1usize << k, k as f64 / 3.0)).collect(),
        };
        let b = Series {
            label: "intel-mpi".into(),
            points: (3..=26).map(|k| (1usize << k, k as f64 / 4.0)).collect(),
        };
        draw(&out, "allreduce, 2 ranks", &[a, b]).unwrap();
        let bytes = std::fs::read(&out).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        let img = image::load_from_memory(&bytes).unwrap().to_rgb8();
        assert_eq!(img.dimensions(), (960, 600));
        // Each series' colour is on the image (line, markers, legend).
        for i in 0..2 {
            let RGBColor(r, g, b) = color(i);
            let n = img.pixels().filter(|p| p.0 == [r, g, b]).count();
            assert!(n > 500, "series {i}: {n} pixels of its colour");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn empty_plots_are_refused() {
        let out = std::env::temp_dir().join("ampccl-plot-never-written.png");
        let e = draw(
            &out,
            "t",
            &[Series {
                label: "a".into(),
                points: vec![],
            }],
        );
        assert!(e.unwrap_err().contains("no points"));
        assert!(!out.exists());
    }
}
