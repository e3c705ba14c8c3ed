//! Renders a [`Figure`] with plotters: the header, then each panel in its cell.

use std::fmt::Display;

use plotters::coord::Shift;
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::figure::{Axis, Figure, HEADER, Panel, Style};

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
/// Text and reference lines that are not data.
const INK: RGBColor = RGBColor(60, 60, 60);
/// At most this many points per series; longer series keep each group's maximum (so peaks
/// survive).
const MAX_POINTS: usize = 2000;

/// Draws `figure` on `root`.
pub(super) fn figure<DB: DrawingBackend>(
    figure: &Figure,
    root: DrawingArea<DB, Shift>,
) -> Result<(), String> {
    let err = |e: &dyn Display| format!("drawing failed: {e}");
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let (width, _) = root.dim_in_pixel();
    let (header, body) = root.split_vertically(HEADER);
    let centre = |size| {
        TextStyle::from(("sans-serif", size).into_font()).pos(Pos::new(HPos::Center, VPos::Top))
    };
    let middle = i32::try_from(width / 2).unwrap_or(0);
    header
        .draw_text(&figure.title, &centre(22).color(&BLACK), (middle, 8))
        .map_err(|e| err(&e))?;
    header
        .draw_text(&figure.note, &centre(15).color(&INK), (middle, 38))
        .map_err(|e| err(&e))?;
    let (rows, columns) = (figure.rows(), figure.columns.max(1));
    let cells = body.split_evenly((rows, columns));
    for (i, panel) in figure.panels.iter().enumerate() {
        // Column by column: the first `rows` panels fill the first column.
        let (row, column) = (i % rows, i / rows);
        let Some(cell) = cells.get(row * columns + column) else {
            continue;
        };
        let below = i + 1 < figure.panels.len() && row + 1 < rows;
        let labels = AxisLabels {
            x: !below,
            y: column == 0,
        };
        let (x, y) = (panel.x.range.clone(), panel.y.range.clone());
        match (panel.x.log, panel.y.log) {
            (false, false) => chart(cell, panel, labels, x, y),
            (false, true) => chart(cell, panel, labels, x, y.log_scale()),
            (true, false) => chart(cell, panel, labels, x.log_scale(), y),
            (true, true) => chart(cell, panel, labels, x.log_scale(), y.log_scale()),
        }
        .map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))
}

/// Which axis descriptions a panel shows (the bottom row names x, the first column y).
#[derive(Clone, Copy, Debug)]
struct AxisLabels {
    x: bool,
    y: bool,
}

fn chart<DB: DrawingBackend, X, Y>(
    cell: &DrawingArea<DB, Shift>,
    panel: &Panel,
    labels: AxisLabels,
    x: X,
    y: Y,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>>
where
    X: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
    Y: AsRangedCoord<Value = f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let mut builder = ChartBuilder::on(cell);
    if !panel.title.is_empty() {
        builder.caption(&panel.title, ("sans-serif", 16));
    }
    let mut ctx = builder
        .margin(10)
        .margin_right(24)
        .x_label_area_size(if labels.x { 40 } else { 24 })
        .y_label_area_size(if labels.y { 64 } else { 48 })
        .build_cartesian_2d(x, y)?;
    let x_ticks = |v: &f64| tick(&panel.x, *v);
    let y_ticks = |v: &f64| tick(&panel.y, *v);
    ctx.configure_mesh()
        .x_desc(if labels.x { panel.x.label.as_str() } else { "" })
        .y_desc(if labels.y { panel.y.label.as_str() } else { "" })
        .x_labels(tick_count(&panel.x, 10))
        .y_labels(tick_count(&panel.y, 5))
        .x_label_formatter(&x_ticks)
        .y_label_formatter(&y_ticks)
        .label_style(("sans-serif", 13))
        .axis_desc_style(("sans-serif", 14))
        .bold_line_style(RGBColor(225, 225, 225))
        // plotters' minor lines on a log axis bunch up into a grey band near each power of
        // ten; the tick lines are grid enough.
        .max_light_lines(0)
        .draw()?;
    let (x0, x1) = (panel.x.range.start, panel.x.range.end);
    // About one pixel of x, so that a bin narrower than three pixels is drawn three wide.
    let (cell_width, _) = cell.dim_in_pixel();
    let pixel = (x1 - x0) / f64::from(cell_width.saturating_sub(100).max(1));
    let (y0, y1) = (panel.y.range.start, panel.y.range.end);
    let text = |colour: RGBColor| ("sans-serif", 13).into_font().color(&colour);
    for span in &panel.spans {
        let (from, to) = (span.from.max(x0), span.to.min(x1));
        ctx.draw_series(std::iter::once(Rectangle::new(
            [(from, y0), (to, y1)],
            BLACK.mix(0.07).filled(),
        )))?;
        ctx.draw_series(std::iter::once(
            EmptyElement::at((from, y1)) + Text::new(span.label.clone(), (4, 4), text(INK)),
        ))?;
    }
    for rule in &panel.rules {
        let line = if rule.vertical {
            vec![(rule.at, y0), (rule.at, y1)]
        } else {
            vec![(x0, rule.at), (x1, rule.at)]
        };
        ctx.draw_series(DashedLineSeries::new(line, 6, 4, INK.stroke_width(1)))?;
        if !rule.vertical && !rule.label.is_empty() {
            ctx.draw_series(std::iter::once(
                EmptyElement::at((x0, rule.at))
                    + Text::new(rule.label.clone(), (4, -16), text(INK)),
            ))?;
        }
    }
    // A log axis cannot show zero: values at or below its start are drawn on it.
    let clamp = |(x, y): (f64, f64)| (x, y.clamp(y0, y1));
    for s in &panel.series {
        let colour = PALETTE[s.colour % PALETTE.len()];
        let points: Vec<_> = downsample(&s.points).into_iter().map(clamp).collect();
        let style = match s.style {
            Style::Thin => INK.mix(0.8).stroke_width(1),
            Style::Line | Style::Points | Style::Bars | Style::Bins(_) => colour.stroke_width(2),
        };
        let floor = if panel.y.log { y0 } else { y0.max(0.0) };
        let drawn = match s.style {
            Style::Bars => ctx.draw_series(points.iter().map(|&(x, y)| {
                Rectangle::new([(x - 0.3, floor), (x + 0.3, y)], colour.filled())
            }))?,
            Style::Bins(width) => {
                ctx.draw_series(points.iter().filter(|&&(_, y)| y > floor).map(|&(x, y)| {
                    let right = x + width.max(3.0 * pixel);
                    Rectangle::new([(x, floor), (right, y)], colour.filled())
                }))?
            }
            Style::Line | Style::Thin | Style::Points => {
                ctx.draw_series(LineSeries::new(points.iter().copied(), style))?
            }
        };
        if panel.legend && !s.name.is_empty() {
            drawn
                .label(s.name.as_str())
                .legend(move |(lx, ly)| PathElement::new(vec![(lx, ly), (lx + 20, ly)], style));
        }
        if s.style == Style::Points {
            ctx.draw_series(points.iter().map(|&p| Circle::new(p, 4, colour.filled())))?;
        }
    }
    for note in &panel.notes {
        let colour = PALETTE[note.colour % PALETTE.len()];
        ctx.draw_series(std::iter::once(
            EmptyElement::at(clamp(note.at)) + Text::new(note.text.clone(), (6, -16), text(colour)),
        ))?;
    }
    if panel.legend {
        ctx.configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.9))
            .border_style(RGBColor(200, 200, 200))
            .label_font(("sans-serif", 13))
            .draw()?;
    }
    Ok(())
}

