//! `--plot FILE.svg|FILE.png`: each scenario's figures, drawn with plotters.
//!
//! Each default plot answers its scenario's question at a glance, so it is built for that
//! question rather than as one line per row on one chart: small multiples (one panel per
//! strategy, budget kind or protection, on shared axes) where curves would land on the same
//! instants and hide each other; a log scale where counts span decades (a spike of 1000
//! beside a spread of 150 per bin); axes cut to where something happens; the figure that
//! answers the question in each panel's title; tick labels written as people write numbers
//! (`1000`, `1.5`, `16k`, `27x`, never `1600000.0`).
//!
//! [`charts`] turns a report into a [`Figure`] — plain data, tested without drawing — and
//! [`draw`] renders a figure. A [`PlotFile`] is created before the simulation runs, so a path
//! that cannot be written is refused at once, and the figure is rendered in memory and
//! written to it at the end.
//!
//! # Fonts
//!
//! plotters' default text support finds fonts through fontconfig at run time, so a fresh
//! machine without fonts (a CI container) fails to draw even an SVG's labels. This crate
//! instead uses plotters' pure-Rust `ab_glyph` text and registers a font compiled into the
//! binary: an ASCII subset (9 KB) of Roboto Regular, Apache License 2.0, in
//! `assets/fonts/` with its licence. Nothing is needed at run time; text on a plot is ASCII.

mod charts;
mod draw;

use std::fs::File;
use std::io::Write;
use std::ops::Range;
use std::path::{Path, PathBuf};

use plotters::prelude::{BitMapBackend, IntoDrawingArea, SVGBackend};
use plotters::style::{FontStyle, register_font};

pub(crate) use charts::{budget, chain, occ, overload, storm};

const FONT: &[u8] = include_bytes!("../../assets/fonts/Roboto-Regular-subset.ttf");

/// A whole figure: a title, a line on how to read it, and one or more panels.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Figure {
    pub(crate) title: String,
    /// One line under the title (ASCII).
    pub(crate) note: String,
    /// Laid out column by column.
    pub(crate) panels: Vec<Panel>,
    pub(crate) columns: usize,
    /// The size of one panel in pixels.
    pub(crate) panel_size: (u32, u32),
}

/// Height of the title and note above the panels, in pixels.
const HEADER: u32 = 64;

impl Figure {
    /// Rows of panels.
    pub(crate) fn rows(&self) -> usize {
        self.panels.len().div_ceil(self.columns.max(1)).max(1)
    }

    /// The whole figure's size in pixels.
    pub(crate) fn size(&self) -> (u32, u32) {
        let (w, h) = self.panel_size;
        let columns = u32::try_from(self.columns.max(1)).unwrap_or(1);
        let rows = u32::try_from(self.rows()).unwrap_or(1);
        (w * columns, HEADER + h * rows)
    }
}

/// One chart of a figure.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Panel {
    /// What this panel shows, and the figure that answers its question.
    pub(crate) title: String,
    pub(crate) x: Axis,
    pub(crate) y: Axis,
    pub(crate) series: Vec<Series>,
    /// Shaded stretches of x (a trigger's window).
    pub(crate) spans: Vec<Span>,
    /// Dashed reference lines (a capacity, the instant of a step).
    pub(crate) rules: Vec<Rule>,
    /// Text at a point (a value at the end of a line, on top of a bar).
    pub(crate) notes: Vec<Note>,
    /// Whether the panel shows its series' names (in its upper left corner).
    pub(crate) legend: bool,
}

/// An axis: its label, its range and how its ticks read.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Axis {
    pub(crate) label: String,
    pub(crate) range: Range<f64>,
    pub(crate) log: bool,
    /// Names of the categories at 0, 1, 2, ... (empty for a numeric axis).
    pub(crate) names: Vec<String>,
    /// Written after every tick value (`"x"` for an amplification).
    pub(crate) suffix: &'static str,
}

