//! HdrHistogram interval logs (`.hlog`) as latency input for `advise timeouts`.
//!
//! The log format of HdrHistogram's `HistogramLogWriter` (Java, C, Go, Rust ports and tools
//! such as wrk2 and jHiccup write it): comment and header lines, then one line per interval
//! whose last field is a compressed histogram in base64. Each interval's tag (`Tag=…`) names
//! its endpoint; untagged intervals belong to [`UNTAGGED`]. A tag cannot hold a space, so the
//! space after an endpoint's method is written `_` (`GET_/users/*`) and read back as one. All intervals of one endpoint are
//! added into one histogram, whose nearest-rank percentiles are the advice's input, so an
//! endpoint's log and a CSV of the same latencies give the same advice (within the log's
//! significant digits).
//!
//! With absolute interval timestamps (a `StartTime` or `BaseTime` header, or Unix seconds),
//! [`parse_timed`] gives the intervals themselves, for the P99 alarm window by window and
//! the daily peak search.
//!
//! A log does not say its unit: the recorder chose it (wrk2 records microseconds); the
//! caller names it.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use hdrhistogram::Histogram;
use hdrhistogram::serialization::Deserializer;
use hdrhistogram::serialization::interval_log::{IntervalLogIterator, LogEntry};
use stormguard::advise::timed::{Interval, Latencies};
use stormguard::advise::{MAX_LATENCY_SECS, Percentiles};

/// The endpoint of intervals without a tag.
pub(crate) const UNTAGGED: &str = "default";

/// The percentiles of every endpoint of the log `bytes`, whose values are in `unit`s; `Err`
/// names the line that could not be read.
pub(crate) fn parse(bytes: &[u8], unit: Duration) -> Result<BTreeMap<String, Percentiles>, String> {
    let mut merged: BTreeMap<String, Hdr> = BTreeMap::new();
    entries(bytes, unit, |entry| {
        match merged.get_mut(&entry.endpoint) {
            Some(total) => total.merge(&entry.latencies),
            None => {
                merged.insert(entry.endpoint, entry.latencies);
            }
        }
        Ok(())
    })?;
    Ok(merged
        .into_iter()
        .filter_map(|(tag, h)| h.percentiles().map(|p| (tag, p)))
        .collect())
}

/// The intervals of every endpoint, each at its absolute start, merged into one interval per
/// `granularity` (a step that divides both the alarm window and the hour: a day of one-second
/// intervals is then 1,440 histograms per endpoint at most, not 86,400); `None` when the log
/// does not say when its intervals were (no `StartTime` or `BaseTime` and timestamps under a
/// year, i.e. relative to an unknown start). Timestamps are read as HdrHistogram's
/// `HistogramLogReader` reads them: after a `BaseTime`, seconds since it; after a
/// `StartTime`, seconds since it when they are more than a year below it, else Unix seconds;
/// with neither, Unix seconds.
pub(crate) fn parse_timed(
    bytes: &[u8],
    unit: Duration,
    granularity: Duration,
) -> Result<Option<Timed>, String> {
    let step = granularity.as_secs().max(1);
    let mut merged: BTreeMap<(String, u64), Hdr> = BTreeMap::new();
    let mut untimed = false;
    entries(bytes, unit, |entry| {
        let since = entry
            .start
            .and_then(|start| start.duration_since(SystemTime::UNIX_EPOCH).ok());
        let Some(since) = since else {
            untimed = true;
            return Ok(());
        };
        let key = (entry.endpoint, since.as_secs() / step * step);
        match merged.get_mut(&key) {
            Some(total) => total.merge(&entry.latencies),
            None => {
                merged.insert(key, entry.latencies);
            }
        }
        Ok(())
    })?;
    if untimed {
        return Ok(None);
    }
    let mut out: Timed = BTreeMap::new();
    for ((endpoint, secs), latencies) in merged {
        out.entry(endpoint).or_default().push(Interval {
            start: SystemTime::UNIX_EPOCH + Duration::from_secs(secs),
            latencies,
        });
    }
    Ok(Some(out))
}

/// Each endpoint's intervals.
pub(crate) type Timed = BTreeMap<String, Vec<Interval<Hdr>>>;

/// An HdrHistogram of latencies in `unit`s, auto-resizing.
#[derive(Clone)]
pub(crate) struct Hdr {
    histogram: Histogram<u64>,
    unit: Duration,
}

impl Latencies for Hdr {
    fn merge(&mut self, other: &Self) {
        // Both auto-resize (see `entries`): adding fails only when a count would pass
        // u64::MAX, and then saturating is the honest answer.
        if self.histogram.add(&other.histogram).is_err() {
            for value in other.histogram.iter_recorded() {
                self.histogram
                    .saturating_record_n(value.value_iterated_to(), value.count_at_value());
            }
        }
    }

