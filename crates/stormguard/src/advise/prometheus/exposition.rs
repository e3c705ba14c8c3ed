//! The Prometheus text exposition format (version 0.0.4), read into samples: the one reader
//! of it, for `advise timeouts`' snapshot files and the policy center's scrapes alike.
//!
//! A small reader of our own rather than a crate: both need the samples only (names,
//! labels, values; comments and `# TYPE` lines are skipped, the series names tell counters
//! from histograms), and what an instance serves is input from the network, so every
//! malformed line must be a typed error naming its line, never a panic. Timestamps are
//! accepted and ignored: a scrape's instant is when it was read.

use std::collections::BTreeMap;

/// The most samples one exposition may hold.
pub const MAX_SAMPLES: usize = 100_000;

/// One sample: a series name, its labels and its value.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// The series name (`stormguard_requests_total`, `…_bucket`).
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its value (`+Inf`, `-Inf` and `NaN` included).
    pub value: f64,
}

impl Sample {
    /// The value of label `name`, or `""` (Prometheus treats a missing label as empty).
    pub fn label(&self, name: &str) -> &str {
        self.labels.get(name).map_or("", String::as_str)
    }
}

/// Why an exposition could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExpositionError {
    /// A line is not a comment, blank, or `name{labels} value [timestamp]`.
    #[error("line {line}: {what}")]
    Line {
        /// 1-based.
        line: usize,
        /// What was wrong.
        what: String,
    },
    /// More than [`MAX_SAMPLES`] samples.
    #[error("more than {MAX_SAMPLES} samples")]
    TooManySamples,
}

/// Reads every sample of `text`.
///
/// ```
/// use stormguard::advise::prometheus::exposition::parse;
///
/// let samples = parse("# TYPE x counter\nx_total{code=\"504\"} 3\n")?;
/// assert_eq!(samples[0].name, "x_total");
/// assert_eq!(samples[0].label("code"), "504");
/// assert_eq!(samples[0].value, 3.0);
/// assert!(parse("x_total{code=504} 3").is_err());
/// # Ok::<(), stormguard::advise::prometheus::exposition::ExpositionError>(())
/// ```
pub fn parse(text: &str) -> Result<Vec<Sample>, ExpositionError> {
    Ok(parse_lines(text)?.into_iter().map(|(_, s)| s).collect())
}

/// Reads every sample of `text` with its line number (from 1), for errors about a sample
/// that is well formed but not what the reader needs.
pub fn parse_lines(text: &str) -> Result<Vec<(usize, Sample)>, ExpositionError> {
    let mut samples = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let line = line.trim_matches(|c| c == ' ' || c == '\t' || c == '\r');
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if samples.len() == MAX_SAMPLES {
            return Err(ExpositionError::TooManySamples);
        }
        let sample = parse_line(line).map_err(|what| ExpositionError::Line {
            line: index + 1,
            what,
        })?;
        samples.push((index + 1, sample));
    }
    Ok(samples)
}

fn parse_line(line: &str) -> Result<Sample, String> {
    let name_end = line
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .unwrap_or(line.len());
    let name = &line[..name_end];
    if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
        return Err(format!("expected a metric name at {:?}", cut(line)));
    }
    let mut rest = &line[name_end..];
    let mut labels = BTreeMap::new();
    if let Some(after) = rest.strip_prefix('{') {
        rest = parse_labels(after, &mut labels)?;
    }
    if !rest.is_empty() && !rest.starts_with([' ', '\t']) {
        return Err(format!("{name}: expected a space before the value"));
    }
    let mut fields = rest.split_ascii_whitespace();
    let value = fields
        .next()
        .ok_or_else(|| format!("{name}: no value"))
        .and_then(|v| {
            parse_value(v).ok_or_else(|| format!("{name}: value {:?} is not a number", cut(v)))
        })?;
    if let Some(timestamp) = fields.next() {
        if timestamp.parse::<i64>().is_err() {
            return Err(format!(
                "{name}: timestamp {:?} is not an integer",
                cut(timestamp)
            ));
        }
    }
    if let Some(extra) = fields.next() {
        return Err(format!(
            "{name}: unexpected {:?} after the value",
            cut(extra)
        ));
    }
    Ok(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

/// Reads `key="value",…}` and returns what follows the `}`.
fn parse_labels<'a>(
    mut text: &'a str,
    labels: &mut BTreeMap<String, String>,
) -> Result<&'a str, String> {
    loop {
        text = text.trim_start_matches([' ', '\t']);
        if let Some(after) = text.strip_prefix('}') {
            return Ok(after);
        }
        let key_end = text
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(text.len());
        let key = &text[..key_end];
        if key.is_empty() || key.starts_with(|c: char| c.is_ascii_digit()) {
            return Err(format!("expected a label name at {:?}", cut(text)));
        }
        text = text[key_end..].trim_start_matches([' ', '\t']);
        text = text
            .strip_prefix("=\"")
            .ok_or_else(|| format!("label {key}: expected =\"value\""))?;
        let mut value = String::new();
        let mut chars = text.char_indices();
        let end = loop {
            match chars.next() {
                None => return Err(format!("label {key}: the value has no closing quote")),
                Some((i, '"')) => break i,
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, '\\')) => value.push('\\'),
                    Some((_, '"')) => value.push('"'),
                    other => {
                        return Err(format!(
                            "label {key}: bad escape \\{}",
                            other.map_or(String::new(), |(_, c)| c.to_string())
                        ));
                    }
                },
                Some((_, c)) => value.push(c),
            }
        };
        if labels.insert(key.to_owned(), value).is_some() {
            return Err(format!("label {key} appears twice"));
        }
        text = text[end + 1..].trim_start_matches([' ', '\t']);
        if let Some(after) = text.strip_prefix(',') {
            text = after;
        } else if !text.starts_with('}') {
            return Err(format!("label {key}: expected , or }} after the value"));
        }
    }
}