/// How many ticks to ask plotters for: one per category; on a log axis one per decade when
/// it spans more than two (plotters then draws only the powers of ten), else enough for the
/// 2s and 5s between them.
fn tick_count(axis: &Axis, linear: usize) -> usize {
    if !axis.names.is_empty() {
        axis.names.len() + 1
    } else if axis.log {
        let decades = decades(axis);
        if decades > 2.0 {
            decades as usize + 1
        } else {
            10
        }
    } else {
        linear
    }
}

fn decades(axis: &Axis) -> f64 {
    (axis.range.end / axis.range.start.max(f64::MIN_POSITIVE))
        .log10()
        .floor()
}

/// The text of a tick at `v`: the category's name; on a log axis 1, 2 and 5 times a power of
/// ten (only the powers beyond two decades); otherwise the number as a person writes it.
pub(super) fn tick(axis: &Axis, v: f64) -> String {
    if !axis.names.is_empty() {
        let i = v.round();
        return match axis.names.get(i as usize) {
            Some(name) if (v - i).abs() < 1e-6 && i >= 0.0 => name.clone(),
            _ => String::new(),
        };
    }
    if v < axis.range.start - 1e-9 * axis.range.start.abs() {
        return String::new();
    }
    if axis.log && v > 0.0 {
        let mantissa = v / 10f64.powf(v.log10().floor());
        let shown: &[f64] = if decades(axis) > 2.0 {
            &[1.0]
        } else {
            &[1.0, 2.0, 5.0]
        };
        if !shown.iter().any(|m| (mantissa - m).abs() < 1e-6) {
            return String::new();
        }
    }
    format!("{}{}", number(v), axis.suffix)
}

/// A number as a person writes it: `0`, `1000`, `2.5`, `16k`, `1.6M`.
pub(super) fn number(v: f64) -> String {
    let a = v.abs();
    if a < 1e-9 {
        "0".to_string()
    } else if a >= 1e6 {
        format!("{}M", trim(format!("{:.1}", v / 1e6)))
    } else if a >= 1e4 {
        format!("{}k", trim(format!("{:.1}", v / 1e3)))
    } else if (v - v.round()).abs() < 1e-9 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        trim(format!("{v:.1}"))
    } else {
        trim(format!("{v:.3}"))
    }
}

fn trim(s: String) -> String {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_as_people_write_them() {
        for (v, text) in [
            (0.0, "0"),
            (1000.0, "1000"),
            (1_600_000.0, "1.6M"),
            (16_000.0, "16k"),
            (2.5, "2.5"),
            (1.331, "1.331"),
            (0.25, "0.25"),
            (62.34, "62.3"),
            (-20.0, "-20"),
        ] {
            assert_eq!(number(v), text, "{v}");
        }
    }

    #[test]
    fn ticks_name_categories_and_thin_out_log_axes() {
        let names = Axis::names("layer", vec!["entry".into(), "service".into()]);
        assert_eq!(tick(&names, 1.0), "service");
        assert_eq!(tick(&names, 0.5), "");
        let wide = Axis::log("retries", 0.8..2000.0);
        assert_eq!(tick(&wide, 100.0), "100");
        assert_eq!(
            tick(&wide, 200.0),
            "",
            "only powers of ten across three decades"
        );
        let narrow = Axis::log("x", 0.8..40.0).with_suffix("x");
        assert_eq!(tick(&narrow, 20.0), "20x");
        assert_eq!(tick(&narrow, 30.0), "");
        let linear = Axis::linear("t", 0.0..10.0);
        assert_eq!(tick(&linear, -1.0), "", "no ticks below the range");
        assert_eq!(tick(&linear, 2.5), "2.5");
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