    fn count(&self) -> u64 {
        self.histogram.len()
    }

    fn percentiles(&self) -> Option<Percentiles> {
        percentiles(&self.histogram, self.unit)
    }
}

/// One interval of a log.
struct Entry {
    endpoint: String,
    start: Option<SystemTime>,
    latencies: Hdr,
}

/// A year of seconds: interval timestamps further below the `StartTime` are deltas.
const YEAR: Duration = Duration::from_secs(365 * 86_400);

fn entries(
    bytes: &[u8],
    unit: Duration,
    mut each: impl FnMut(Entry) -> Result<(), String>,
) -> Result<(), String> {
    let mut deserializer = Deserializer::new();
    let (mut start_time, mut base_time) = (None, None);
    for (index, entry) in IntervalLogIterator::new(bytes).enumerate() {
        let interval = match entry {
            Ok(LogEntry::Interval(interval)) => interval,
            Ok(LogEntry::StartTime(t)) => {
                start_time = Some(t);
                continue;
            }
            Ok(LogEntry::BaseTime(t)) => {
                base_time = Some(t);
                continue;
            }
            Err(e) => return Err(format!("log entry {}: not a log line ({e:?})", index + 1)),
        };
        let tag = interval.tag().map_or(UNTAGGED, |t| t.as_str());
        let compressed = base64::engine::general_purpose::STANDARD
            .decode(interval.encoded_histogram())
            .map_err(|e| {
                format!(
                    "log entry {} ({tag}): histogram is not base64: {e}",
                    index + 1
                )
            })?;
        let histogram: Histogram<u64> = deserializer
            .deserialize(&mut compressed.as_slice())
            .map_err(|e| {
                format!(
                    "log entry {} ({tag}): histogram does not decode: {e:?}",
                    index + 1
                )
            })?;
        let mut resizing =
            Histogram::new(histogram.sigfig()).map_err(|e| format!("{tag}: {e:?}"))?;
        resizing
            .add(&histogram)
            .map_err(|e| format!("log entry {} ({tag}): {e:?}", index + 1))?;
        let stamp = interval.start_timestamp();
        let since_epoch = match (base_time, start_time) {
            (Some(base), _) => base.checked_add(stamp),
            (None, Some(start)) if stamp.saturating_add(YEAR) < start => start.checked_add(stamp),
            (None, _) if stamp >= YEAR => Some(stamp),
            (None, _) => None,
        };
        each(Entry {
            endpoint: endpoint_of(tag),
            start: since_epoch.and_then(|d| SystemTime::UNIX_EPOCH.checked_add(d)),
            latencies: Hdr {
                histogram: resizing,
                unit,
            },
        })?;
    }
    Ok(())
}

/// The endpoint a tag names: `METHOD_/path` is `METHOD /path`; any other tag as it is.
fn endpoint_of(tag: &str) -> String {
    match tag.split_once('_') {
        Some((method, path))
            if !method.is_empty()
                && method.bytes().all(|b| b.is_ascii_uppercase())
                && path.starts_with('/') =>
        {
            format!("{method} {path}")
        }
        _ => tag.to_owned(),
    }
}

/// Nearest-rank percentiles of `h` (the lowest value each quantile's bucket stands for), or
/// `None` for an empty histogram or values beyond any latency.
fn percentiles(h: &Histogram<u64>, unit: Duration) -> Option<Percentiles> {
    if h.is_empty() {
        return None;
    }
    let at = |q: f64| {
        let value = h.lowest_equivalent(h.value_at_quantile(q));
        let secs = unit.as_secs_f64() * value as f64;
        (secs <= MAX_LATENCY_SECS).then(|| Duration::from_secs_f64(secs))
    };
    Some(Percentiles {
        p50: at(0.5)?,
        p90: at(0.9)?,
        p99: at(0.99)?,
        p999: at(0.999)?,
    })
}

