//! `--plot FILE.svg|FILE.png`: the time series of a report, drawn with plotters.
//!
//! # Fonts
//!
//! plotters' default text support finds fonts through fontconfig at run time, so a fresh
//! machine without fonts (a CI container) fails to draw even an SVG's labels. This crate
//! instead uses plotters' pure-Rust `ab_glyph` text and registers a font compiled into the
//! binary: an ASCII subset (9 KB) of Roboto Regular, Apache License 2.0, in
//! `assets/fonts/` with its licence. Nothing is needed at run time.

use std::fs::File;
use std::io::Write;
use std::ops::Range;
use std::path::{Path, PathBuf};

use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;
use plotters::style::{FontStyle, register_font};
use stormguard_sim::scenario::budget::BudgetReport;
use stormguard_sim::scenario::chain::ChainReport;
use stormguard_sim::scenario::occ::OccReport;
use stormguard_sim::scenario::overload::OverloadReport;
use stormguard_sim::scenario::storm::StormReport;

const FONT: &[u8] = include_bytes!("../assets/fonts/Roboto-Regular-subset.ttf");
/// Tableau 10: distinct on white, and readable by most colour-blind viewers.
const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];
const SIZE: (u32, u32) = (1000, 600);
/// At most this many points per series; longer series keep each group's maximum (so peaks
/// survive).
const MAX_POINTS: usize = 2000;

/// How a series is drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Style {
    /// A thick line.
    Line,
    /// A thin, lighter line (for a secondary quantity of the same colour).
    Thin,
    /// A line with a circle at each point.
    Points,
}

/// One line of a chart.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Series {
    pub(crate) name: String,
    pub(crate) points: Vec<(f64, f64)>,
    pub(crate) style: Style,
    /// Index into the palette; series of one row share it.
    pub(crate) colour: usize,
}

/// A whole chart.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Chart {
    pub(crate) title: String,
    pub(crate) x: String,
    pub(crate) y: String,
    pub(crate) log_y: bool,
    pub(crate) series: Vec<Series>,
}

/// The file kinds `--plot` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Svg,
    Png,
}

/// The kind of file to write, from its extension.
pub(crate) fn kind_of(path: &Path) -> Result<Kind, String> {
    match path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        Some("svg") => Ok(Kind::Svg),
        Some("png") => Ok(Kind::Png),
        _ => Err(format!("{} must end in .svg or .png", path.display())),
    }
}

/// A `--plot` file: created before the simulation runs, so that a path that cannot be
/// written is refused at once; written when the chart is drawn. A file that was never written
/// (the run failed) is removed again.
#[derive(Debug)]
pub(crate) struct PlotFile {
    path: PathBuf,
    kind: Kind,
    file: File,
    written: bool,
}

impl PlotFile {
    /// Creates (or truncates) the file at `path`; the error says why it cannot be written.
    pub(crate) fn create(path: &Path) -> Result<PlotFile, String> {
        let kind = kind_of(path)?;
        let file =
            File::create(path).map_err(|e| format!("{} cannot be created: {e}", path.display()))?;
        Ok(PlotFile {
            path: path.to_owned(),
            kind,
            file,
            written: false,
        })
    }

    /// Where the plot goes.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Draws `chart` into memory and writes it to the file.
    pub(crate) fn draw(mut self, chart: &Chart) -> Result<(), String> {
        let bytes = encode(chart, self.kind)?;
        self.written = true;
        self.file
            .write_all(&bytes)
            .and_then(|()| self.file.flush())
            .map_err(|e| format!("writing failed: {e}"))
    }
}

