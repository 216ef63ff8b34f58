//! `--plot` and `ampccl-perf plot`: bus bandwidth and time per call against size (log axes) of
//! one or more ampccl-perf CSV files (or peers' results in the same format), one series per
//! library and collective, into a PNG.
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

/// One measured point of a series.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Point {
    pub bytes: usize,
    pub busbw_gbs: f64,
    pub time_us: f64,
}

/// One library's results for one collective: a legend entry and its markers.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub label: String,
    /// Sorted by bytes.
    pub points: Vec<Point>,
}

/// A run inside a CSV: (collective, ranks).
type RunKey = (String, usize);

/// The series of one CSV's rows: one per (collective, ranks) found, labelled with the library
/// (`label`) and the collective (and the rank count when the file holds several).
pub fn series(label: &str, rows: &[Row], placement: Placement) -> Result<Vec<Series>, String> {
    let mut groups: Vec<(RunKey, Vec<Point>)> = Vec::new();
    for r in rows.iter().filter(|r| r.placement == placement.csv_name()) {
        let key = (r.collective.clone(), r.ranks);
        let point = Point {
            bytes: r.bytes,
            busbw_gbs: r.busbw_gbs,
            time_us: r.time_us,
        };
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, pts)) => pts.push(point),
            None => groups.push((key, vec![point])),
        }
    }
    if groups.is_empty() {
        return Err(format!(
            "{label}: no {}-of-place rows",
            placement.csv_name()
        ));
    }
    let ranks_differ = groups.iter().any(|((_, r), _)| *r != groups[0].0.1);
    Ok(groups
        .into_iter()
        .map(|((coll, ranks), mut points)| {
            points.sort_by_key(|p| p.bytes);
            let label = if ranks_differ {
                format!("{label} {coll}, {ranks} ranks")
            } else {
                format!("{label} {coll}")
            };
            Series { label, points }
        })
        .collect())
}

/// The pairs of consecutive points of `s` that a line may join: those with no size between
/// them at which another series was measured (a line across such a size would draw a value
/// nobody measured).
fn segments<'a>(s: &'a Series, sizes: &'a [usize]) -> impl Iterator<Item = (Point, Point)> + 'a {
    s.points.windows(2).filter_map(move |w| {
        let between = sizes.iter().any(|&b| w[0].bytes < b && b < w[1].bytes);
        (!between).then_some((w[0], w[1]))
    })
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

/// Draws `series` into the PNG `out`: bus bandwidth (GB/s) and time per call (µs, log scale)
/// against size (log scale), side by side; a marker at each measured point, lines only between
/// neighbouring measured sizes.
pub fn draw(out: &Path, title: &str, series: &[Series]) -> Result<(), String> {
    register_font()?;
    let pts = || series.iter().flat_map(|s| s.points.iter());
    let (lo, hi) = pts().fold((usize::MAX, 0usize), |(lo, hi), p| {
        (lo.min(p.bytes.max(1)), hi.max(p.bytes))
    });
    if hi == 0 {
        return Err("nothing to plot: no points".into());
    }
    let mut sizes: Vec<usize> = pts().map(|p| p.bytes).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let x = (lo as f64).log2().floor()..(hi as f64).log2().ceil().max((lo as f64).log2() + 1.0);
    let err = |e: &dyn std::fmt::Display| format!("cannot plot {}: {e}", out.display());

    let root = BitMapBackend::new(out, (1400, 620)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let root = root
        .titled(title, ("sans-serif", 24))
        .map_err(|e| err(&e))?;
    let (left, right) = root.split_horizontally(700);
    let ymax = pts().map(|p| p.busbw_gbs).fold(0.0f64, f64::max).max(1e-3) * 1.1;
    panel(
        &left,
        x.clone(),
        0.0..ymax,
        "busbw (GB/s)",
        series,
        &sizes,
        |p| p.busbw_gbs,
    )
    .map_err(|e| err(&e))?;
    let (tmin, tmax) = pts().fold((f64::MAX, 0.0f64), |(a, b), p| {
        (a.min(p.time_us.max(1e-3)), b.max(p.time_us))
    });
    let t = (tmin / 1.5)..(tmax.max(tmin) * 1.5);
    panel(
        &right,
        x,
        t.log_scale(),
        "time per call (µs, log scale)",
        series,
        &sizes,
        |p| p.time_us.max(1e-3),
    )
    .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))
}

