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
//!
//! # Timestamps
//!
//! An optional `timestamp` column says when each request was made, which the P99 alarm over
//! 5-minute windows and the search for daily peaks need ([`parse_timed`]):
//!
//! ```text
//! timestamp,endpoint,latency_ms
//! 2026-03-01T19:00:00Z,GET /search,12.5
//! 2026-03-02T03:00:00+08:00,GET /search,80
//! 1772391600.25,POST /pay,310
//! ```
//!
//! A timestamp is RFC 3339 with a `Z` or an offset, or Unix seconds (fractions allowed).
//! When the column is there, every row needs one; without it the file reads as before
//! (and has no time series).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use super::AdviseError;

/// Latencies with the time each request was made, by endpoint, in file order.
pub type Timed = BTreeMap<String, Vec<(SystemTime, Duration)>>;

/// The latencies of each endpoint, in file order.
///
/// ```
/// use stormguard::advise::csv::parse;
/// let data = parse("endpoint,latency_ms\nGET /a,10\n\"GET /b,c\",2.5\n")?;
/// assert_eq!(data["GET /b,c"][0].as_micros(), 2500);
/// # Ok::<(), stormguard::advise::AdviseError>(())
/// ```
pub fn parse(text: &str) -> Result<BTreeMap<String, Vec<Duration>>, AdviseError> {
    Ok(read(text)?
        .into_iter()
        .map(|(name, rows)| (name, rows.into_iter().map(|(_, l)| l).collect()))
        .collect())
}

/// The latencies of each endpoint with their timestamps; `None` when the file has no
/// `timestamp` column.
///
/// ```
/// use stormguard::advise::csv::parse_timed;
/// let data = parse_timed("timestamp,endpoint,latency_ms\n1772391600,GET /a,10\n")?.unwrap();
/// assert_eq!(data["GET /a"][0].1.as_millis(), 10);
/// assert!(parse_timed("endpoint,latency_ms\nGET /a,10\n")?.is_none());
/// # Ok::<(), stormguard::advise::AdviseError>(())
/// ```
pub fn parse_timed(text: &str) -> Result<Option<Timed>, AdviseError> {
    let has_time = text
        .lines()
        .find(|l| !l.trim().is_empty())
        .and_then(|h| fields(h).ok())
        .is_some_and(|h| h.iter().any(|f| f.trim() == TIMESTAMP));
    if !has_time {
        return Ok(None);
    }
    Ok(Some(
        read(text)?
            .into_iter()
            .map(|(name, rows)| {
                let rows = rows
                    .into_iter()
                    .map(|(t, l)| (t.unwrap_or(SystemTime::UNIX_EPOCH), l))
                    .collect();
                (name, rows)
            })
            .collect(),
    ))
}

/// The name of the optional timestamp column.
const TIMESTAMP: &str = "timestamp";

/// Every row, with its timestamp when the file has the column.
type Rows = BTreeMap<String, Vec<(Option<SystemTime>, Duration)>>;

fn read(text: &str) -> Result<Rows, AdviseError> {
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
    let timestamp = column(TIMESTAMP).ok();
    let mut out: Rows = BTreeMap::new();
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
        let at = timestamp
            .map(|t| time(row[t].trim()).ok_or_else(|| {
                AdviseError::at(
                    n,
                    format!(
                        "timestamp {:?} is neither RFC 3339 (2026-03-01T19:00:00Z) nor Unix seconds",
                        crate::duration::cut(row[t].trim(), 64)
                    ),
                )
            }))
            .transpose()?;
        out.entry(row[endpoint].clone())
            .or_default()
            .push((at, Duration::from_secs_f64(ms / 1000.0)));
    }
    Ok(out)
}

/// A timestamp: RFC 3339, or Unix seconds.
fn time(s: &str) -> Option<SystemTime> {
    let ts = match s.parse::<f64>() {
        Ok(secs) if secs.is_finite() => {
            #[allow(clippy::cast_possible_truncation)]
            let whole = secs.floor() as i64;
            #[allow(clippy::cast_possible_truncation)]
            let nanos = ((secs - secs.floor()) * 1e9) as i32;
            jiff::Timestamp::new(whole, nanos.clamp(0, 999_999_999)).ok()?
        }
        Ok(_) => return None,
        Err(_) => s.parse::<jiff::Timestamp>().ok()?,
    };
    SystemTime::try_from(ts).ok()
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
