//! What the charts share: an empty panel to fill, a figure with nothing to show, the grid of
//! panels for a count, time bins as a step line, and round axis ends.

use super::figure::{Axis, Figure, Panel};

pub(super) fn panel() -> Panel {
    Panel {
        title: String::new(),
        x: Axis::linear("", 0.0..1.0),
        y: Axis::linear("", 0.0..1.0),
        series: Vec::new(),
        spans: Vec::new(),
        rules: Vec::new(),
        notes: Vec::new(),
        legend: false,
    }
}

/// A figure with nothing to show (a report without rows).
pub(super) fn empty(title: &str) -> Figure {
    Figure {
        title: title.into(),
        note: String::new(),
        panels: vec![panel()],
        columns: 1,
        panel_size: (1000, 400),
    }
}

/// One column up to three panels, two beyond.
pub(super) fn columns_for(panels: usize) -> usize {
    if panels > 3 { 2 } else { 1 }
}

/// Panels of a time series: the figure is 1000 to 1100 pixels wide either way.
pub(super) fn panel_size_for(panels: usize) -> (u32, u32) {
    if columns_for(panels) == 1 {
        (1000, 210)
    } else {
        (550, 210)
    }
}

/// Bins of `width` seconds as a step line (each bin flat over its width, so a spike in one
/// bin reads as a bar, not as a thin triangle), up to `until`.
pub(super) fn steps(bins: impl Iterator<Item = f64>, width: f64, until: f64) -> Vec<(f64, f64)> {
    bins.enumerate()
        .map(|(k, v)| (k as f64 * width, v))
        .take_while(|&(x, _)| x < until)
        .flat_map(|(x, v)| [(x, v), ((x + width).min(until), v)])
        .collect()
}

/// The end of the bin by which `share` of all the counts have happened.
pub(super) fn time_of_share(bins: &[u64], width: f64, share: f64) -> f64 {
    let total: u64 = bins.iter().sum();
    let mut seen = 0u64;
    for (k, &c) in bins.iter().enumerate() {
        seen += c;
        if seen as f64 >= share * total as f64 {
            return (k + 1) as f64 * width;
        }
    }
    bins.len() as f64 * width
}

/// The smallest round number (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6 or 8 times a power of ten) at
/// least `v`: an axis end close above the data.
pub(super) fn round_up(v: f64) -> f64 {
    if !(v.is_finite() && v > 0.0) {
        return 1.0;
    }
    let power = 10f64.powf(v.log10().floor());
    [1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0]
        .into_iter()
        .map(|m| m * power)
        .find(|&end| end >= v * (1.0 - 1e-9))
        .unwrap_or(10.0 * power)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_ends_are_round_and_close_above_the_data() {
        assert_eq!(round_up(1000.0), 1000.0);
        assert_eq!(round_up(15.1), 20.0);
        assert_eq!(round_up(35.0), 40.0);
        assert_eq!(round_up(0.7), 0.8);
        assert_eq!(round_up(0.0), 1.0);
    }

    #[test]
    fn steps_stop_at_the_axis_end() {
        let points = steps([1.0, 2.0, 3.0].into_iter(), 0.5, 1.2);
        assert_eq!(
            points,
            vec![
                (0.0, 1.0),
                (0.5, 1.0),
                (0.5, 2.0),
                (1.0, 2.0),
                (1.0, 3.0),
                (1.2, 3.0)
            ]
        );
        assert_eq!(
            time_of_share(&[10, 80, 9, 1], 0.1, 0.99),
            0.30000000000000004
        );
    }
}