/// The unit of `--hdr-unit`: `ns`, `us`, `ms` or `s`.
pub(crate) fn parse_unit(s: &str) -> Result<Duration, String> {
    match s {
        "ns" => Ok(Duration::from_nanos(1)),
        "us" => Ok(Duration::from_micros(1)),
        "ms" => Ok(Duration::from_millis(1)),
        "s" => Ok(Duration::from_secs(1)),
        other => Err(format!("{other:?} is not a unit: ns, us, ms or s")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hdrhistogram::serialization::V2DeflateSerializer;
    use hdrhistogram::serialization::interval_log::{IntervalLogWriterBuilder, Tag};

    fn log(intervals: &[(Option<&str>, &[u64])]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut serializer = V2DeflateSerializer::new();
        let mut writer = IntervalLogWriterBuilder::new()
            .begin_log_with(&mut out, &mut serializer)
            .expect("header");
        for (i, (tag, values)) in intervals.iter().enumerate() {
            let mut h = Histogram::<u64>::new(3).expect("histogram");
            for &v in *values {
                h.record(v).expect("in range");
            }
            writer
                .write_histogram(
                    &h,
                    Duration::from_secs(i as u64),
                    Duration::from_secs(1),
                    tag.and_then(Tag::new),
                )
                .expect("interval");
        }
        drop(writer);
        out
    }

    #[test]
    fn intervals_of_one_tag_add_up_and_untagged_ones_are_the_default() {
        let first: Vec<u64> = (1..=500).collect();
        let second: Vec<u64> = (501..=1000).collect();
        let bytes = log(&[
            (Some("GET_/a"), &first),
            (Some("GET_/a"), &second),
            (None, &[7, 7, 7]),
        ]);
        let p = parse(&bytes, Duration::from_millis(1)).expect("a log");
        let a = p["GET /a"];
        assert_eq!(a.p50, Duration::from_millis(500));
        assert_eq!(a.p999, Duration::from_millis(999));
        assert_eq!(p[UNTAGGED].p99, Duration::from_millis(7));
    }

    #[test]
    fn a_broken_line_is_named_not_skipped() {
        let mut bytes = log(&[(Some("GET_/a"), &[5])]);
        bytes.extend_from_slice(b"Tag=GET_/b,0.000,1.000,5.000,!!!notbase64!!!\n");
        let e = parse(&bytes, Duration::from_millis(1)).expect_err("garbage");
        assert!(e.contains("GET_/b") && e.contains("base64"), "{e}");
        assert!(parse_unit("minutes").is_err());
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_are_read_or_refused_without_a_panic(
            bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..400),
            line in "(Tag=[A-Z_/]{0,6},)?[0-9.]{0,6},[0-9.]{0,6},[0-9.]{0,6},[A-Za-z0-9+/=]{0,40}",
        ) {
            let _ = parse(&bytes, Duration::from_micros(1));
            let _ = parse(line.as_bytes(), Duration::from_secs(1));
            let _ = parse_timed(&bytes, Duration::from_micros(1), Duration::from_secs(60));
            let timed = format!("#[StartTime: 1772323200.000 (seconds since epoch)]\n{line}\n");
            let _ = parse_timed(timed.as_bytes(), Duration::from_secs(1), Duration::from_secs(60));
        }
    }

    #[test]
    fn interval_starts_follow_the_log_readers_rules() {
        let epoch = |s: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
        let write = |start: Option<u64>, base: Option<u64>, stamp: u64| {
            let mut out = Vec::new();
            let mut serializer = V2DeflateSerializer::new();
            let mut builder = IntervalLogWriterBuilder::new();
            if let Some(s) = start {
                builder.with_start_time(epoch(s));
            }
            if let Some(b) = base {
                builder.with_base_time(epoch(b));
            }
            let mut writer = builder
                .begin_log_with(&mut out, &mut serializer)
                .expect("header");
            let mut h = Histogram::<u64>::new(3).expect("histogram");
            h.record(5).expect("in range");
            writer
                .write_histogram(
                    &h,
                    Duration::from_secs(stamp),
                    Duration::from_secs(1),
                    Tag::new("a"),
                )
                .expect("interval");
            drop(writer);
            let timed =
                parse_timed(&out, Duration::from_millis(1), Duration::from_secs(1)).expect("a log");
            timed.map(|t| t["a"][0].start)
        };
        let t = 1_772_323_200;
        assert_eq!(write(Some(t), None, 60), Some(epoch(t + 60)), "a delta");
        assert_eq!(write(Some(t), None, t + 5), Some(epoch(t + 5)), "absolute");
        assert_eq!(
            write(None, Some(t), 60),
            Some(epoch(t + 60)),
            "after BaseTime"
        );
        assert_eq!(write(None, None, t), Some(epoch(t)), "Unix seconds");
        assert_eq!(write(None, None, 60), None, "relative to nothing");
    }

    #[test]
    fn a_method_and_path_tag_names_the_endpoint() {
        assert_eq!(endpoint_of("GET_/users_list/*"), "GET /users_list/*");
        assert_eq!(endpoint_of("checkout"), "checkout");
        assert_eq!(endpoint_of("get_/x"), "get_/x");
    }
}
