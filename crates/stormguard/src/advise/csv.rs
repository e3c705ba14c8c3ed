//! Latencies from a CSV file: one request per row.
//!
//! ```text
//! endpoint,latency_ms
//! GET /search,12.5
//! GET /search,80
//! POST /pay,310
//! ```
//!
//! The first row names the columns; `endpoint` and `latency_ms` must be among them (in any
//! order; other columns are ignored). Fields are separated by commas and may be quoted with
//! `"` (a quote inside doubled), so an endpoint name may hold a comma. Blank lines are
//! skipped. A latency is a finite number of milliseconds >= 0.

use std::collections::BTreeMap;
use std::time::Duration;

use super::AdviseError;

/// The latencies of each endpoint, in file order.
///
/// ```
/// use stormguard::advise::csv::parse;
/// let data = parse("endpoint,latency_ms\nGET /a,10\n\"GET /b,c\",2.5\n")?;
/// assert_eq!(data["GET /b,c"][0].as_micros(), 2500);
/// # Ok::<(), stormguard::advise::AdviseError>(())
/// ```
pub fn parse(text: &str) -> Result<BTreeMap<String, Vec<Duration>>, AdviseError> {
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    let Some((_, header)) = lines.next() else {
        return Err(AdviseError::at(
            0,
            "empty: the first row names the columns (endpoint,latency_ms)",
        ));
    };
    let header = fields(header).map_err(|m| AdviseError::at(1, m))?;
    let column = |name: &str| {
        header
            .iter()
            .position(|h| h.trim() == name)
            .ok_or_else(|| AdviseError::at(1, format!("no `{name}` column in the header")))
    };
    let (endpoint, latency) = (column("endpoint")?, column("latency_ms")?);
    let mut out: BTreeMap<String, Vec<Duration>> = BTreeMap::new();
    for (index, line) in lines {
        let n = index + 1;
        let row = fields(line).map_err(|m| AdviseError::at(n, m))?;
        if row.len() != header.len() {
            return Err(AdviseError::at(
                n,
                format!("{} fields, the header has {}", row.len(), header.len()),
            ));
        }
        let raw = row[latency].trim();
        let ms: f64 = raw
            .parse()
            .ok()
            .filter(|v: &f64| v.is_finite() && *v >= 0.0 && *v < super::MAX_LATENCY_SECS * 1000.0)
            .ok_or_else(|| {
                AdviseError::at(
                    n,
                    format!("latency_ms {raw:?} is not a number of milliseconds >= 0"),
                )
            })?;
        out.entry(row[endpoint].clone())
            .or_default()
            .push(Duration::from_secs_f64(ms / 1000.0));
    }
    Ok(out)
}

/// One row's fields.
fn fields(line: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut field = String::new();
    let mut chars = line.chars().peekable();
    let mut quoted = false;
    let mut was_quoted = false;
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            (true, '"') => quoted = false,
            (true, c) => field.push(c),
            (false, '"') if field.is_empty() && !was_quoted => {
                quoted = true;
                was_quoted = true;
            }
            (false, ',') => {
                out.push(std::mem::take(&mut field));
                was_quoted = false;
            }
            (false, '"') => return Err("a quote inside an unquoted field".to_owned()),
            (false, c) => field.push(c),
        }
    }
    if quoted {
        return Err("a quoted field is not closed".to_owned());
    }
    out.push(field);
    Ok(out)
}