impl Axis {
    /// A linear numeric axis.
    pub(crate) fn linear(label: impl Into<String>, range: Range<f64>) -> Axis {
        Axis {
            label: label.into(),
            range,
            log: false,
            names: Vec::new(),
            suffix: "",
        }
    }

    /// A logarithmic numeric axis.
    pub(crate) fn log(label: impl Into<String>, range: Range<f64>) -> Axis {
        Axis {
            log: true,
            ..Axis::linear(label, range)
        }
    }

    /// Named categories at 0, 1, 2, ...
    pub(crate) fn names(label: impl Into<String>, names: Vec<String>) -> Axis {
        let n = names.len() as f64;
        Axis {
            names,
            ..Axis::linear(label, -0.5..(n - 0.5).max(0.5))
        }
    }

    /// The same axis with `suffix` after every tick value.
    pub(crate) fn with_suffix(self, suffix: &'static str) -> Axis {
        Axis { suffix, ..self }
    }
}

/// How a series is drawn.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Style {
    /// A histogram: a filled bar from each point's x over this width (a count per bin; a
    /// bin narrower than a pixel still shows).
    Bins(f64),
    /// A thick line.
    Line,
    /// A thin, darker line (a second quantity beside a thick one).
    Thin,
    /// A line with a circle at each point.
    Points,
    /// A bar at each (category, value).
    Bars,
}

/// One line (or set of bars) of a panel.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Series {
    /// The legend's text (unused in a panel without a legend).
    pub(crate) name: String,
    pub(crate) points: Vec<(f64, f64)>,
    pub(crate) style: Style,
    /// Index into the palette: one colour per row of the report, in every panel.
    pub(crate) colour: usize,
}

/// A shaded stretch of x, labelled at its top.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Span {
    pub(crate) from: f64,
    pub(crate) to: f64,
    pub(crate) label: String,
}

/// A dashed reference line across the panel; a horizontal one is labelled at its start (a
/// vertical one is explained in the figure's note).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Rule {
    /// Vertical at this x, or horizontal at this y.
    pub(crate) at: f64,
    pub(crate) vertical: bool,
    pub(crate) label: String,
}

/// Text placed at a point, in a series' colour.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Note {
    pub(crate) at: (f64, f64),
    pub(crate) text: String,
    pub(crate) colour: usize,
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
/// written is refused at once; written when the figure is drawn. A file that was never
/// written (the run failed) is removed again.
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

    /// Draws `figure` into memory and writes it to the file.
    pub(crate) fn draw(mut self, figure: &Figure) -> Result<(), String> {
        let bytes = encode(figure, self.kind)?;
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

/// The bytes of `figure` as a file of `kind`.
fn encode(figure: &Figure, kind: Kind) -> Result<Vec<u8>, String> {
    register_font("sans-serif", FontStyle::Normal, FONT)
        .map_err(|_| "the bundled font could not be loaded".to_string())?;
    let size = figure.size();
    match kind {
        Kind::Svg => {
            let mut svg = String::new();
            draw::figure(
                figure,
                SVGBackend::with_string(&mut svg, size).into_drawing_area(),
            )?;
            Ok(svg.into_bytes())
        }
        Kind::Png => {
            let (w, h) = size;
            let mut rgb = vec![0; w as usize * h as usize * 3];
            draw::figure(
                figure,
                BitMapBackend::with_buffer(&mut rgb, size).into_drawing_area(),
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
    fn panels_fill_columns_and_size_the_figure() {
        let panel = Panel {
            title: String::new(),
            x: Axis::linear("x", 0.0..1.0),
            y: Axis::linear("y", 0.0..1.0),
            series: Vec::new(),
            spans: Vec::new(),
            rules: Vec::new(),
            notes: Vec::new(),
            legend: false,
        };
        let figure = Figure {
            title: String::new(),
            note: String::new(),
            panels: vec![panel; 5],
            columns: 2,
            panel_size: (500, 200),
        };
        assert_eq!(figure.rows(), 3);
        assert_eq!(figure.size(), (1000, HEADER + 600));
    }
}
