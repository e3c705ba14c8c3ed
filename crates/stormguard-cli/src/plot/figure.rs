//! What a plot shows, as plain data: a figure of panels, each with its axes, series and
//! marks. `charts` builds one per scenario; `draw` renders it.

use std::ops::Range;

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
pub(super) const HEADER: u32 = 64;

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

#[cfg(test)]
mod tests {
    use super::*;

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
