//! The graph as its file writes it, and how it becomes a validated [`CallGraph`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::{
    Bucket, Call, CallGraph, DEFAULT_RETRY_ON, Endpoint, GraphError, Latency, PolicyOrigin,
    Service, Source, idempotent_by_name,
};
use crate::duration::{MAX_QUOTED, cut};
use crate::policy::limits::MAX_FILE_BYTES;
use crate::policy::text::{Key, json_offset, toml_offset};
use crate::policy::{EndpointPolicy, Location, PolicyFile};

/// The longest message kept from a parser, in characters.
const MAX_MESSAGE: usize = 512;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGraph {
    #[serde(default)]
    services: BTreeMap<String, RawService>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawService {
    #[serde(default)]
    retry_signal: bool,
    workers: Option<u32>,
    queue: Option<u32>,
    honours_deadline: Option<bool>,
    #[serde(default)]
    endpoints: BTreeMap<String, RawEndpoint>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEndpoint {
    idempotent: Option<bool>,
    #[serde(default)]
    latency: Option<RawLatency>,
    failure_rate: Option<f64>,
    requests_per_sec: Option<f64>,
    #[serde(default)]
    calls: Vec<RawCall>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLatency {
    #[serde(default, with = "crate::duration::serde_duration_opt")]
    p50: Option<Duration>,
    #[serde(default, with = "crate::duration::serde_duration_opt")]
    p90: Option<Duration>,
    #[serde(default, with = "crate::duration::serde_duration_opt")]
    p99: Option<Duration>,
    #[serde(default, with = "crate::duration::serde_duration_opt")]
    p999: Option<Duration>,
    histogram: Option<Vec<RawBucket>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBucket {
    #[serde(with = "crate::duration::serde_duration")]
    le: Duration,
    count: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCall {
    to: String,
    endpoint: String,
    policy: Option<EndpointPolicy>,
    policy_ref: Option<String>,
    #[serde(default)]
    idempotency_key: bool,
    retry_on: Option<Vec<u16>>,
}

pub(super) fn load(path: &Path) -> Result<CallGraph, GraphError> {
    let read = |message: String| GraphError::Read {
        file: path.to_owned(),
        message: cut(&message, MAX_MESSAGE),
    };
    let json = match path.extension().and_then(|e| e.to_str()) {
        Some(e) if e.eq_ignore_ascii_case("toml") => false,
        Some(e) if e.eq_ignore_ascii_case("json") => true,
        _ => {
            return Err(read(
                "a graph file's name ends in .toml or .json (that is how its format is known)"
                    .to_owned(),
            ));
        }
    };
    let size = std::fs::metadata(path)
        .map_err(|e| read(e.to_string()))?
        .len();
    if size > MAX_FILE_BYTES {
        return Err(read(format!(
            "{size} bytes is larger than the {MAX_FILE_BYTES}-byte maximum of a graph file"
        )));
    }
    let bytes = std::fs::read(path).map_err(|e| read(e.to_string()))?;
    let text = String::from_utf8(bytes).map_err(|e| read(format!("not UTF-8: {e}")))?;
    parse(&text, json, Some(path))
}

pub(super) fn parse(text: &str, json: bool, file: Option<&Path>) -> Result<CallGraph, GraphError> {
    let located = |mut at: Location| {
        at.file = file.map(Path::to_owned);
        at
    };
    let raw: RawGraph = if json {
        let mut de = serde_json::Deserializer::from_str(text);
        let syntax = |field: String, e: serde_json::Error| {
            let message = e.to_string();
            let suffix = format!(" at line {} column {}", e.line(), e.column());
            GraphError::Syntax {
                at: located(Location {
                    file: None,
                    line: e.line(),
                    column: e.column(),
                }),
                field,
                message: cut(
                    message.strip_suffix(&suffix).unwrap_or(&message),
                    MAX_MESSAGE,
                ),
            }
        };
        let raw = serde_path_to_error::deserialize(&mut de)
            .map_err(|e| syntax(path(e.path()), e.into_inner()))?;
        de.end().map_err(|e| syntax(String::new(), e))?;
        raw
    } else {
        let syntax = |field: String, e: toml::de::Error| GraphError::Syntax {
            at: located(Location::of(text, e.span().map_or(0, |s| s.start))),
            field,
            message: cut(e.message().trim_end(), MAX_MESSAGE),
        };
        let root = toml::de::DeTable::parse(text).map_err(|e| syntax(String::new(), e))?;
        serde_path_to_error::deserialize(toml::Deserializer::from(root))
            .map_err(|e| syntax(path(e.path()), e.into_inner()))?
    };
    let source = Source {
        file: file.map(Path::to_owned),
        text: text.to_owned(),
        json,
    };
    let base = file
        .and_then(Path::parent)
        .map_or_else(PathBuf::new, Path::to_owned);
    Builder {
        source: &source,
        base,
        files: BTreeMap::new(),
    }
    .build(raw)
    .map(|services| CallGraph {
        services,
        source: Some(source.clone()),
    })
}

/// A serde path in the graph's notation: service and endpoint names quoted.
fn path(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut out = String::new();
    for (depth, segment) in path.iter().enumerate() {
        match segment {
            Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            Segment::Map { key } | Segment::Enum { variant: key } => {
                if !out.is_empty() {
                    out.push('.');
                }
                if depth == 1 || depth == 3 {
                    out.push_str(&format!("{:?}", cut(key, MAX_QUOTED)));
                } else {
                    out.push_str(&cut(key, MAX_QUOTED));
                }
            }
            Segment::Unknown => out.push_str(".?"),
        }
    }
    out
}

/// One step of a field path, owned.
#[derive(Clone)]
enum Step {
    Name(String),
    Index(usize),
}

/// A field path as steps, printed in the graph's notation.
#[derive(Clone)]
struct Steps(Vec<Step>);

impl Steps {
    fn service(service: &str) -> Steps {
        Steps(vec![
            Step::Name("services".into()),
            Step::Name(service.into()),
        ])
    }

    fn endpoint(service: &str, endpoint: &str) -> Steps {
        Steps(vec![
            Step::Name("services".into()),
            Step::Name(service.into()),
            Step::Name("endpoints".into()),
            Step::Name(endpoint.into()),
        ])
    }

    fn then(&self, step: Step) -> Steps {
        let mut steps = self.0.clone();
        steps.push(step);
        Steps(steps)
    }

    fn field(&self, name: &str) -> Steps {
        self.then(Step::Name(name.to_owned()))
    }

    fn show(&self) -> String {
        let mut out = String::new();
        for (depth, step) in self.0.iter().enumerate() {
            match step {
                Step::Index(i) => out.push_str(&format!("[{i}]")),
                Step::Name(name) => {
                    if !out.is_empty() {
                        out.push('.');
                    }
                    if depth == 1 || depth == 3 {
                        out.push_str(&format!("{:?}", cut(name, MAX_QUOTED)));
                    } else {
                        out.push_str(name);
                    }
                }
            }
        }
        out
    }
}

/// Where the text writes the field at `field` (a path in the graph's notation, as
/// [`Call::field`] holds one, optionally followed by policy fields): the line and column of
/// that field or of the nearest enclosing table the text writes.
pub(super) fn locate(source: &Source, field: &str) -> Location {
    let mut keys: Vec<Key<'_>> = Vec::new();
    for segment in split_path(field) {
        let (name, index) = match segment.split_once('[') {
            Some((name, rest)) => (name, rest.strip_suffix(']').and_then(|i| i.parse().ok())),
            None => (segment, None),
        };
        let name = name
            .strip_prefix('"')
            .and_then(|n| n.strip_suffix('"'))
            .unwrap_or(name);
        if !name.is_empty() {
            keys.push(Key::Name(name));
        }
        keys.extend(index.map(Key::Index));
    }
    let offset = if source.json {
        json_offset(&source.text, &keys)
    } else {
        toml_offset(&source.text, &keys)
    };
    let mut at = Location::of(&source.text, offset);
    at.file.clone_from(&source.file);
    at
}

/// `field` split at the dots outside quotes.
fn split_path(field: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut start, mut quoted) = (0, false);
    for (i, c) in field.char_indices() {
        match c {
            '"' => quoted = !quoted,
            '.' if !quoted => {
                out.push(&field[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&field[start..]);
    out
}

struct Builder<'a> {
    source: &'a Source,
    base: PathBuf,
    files: BTreeMap<PathBuf, PolicyFile>,
}

impl Builder<'_> {
    fn invalid(&self, at: &Steps, rule: impl Into<String>) -> GraphError {
        let field = at.show();
        GraphError::Invalid {
            at: locate(self.source, &field),
            field,
            rule: cut(&rule.into(), MAX_MESSAGE),
        }
    }

    fn build(mut self, raw: RawGraph) -> Result<BTreeMap<String, Service>, GraphError> {
        let names: BTreeMap<&str, Vec<&str>> = raw
            .services
            .iter()
            .map(|(s, service)| {
                (
                    s.as_str(),
                    service.endpoints.keys().map(String::as_str).collect(),
                )
            })
            .collect();
        let mut services = BTreeMap::new();
        for (service_name, raw_service) in &raw.services {
            let mut endpoints = BTreeMap::new();
            let service_at = Steps::service(service_name);
            if raw_service.workers == Some(0) {
                return Err(self.invalid(
                    &service_at.field("workers"),
                    "a service needs at least one worker (leave it out for no limit)",
                ));
            }
            if raw_service.queue.is_some() && raw_service.workers.is_none() {
                return Err(self.invalid(
                    &service_at.field("queue"),
                    "a queue only makes sense in front of a limited number of `workers`",
                ));
            }
            for (endpoint_name, raw_endpoint) in &raw_service.endpoints {
                let at = Steps::endpoint(service_name, endpoint_name);
                let endpoint = self.endpoint(&names, &at, endpoint_name, raw_endpoint)?;
                endpoints.insert(endpoint_name.clone(), endpoint);
            }
            services.insert(
                service_name.clone(),
                Service {
                    retry_signal: raw_service.retry_signal,
                    workers: raw_service.workers,
                    queue: raw_service.queue,
                    honours_deadline: raw_service.honours_deadline.unwrap_or(true),
                    endpoints,
                },
            );
        }
        self.check_acyclic(&services)?;
        Ok(services)
    }

    fn endpoint(
        &mut self,
        names: &BTreeMap<&str, Vec<&str>>,
        at: &Steps,
        name: &str,
        raw: &RawEndpoint,
    ) -> Result<Endpoint, GraphError> {
        if let Some(rate) = raw.failure_rate {
            if !(0.0..=1.0).contains(&rate) {
                return Err(self.invalid(
                    &at.field("failure_rate"),
                    format!("a share of calls, 0..=1, got {rate}"),
                ));
            }
        }
        if let Some(rate) = raw.requests_per_sec {
            if !(rate.is_finite() && rate >= 0.0) {
                return Err(self.invalid(
                    &at.field("requests_per_sec"),
                    format!("a finite number >= 0, got {rate}"),
                ));
            }
        }
        let (latency, histogram) = match &raw.latency {
            None => (Latency::default(), Vec::new()),
            Some(l) => self.latency(&at.field("latency"), l)?,
        };
        let mut calls = Vec::with_capacity(raw.calls.len());
        for (index, call) in raw.calls.iter().enumerate() {
            let call_at = at.field("calls").then(Step::Index(index));
            calls.push(self.call(names, &call_at, call)?);
        }
        Ok(Endpoint {
            idempotent: raw.idempotent.unwrap_or_else(|| idempotent_by_name(name)),
            latency,
            histogram,
            failure_rate: raw.failure_rate,
            requests_per_sec: raw.requests_per_sec,
            calls,
        })
    }

    fn latency(&self, at: &Steps, raw: &RawLatency) -> Result<(Latency, Vec<Bucket>), GraphError> {
        let given = Latency {
            p50: raw.p50,
            p90: raw.p90,
            p99: raw.p99,
            p999: raw.p999,
        };
        // A quantile function does not fall: a percentile below an earlier one is a typo
        // (`p99 = "10ms"` under `p50 = "100ms"`), not a latency.
        let mut earlier: Option<(&str, Duration)> = None;
        for (name, value) in [
            ("p50", raw.p50),
            ("p90", raw.p90),
            ("p99", raw.p99),
            ("p999", raw.p999),
        ] {
            let Some(value) = value else {
                continue;
            };
            if let Some((lower, bound)) = earlier
                && value < bound
            {
                return Err(self.invalid(
                    &at.field(name),
                    format!(
                        "{name} ({value:?}) is below {lower} ({bound:?}): percentiles cannot fall"
                    ),
                ));
            }
            earlier = Some((name, value));
        }
        let Some(buckets) = &raw.histogram else {
            return Ok((given, Vec::new()));
        };
        if given != Latency::default() {
            return Err(self.invalid(
                &at.field("histogram"),
                "give the latency as percentiles or as a histogram, not both",
            ));
        }
        let histogram_at = at.field("histogram");
        let total: u64 = buckets.iter().map(|b| b.count).fold(0, u64::saturating_add);
        if total == 0 {
            return Err(self.invalid(&histogram_at, "a histogram needs at least one count"));
        }
        for (index, pair) in buckets.windows(2).enumerate() {
            if pair[1].le <= pair[0].le {
                return Err(self.invalid(
                    &histogram_at.then(Step::Index(index + 1)).field("le"),
                    "bucket bounds must increase",
                ));
            }
        }
        let quantile = |q: f64| {
            let mut seen = 0u64;
            for bucket in buckets {
                seen = seen.saturating_add(bucket.count);
                #[allow(clippy::cast_precision_loss)]
                if seen as f64 >= q * total as f64 {
                    return Some(bucket.le);
                }
            }
            buckets.last().map(|b| b.le)
        };
        let latency = Latency {
            p50: quantile(0.5),
            p90: quantile(0.9),
            p99: quantile(0.99),
            p999: quantile(0.999),
        };
        let kept = buckets
            .iter()
            .map(|b| Bucket {
                le: b.le,
                count: b.count,
            })
            .collect();
        Ok((latency, kept))
    }

    fn call(
        &mut self,
        names: &BTreeMap<&str, Vec<&str>>,
        at: &Steps,
        raw: &RawCall,
    ) -> Result<Call, GraphError> {
        match names.get(raw.to.as_str()) {
            None => {
                return Err(self.invalid(
                    &at.field("to"),
                    format!("no service {:?} in the graph", cut(&raw.to, MAX_QUOTED)),
                ));
            }
            Some(endpoints) if !endpoints.contains(&raw.endpoint.as_str()) => {
                return Err(self.invalid(
                    &at.field("endpoint"),
                    format!(
                        "service {:?} has no endpoint {:?}",
                        cut(&raw.to, MAX_QUOTED),
                        cut(&raw.endpoint, MAX_QUOTED)
                    ),
                ));
            }
            Some(_) => {}
        }
        let retry_on = raw
            .retry_on
            .clone()
            .unwrap_or_else(|| DEFAULT_RETRY_ON.to_vec());
        if let Some(bad) = retry_on.iter().find(|s| !(100..=599).contains(*s)) {
            return Err(self.invalid(
                &at.field("retry_on"),
                format!("{bad} is not an HTTP status (100..=599)"),
            ));
        }
        let (policy, origin) = match (&raw.policy, &raw.policy_ref) {
            (Some(policy), None) => (policy.clone(), PolicyOrigin::Inline),
            (None, Some(reference)) => self.reference(&at.field("policy_ref"), reference)?,
            _ => {
                return Err(self.invalid(
                    at,
                    "a call gives its policy either inline (`policy`) or by reference (`policy_ref`), exactly one",
                ));
            }
        };
        Ok(Call {
            service: raw.to.clone(),
            endpoint: raw.endpoint.clone(),
            policy,
            origin,
            idempotency_key: raw.idempotency_key,
            retry_on,
            field: at.show(),
        })
    }

    fn reference(
        &mut self,
        at: &Steps,
        reference: &str,
    ) -> Result<(EndpointPolicy, PolicyOrigin), GraphError> {
        let Some((file, endpoint)) = reference.split_once('#') else {
            return Err(self.invalid(
                at,
                "a reference is FILE#ENDPOINT, e.g. \"policies.toml#POST /pay\"",
            ));
        };
        let path = self.base.join(file);
        if !self.files.contains_key(&path) {
            let loaded = PolicyFile::load(&path).map_err(|source| GraphError::Policy {
                field: at.show(),
                source,
            })?;
            self.files.insert(path.clone(), loaded);
        }
        let policy = self
            .files
            .get(&path)
            .and_then(|f| f.endpoint(endpoint))
            .cloned()
            .ok_or_else(|| {
                self.invalid(
                    at,
                    format!(
                        "{} has no endpoint {:?}",
                        path.display(),
                        cut(endpoint, MAX_QUOTED)
                    ),
                )
            })?;
        Ok((
            policy,
            PolicyOrigin::File {
                path,
                endpoint: endpoint.to_owned(),
            },
        ))
    }

    fn check_acyclic(&self, services: &BTreeMap<String, Service>) -> Result<(), GraphError> {
        if let Some(call) = super::walk::cycle(services) {
            return Err(GraphError::Invalid {
                at: locate(self.source, &call.field),
                field: call.field.clone(),
                rule: format!(
                    "this call closes a cycle back to {:?} {:?}: calls must not form a cycle",
                    cut(&call.service, MAX_QUOTED),
                    cut(&call.endpoint, MAX_QUOTED)
                ),
            });
        }
        if let Some((call, depth)) = super::walk::too_deep(services) {
            return Err(GraphError::TooDeep {
                at: locate(self.source, &call.field),
                field: call.field.clone(),
                depth,
                limit: super::MAX_DEPTH,
            });
        }
        Ok(())
    }
}