impl Drop for PlotFile {
    fn drop(&mut self) {
        if !self.written {
            // Best effort: the run already failed, and that error is the one to report.
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// The bytes of `chart` as a file of `kind`.
fn encode(chart: &Chart, kind: Kind) -> Result<Vec<u8>, String> {
    register_font("sans-serif", FontStyle::Normal, FONT)
        .map_err(|_| "the bundled font could not be loaded".to_string())?;
    match kind {
        Kind::Svg => {
            let mut svg = String::new();
            render(
                chart,
                SVGBackend::with_string(&mut svg, SIZE).into_drawing_area(),
            )?;
            Ok(svg.into_bytes())
        }
        Kind::Png => {
            let (w, h) = SIZE;
            let mut rgb = vec![0; w as usize * h as usize * 3];
            render(
                chart,
                BitMapBackend::with_buffer(&mut rgb, SIZE).into_drawing_area(),
            )?;
            let mut bytes = Vec::new();
            let mut encoder = png::Encoder::new(&mut bytes, w, h);
            encoder.set_color(png::ColorType::Rgb);
            encoder.set_depth(png::BitDepth::Eight);
            encoder
                .write_header()
                .and_then(|mut writer| {
                    writer.write_image_data(&rgb)?;
                    writer.finish()
                })
                .map_err(|e| format!("PNG encoding failed: {e}"))?;
            Ok(bytes)
        }
    }
}

fn render<DB: DrawingBackend>(
    chart: &Chart,
    root: DrawingArea<DB, plotters::coord::Shift>,
) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| format!("drawing failed: {e}");
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let (x, y) = ranges(chart);
    if chart.log_y {
        plot(chart, &root, x, y.log_scale()).map_err(|e| err(&e))?;
    } else {
        plot(chart, &root, x, y).map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))
}

fn plot<DB: DrawingBackend, Y>(
    chart: &Chart,
    root: &DrawingArea<DB, plotters::coord::Shift>,
    x: Range<f64>,
    y: Y,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>>
where
    Y: AsRangedCoord<Value = f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let mut ctx = ChartBuilder::on(root)
        .caption(&chart.title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(70)
        .build_cartesian_2d(x, y)?;
    ctx.configure_mesh()
        .x_desc(chart.x.as_str())
        .y_desc(chart.y.as_str())
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 16))
        .draw()?;
    for s in &chart.series {
        let colour = PALETTE[s.colour % PALETTE.len()].to_rgba();
        let points = downsample(&s.points);
        let style = match s.style {
            Style::Thin => colour.mix(0.45).stroke_width(1),
            Style::Line | Style::Points => colour.stroke_width(2),
        };
        ctx.draw_series(LineSeries::new(points.iter().copied(), style))?
            .label(s.name.as_str())
            .legend(move |(lx, ly)| PathElement::new(vec![(lx, ly), (lx + 20, ly)], style));
        if s.style == Style::Points {
            ctx.draw_series(points.iter().map(|&p| Circle::new(p, 4, colour.filled())))?;
        }
    }
    ctx.configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()?;
    Ok(())
}

/// The x range of all points, and the y range from zero (or the smallest positive value on a
/// log scale) to a little above the largest.
fn ranges(chart: &Chart) -> (Range<f64>, Range<f64>) {
    let all = || chart.series.iter().flat_map(|s| s.points.iter());
    let (mut x0, mut x1) = all().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.0), b.max(p.0)));
    if x0 > x1 {
        (x0, x1) = (0.0, 1.0);
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    let y1 = all().map(|p| p.1).fold(0.0, f64::max).max(1.0);
    if chart.log_y {
        let y0 = all().map(|p| p.1).filter(|&v| v > 0.0).fold(y1, f64::min);
        (x0..x1, (y0 / 1.5)..(y1 * 1.5))
    } else {
        (x0..x1, 0.0..(y1 * 1.05))
    }
}

/// Keeps at most [`MAX_POINTS`] points: each group of neighbours becomes its maximum.
fn downsample(points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    if points.len() <= MAX_POINTS {
        return points.to_vec();
    }
    let group = points.len().div_ceil(MAX_POINTS);
    points
        .chunks(group)
        .filter_map(|c| {
            let x = c.first()?.0;
            let y = c.iter().map(|p| p.1).fold(f64::MIN, f64::max);
            Some((x, y))
        })
        .collect()
}

