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
//! [`charts`] turns a report into a [`Figure`] — plain data ([`figure`]), tested without
//! drawing — and [`draw`] renders a figure. A [`PlotFile`] is created before the simulation runs, so a path
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
mod figure;
mod heal;
mod layout;

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use plotters::prelude::{BitMapBackend, IntoDrawingArea, SVGBackend};
use plotters::style::{FontStyle, register_font};

pub(crate) use charts::{budget, chain, converge, occ, overload, storm, whatif};
pub(crate) use figure::Figure;
pub(crate) use heal::self_heal;

const FONT: &[u8] = include_bytes!("../../assets/fonts/Roboto-Regular-subset.ttf");

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
}