/// The error of a drawing call.
type DrawResult<T> =
    Result<T, DrawingAreaErrorKind<<BitMapBackend<'static> as DrawingBackend>::ErrorType>>;

/// One panel: `y(point)` of every series against log2 of the size.
fn panel<Y>(
    area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
    x: std::ops::Range<f64>,
    y_range: Y,
    y_desc: &str,
    series: &[Series],
    sizes: &[usize],
    y: impl Fn(&Point) -> f64,
) -> DrawResult<()>
where
    Y: plotters::coord::ranged1d::AsRangedCoord<Value = f64>,
    Y::CoordDescType: plotters::coord::ranged1d::ValueFormatter<f64>,
{
    let (x0, x1) = (x.start, x.end);
    let mut chart = ChartBuilder::on(area)
        .margin(14)
        .margin_right(28)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(x, y_range)?;
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
        .y_desc(y_desc)
        .label_style(("sans-serif", 14))
        .light_line_style(WHITE)
        .draw()?;
    for (i, s) in series.iter().enumerate() {
        let color = color(i);
        let xy = |p: &Point| ((p.bytes.max(1) as f64).log2(), y(p));
        chart.draw_series(
            segments(s, sizes)
                .map(|(a, b)| PathElement::new(vec![xy(&a), xy(&b)], color.stroke_width(2))),
        )?;
        chart
            .draw_series(
                s.points
                    .iter()
                    .map(|p| Circle::new(xy(p), 4, color.filled())),
            )?
            .label(s.label.as_str())
            .legend(move |(x, y)| Circle::new((x + 10, y), 5, color.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(("sans-serif", 15))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
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
        let point = |bytes, busbw_gbs| Point {
            bytes,
            busbw_gbs,
            time_us: 1.0,
        };
        assert_eq!(
            s,
            vec![Series {
                label: "impi allreduce".into(),
                points: vec![point(8, 0.1), point(1024, 2.0)]
            }]
        );
        let mixed = vec![
            row("allreduce", 8, "out", 0.1),
            row("allgather", 8, "out", 0.2),
        ];
        let s = series("x", &mixed, Placement::Out).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s[1].label, "x allgather");
        assert!(series("x", &rows, Placement::In).is_ok());
        assert!(series("x", &[], Placement::Out).is_err());
    }

    #[test]
    fn png_has_both_lines_and_needs_no_system_font() {
        let dir = std::env::temp_dir().join(format!("ampccl-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("p.png");
        let point = |k: u32, d: f64| Point {
            bytes: 1 << k,
            busbw_gbs: k as f64 / d,
            time_us: (1u64 << k) as f64 / 1e3,
        };
        let a = Series {
            label: "ampccl".into(),
            points: (3..=26).map(|k| point(k, 3.0)).collect(),
        };
        let b = Series {
            label: "intel-mpi".into(),
            points: (3..=26).step_by(2).map(|k| point(k, 4.0)).collect(),
        };
        draw(&out, "allreduce, 2 ranks", &[a, b]).unwrap();
        let bytes = std::fs::read(&out).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        let img = image::load_from_memory(&bytes).unwrap().to_rgb8();
        assert_eq!(img.dimensions(), (1400, 620));
        // Each series' colour is on the image (line, markers, legend).
        for i in 0..2 {
            let RGBColor(r, g, b) = color(i);
            let n = img.pixels().filter(|p| p.0 == [r, g, b]).count();
            assert!(n > 500, "series {i}: {n} pixels of its colour");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A series measured at every other size gets no line across the sizes in between, which
    /// another series was measured at; a series alone is joined point to point.
    #[test]
    fn lines_join_only_neighbouring_measured_sizes() {
        let at = |sizes: &[usize]| Series {
            label: "s".into(),
            points: sizes
                .iter()
                .map(|&bytes| Point {
                    bytes,
                    busbw_gbs: 1.0,
                    time_us: 1.0,
                })
                .collect(),
        };
        let (every, sparse) = (at(&[8, 16, 32, 64]), at(&[8, 32, 64]));
        let sizes = [8, 16, 32, 64];
        let joined = |s: &Series| -> Vec<(usize, usize)> {
            segments(s, &sizes)
                .map(|(a, b)| (a.bytes, b.bytes))
                .collect()
        };
        assert_eq!(joined(&every), [(8, 16), (16, 32), (32, 64)]);
        assert_eq!(joined(&sparse), [(32, 64)]);
        assert_eq!(segments(&sparse, &[8, 32, 64]).count(), 2);
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