/// A sample value or a label value such as `le`: a decimal or exponent number, `+Inf`,
/// `Inf`, `-Inf` or `NaN` (not Rust's wider spellings, `inf` or `infinity`).
///
/// ```
/// use stormguard::advise::prometheus::exposition::parse_value;
/// assert_eq!(parse_value("+Inf"), Some(f64::INFINITY));
/// assert_eq!(parse_value("1e3"), Some(1000.0));
/// assert_eq!(parse_value("infinity"), None);
/// ```
pub fn parse_value(text: &str) -> Option<f64> {
    match text {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ if text
            .bytes()
            .all(|b| b.is_ascii_digit() || b"+-.eE".contains(&b)) =>
        {
            text.parse().ok()
        }
        _ => None,
    }
}

fn cut(text: &str) -> String {
    text.chars().take(40).collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn reads_what_the_exporter_writes() {
        let text = "# HELP stormguard_requests_total Logical requests.\n\
            # TYPE stormguard_requests_total counter\n\
            stormguard_requests_total{endpoint=\"GET /img/*\",outcome=\"succeeded\"} 12\n\
            stormguard_attempt_duration_seconds_bucket{endpoint=\"img\",le=\"+Inf\"} 4 1700000000000\n\
            process_resident_memory_bytes 1.5e7\n\
            weird{a=\"q\\\"u\\\\o\\nte\",} NaN\n";
        let samples = parse(text).unwrap();
        assert_eq!(samples.len(), 4);
        assert_eq!(samples[0].label("endpoint"), "GET /img/*");
        assert_eq!(samples[1].label("le"), "+Inf");
        assert_eq!(samples[2].value, 1.5e7);
        assert_eq!(samples[3].label("a"), "q\"u\\o\nte");
        assert!(samples[3].value.is_nan());
    }

    #[test]
    fn garbage_is_refused_naming_the_line() {
        for (text, what) in [
            ("ok 1\n{a=\"b\"} 1", "line 2: expected a metric name"),
            ("x{a=b} 1", "expected =\"value\""),
            ("x{a=\"b} 1", "no closing quote"),
            ("x{a=\"b\",a=\"c\"} 1", "appears twice"),
            ("x one", "is not a number"),
            ("x", "no value"),
            ("x 1 2 3", "unexpected"),
            ("x 1 soon", "timestamp"),
            ("x{a=\"\\t\"} 1", "bad escape"),
            ("x{a=\"b\" c=\"d\"} 1", "expected , or }"),
            ("<html>", "expected a metric name"),
        ] {
            let error = parse(text).unwrap_err().to_string();
            assert!(error.contains(what), "{text:?}: {error}");
        }
    }

    fn render(samples: &[Sample]) -> String {
        let mut out = String::new();
        for s in samples {
            out.push_str(&s.name);
            if !s.labels.is_empty() {
                let labels: Vec<String> = s
                    .labels
                    .iter()
                    .map(|(k, v)| {
                        let v = v
                            .replace('\\', "\\\\")
                            .replace('"', "\\\"")
                            .replace('\n', "\\n");
                        format!("{k}=\"{v}\"")
                    })
                    .collect();
                out.push_str(&format!("{{{}}}", labels.join(",")));
            }
            out.push_str(&format!(" {:?}\n", s.value));
        }
        out
    }

    fn sample() -> impl Strategy<Value = Sample> {
        (
            "[a-zA-Z_:][a-zA-Z0-9_:]{0,20}",
            proptest::collection::btree_map("[a-zA-Z_][a-zA-Z0-9_]{0,10}", "\\PC{0,12}", 0..4),
            -1e12f64..1e12,
        )
            .prop_map(|(name, labels, value)| Sample {
                name,
                labels,
                value,
            })
    }

    proptest! {
        #[test]
        fn what_is_written_reads_back(samples in proptest::collection::vec(sample(), 0..8)) {
            prop_assert_eq!(parse(&render(&samples)).unwrap(), samples);
        }

        #[test]
        fn any_text_reads_or_is_refused_without_a_panic(text in "\\PC{0,200}") {
            let _ = parse(&text);
        }

        #[test]
        fn exposition_shaped_noise_never_panics(text in "[a-z_{}=\",\\\\ .0-9eE+#\n-]{0,120}") {
            let _ = parse(&text);
        }
    }
}