/// Retries per bin per strategy.
pub(crate) fn storm(r: &StormReport) -> Chart {
    let bin = r
        .rows
        .first()
        .map_or(0.1, |row| row.parameters.bin.as_secs_f64());
    Chart {
        title: "Retries per bin after a correlated failure".into(),
        x: "time (s)".into(),
        y: format!("retries per {} ms", (bin * 1e3).round()),
        log_y: false,
        series: r
            .rows
            .iter()
            .enumerate()
            .map(|(i, row)| Series {
                name: row.label.into(),
                // A step line: each bin is flat over its width, so a spike of a thousand
                // retries in one bin reads as a bar, not as a thin triangle.
                points: row
                    .per_bin
                    .iter()
                    .enumerate()
                    .flat_map(|(k, &c)| {
                        [(k as f64 * bin, c as f64), ((k + 1) as f64 * bin, c as f64)]
                    })
                    .collect(),
                style: Style::Line,
                colour: i,
            })
            .collect(),
    }
}

/// Requests per entry request at each layer, per mode (log scale).
pub(crate) fn chain(r: &ChainReport) -> Chart {
    Chart {
        title: "Requests seen per entry request, layer by layer".into(),
        x: "layer (last = the service)".into(),
        y: "requests per entry request".into(),
        log_y: true,
        series: r
            .rows
            .iter()
            .enumerate()
            .map(|(i, row)| Series {
                name: row.label.into(),
                points: row
                    .amplification_per_layer
                    .iter()
                    .enumerate()
                    .map(|(k, &a)| ((k + 1) as f64, a))
                    .collect(),
                style: Style::Points,
                colour: i,
            })
            .collect(),
    }
}

/// Retries per second over time per budget kind.
pub(crate) fn budget(r: &BudgetReport) -> Chart {
    let bin = r
        .rows
        .first()
        .map_or(0.25, |row| row.parameters.bin.as_secs_f64());
    Chart {
        title: "Retries per second when the success rate drops".into(),
        x: "time (s)".into(),
        y: "retries per second".into(),
        log_y: false,
        series: r
            .rows
            .iter()
            .enumerate()
            .map(|(i, row)| Series {
                name: row.label.into(),
                points: row
                    .retries_per_s
                    .iter()
                    .enumerate()
                    .map(|(k, &v)| (k as f64 * bin, v))
                    .collect(),
                style: Style::Line,
                colour: i,
            })
            .collect(),
    }
}

/// Goodput (thick) and offered load (thin) over time per protection.
pub(crate) fn overload(r: &OverloadReport) -> Chart {
    let mut series = Vec::new();
    for (i, row) in r.rows.iter().enumerate() {
        series.push(Series {
            name: format!("{}: goodput", row.label),
            points: row.series.iter().map(|p| (p.t_s, p.goodput)).collect(),
            style: Style::Line,
            colour: i,
        });
        series.push(Series {
            name: format!("{}: offered", row.label),
            points: row.series.iter().map(|p| (p.t_s, p.offered)).collect(),
            style: Style::Thin,
            colour: i,
        });
    }
    Chart {
        title: "Goodput and offered load around the trigger".into(),
        x: "time (s)".into(),
        y: "requests per second".into(),
        log_y: false,
        series,
    }
}

/// Calls per number of clients per strategy.
pub(crate) fn occ(r: &OccReport) -> Chart {
    let mut series: Vec<Series> = Vec::new();
    for row in &r.rows {
        let point = (f64::from(row.clients), row.calls);
        match series.iter_mut().find(|s| s.name == row.label) {
            Some(s) => s.points.push(point),
            None => series.push(Series {
                name: row.label.into(),
                points: vec![point],
                style: Style::Points,
                colour: series.len(),
            }),
        }
    }
    Chart {
        title: "Calls to the contended row".into(),
        x: "clients".into(),
        y: "writes per run".into(),
        log_y: false,
        series,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_svg_and_png_are_accepted() {
        assert_eq!(kind_of(Path::new("a.svg")), Ok(Kind::Svg));
        assert_eq!(kind_of(Path::new("a.PNG")), Ok(Kind::Png));
        assert!(kind_of(Path::new("a.pdf")).is_err());
        assert!(kind_of(Path::new("svg")).is_err());
    }

    #[test]
    fn downsampling_keeps_peaks() {
        let points: Vec<_> = (0..10_000)
            .map(|i| (f64::from(i), f64::from(i % 100)))
            .collect();
        let kept = downsample(&points);
        assert!(kept.len() <= MAX_POINTS);
        assert!(kept.iter().all(|p| p.1 >= 4.0));
    }
}
