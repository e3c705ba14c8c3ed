//! The JSON of Prometheus's HTTP query API (`/api/v1/query`, `/api/v1/query_range`), read
//! into labels and numbers: the one reader of it, for `advise timeouts --prometheus` and the
//! policy center's PromQL collector alike.
//!
//! An answer is `{"status":"success","data":{"resultType":…,"result":[…]}}` or
//! `{"status":"error","errorType":…,"error":…}`; sample values are strings (`"0.5"`,
//! `"NaN"`, `"+Inf"`) read by [`parse_value`]. Whatever the
//! server sends, the answer is numbers or a [`QueryError`] saying what was wrong.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::exposition::parse_value;

/// A series' labels.
pub type Labels = BTreeMap<String, String>;

/// A range series' (Unix seconds, value) points.
pub type Points = Vec<(f64, f64)>;

/// Why an answer of the query API holds no result.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    /// The body is not the API's JSON (an HTML page, a proxy's error).
    #[error("a body that is not its JSON: {0}")]
    NotJson(String),
    /// Prometheus refused the query.
    #[error("{error_type}: {error}")]
    Refused {
        /// Its `errorType` (`bad_data`, `timeout`, …).
        error_type: String,
        /// Its `error`.
        error: String,
    },
    /// The JSON is not the result asked for.
    #[error("{0}")]
    Malformed(String),
}

#[derive(Deserialize)]
struct Answer {
    status: String,
    #[serde(default)]
    data: Option<Data>,
    #[serde(default, rename = "errorType")]
    error_type: String,
    #[serde(default)]
    error: String,
}

#[derive(Deserialize)]
struct Data {
    #[serde(rename = "resultType")]
    result_type: String,
    result: serde_json::Value,
}

#[derive(Deserialize)]
struct InstantSample {
    metric: Labels,
    value: (f64, String),
}

#[derive(Deserialize)]
struct RangeSeries {
    metric: Labels,
    values: Vec<(f64, String)>,
}

fn result<T: for<'de> Deserialize<'de>>(body: &str, kind: &str) -> Result<Vec<T>, QueryError> {
    let answer: Answer =
        serde_json::from_str(body).map_err(|e| QueryError::NotJson(e.to_string()))?;
    if answer.status != "success" {
        return Err(QueryError::Refused {
            error_type: answer.error_type,
            error: answer.error,
        });
    }
    let data = answer
        .data
        .ok_or_else(|| QueryError::Malformed("no data".into()))?;
    if data.result_type != kind {
        return Err(QueryError::Malformed(format!(
            "a {} result, not a {kind}",
            data.result_type
        )));
    }
    serde_json::from_value(data.result)
        .map_err(|e| QueryError::Malformed(format!("not a {kind} result: {e}")))
}

fn number(text: &str) -> Result<f64, QueryError> {
    parse_value(text).ok_or_else(|| QueryError::Malformed(format!("the value {text:?}")))
}

/// The samples of an instant query's answer: each series' labels and value.
///
/// ```
/// use stormguard::advise::prometheus::api::instant_vector;
///
/// let body = r#"{"status":"success","data":{"resultType":"vector",
///     "result":[{"metric":{"endpoint":"GET /"},"value":[1700000000,"0.25"]}]}}"#;
/// let samples = instant_vector(body)?;
/// assert_eq!((samples[0].0["endpoint"].as_str(), samples[0].1), ("GET /", 0.25));
/// assert!(instant_vector(r#"{"status":"error","errorType":"bad_data","error":"parse error"}"#)
///     .unwrap_err()
///     .to_string()
///     .contains("parse error"));
/// # Ok::<(), stormguard::advise::prometheus::api::QueryError>(())
/// ```
pub fn instant_vector(body: &str) -> Result<Vec<(Labels, f64)>, QueryError> {
    result::<InstantSample>(body, "vector")?
        .into_iter()
        .map(|s| Ok((s.metric, number(&s.value.1)?)))
        .collect()
}

/// The series of a range query's answer: each one's labels and (Unix seconds, value)
/// points.
pub fn range_matrix(body: &str) -> Result<Vec<(Labels, Points)>, QueryError> {
    result::<RangeSeries>(body, "matrix")?
        .into_iter()
        .map(|s| {
            let points = s
                .values
                .iter()
                .map(|(t, v)| Ok((*t, number(v)?)))
                .collect::<Result<_, QueryError>>()?;
            Ok((s.metric, points))
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn answers_are_read_or_refused_naming_why() {
        let body = r#"{"status":"success","data":{"resultType":"vector","result":[
            {"metric":{"endpoint":"GET /"},"value":[1700000000,"1.2"]},
            {"metric":{"endpoint":"POST /"},"value":[1700000000,"NaN"]}]}}"#;
        let v = instant_vector(body).unwrap();
        assert_eq!(v[0].1, 1.2);
        assert!(v[1].1.is_nan());
        let matrix = r#"{"status":"success","data":{"resultType":"matrix","result":[
            {"metric":{"le":"0.5"},"values":[[1700000300,"0.2"],[1700000600,"+Inf"]]}]}}"#;
        let m = range_matrix(matrix).unwrap();
        assert_eq!(m[0].0["le"], "0.5");
        assert_eq!(
            m[0].1,
            [(1_700_000_300.0, 0.2), (1_700_000_600.0, f64::INFINITY)]
        );
        for (body, what) in [
            ("<html>", "not its JSON"),
            (
                r#"{"status":"error","errorType":"bad_data","error":"parse error"}"#,
                "bad_data: parse error",
            ),
            (r#"{"status":"success"}"#, "no data"),
            (matrix, "a matrix result, not a vector"),
            (
                r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"x"]}]}}"#,
                "the value \"x\"",
            ),
        ] {
            let error = instant_vector(body).unwrap_err().to_string();
            assert!(error.contains(what), "{body}: {error}");
        }
        assert!(range_matrix(body).is_err());
    }

    proptest! {
        #[test]
        fn any_body_is_numbers_or_an_error(body in "\\PC{0,200}") {
            let _ = instant_vector(&body);
            let _ = range_matrix(&body);
        }
    }
}
