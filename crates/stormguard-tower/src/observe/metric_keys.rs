//! The keys of the metrics every call records, built once per endpoint.
//!
//! *Why:* `counter!(NAME, "endpoint" => name, "code" => code)` builds its key each time: a
//! `String` for each label value, a `Vec` of labels and a hash over all of it, then the
//! recorder looks the key up. A call records four or five such metrics, so the client stack
//! spent about as much on naming its metrics (nine allocations a call) as on parsing the
//! response head. The keys below are built when the endpoint is (the endpoint label shares
//! one `Arc<str>`, and a [`Key`] keeps its hash), and the recorder is still asked for each
//! record: a recorder installed later, or a thread's local recorder in a test, sees every
//! record, as with the macros.
//!
//! Label values that vary per call (the outcome, the status code, the retry reason) get a
//! key each the first time they are seen, up to [`SLOTS`] values per metric; a value past
//! that builds its key per record, as the macros do.

use std::borrow::Cow;
use std::sync::{Arc, OnceLock};

use metrics::{Key, Label, Level, Metadata, SharedString};

use crate::metric_names::{ATTEMPT_DURATION, ATTEMPTS, REQUESTS, RESPONSES, RETRIES, RETRY_DELAY};

/// The metadata the macros would give this module's records.
pub(super) static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

/// Label values kept per metric: the outcomes, retry reasons and status codes one endpoint
/// sees in practice fit.
pub(super) const SLOTS: usize = 8;

/// One endpoint's keys for the metrics recorded on every call.
#[derive(Clone, Debug)]
pub(crate) struct EndpointKeys {
    endpoint: SharedString,
    pub(super) attempts: Key,
    pub(super) attempt_duration: Key,
    pub(super) retry_delay: Key,
    /// [`REQUESTS`] by `outcome`.
    pub(super) requests: LabelledKeys<&'static str>,
    /// [`RESPONSES`] by `code` (0 for `none`).
    pub(super) responses: LabelledKeys<u16>,
    /// [`RETRIES`] by `reason`.
    pub(super) retries: LabelledKeys<&'static str>,
}

impl EndpointKeys {
    /// The keys of `endpoint`'s metrics.
    pub(crate) fn new(endpoint: &Arc<str>) -> Self {
        let endpoint = SharedString::from(Arc::clone(endpoint));
        let plain = |name: &'static str| {
            Key::from_parts(name, vec![Label::new("endpoint", endpoint.clone())])
        };
        EndpointKeys {
            attempts: plain(ATTEMPTS),
            attempt_duration: plain(ATTEMPT_DURATION),
            retry_delay: plain(RETRY_DELAY),
            requests: LabelledKeys::new(REQUESTS, "outcome"),
            responses: LabelledKeys::new(RESPONSES, "code"),
            retries: LabelledKeys::new(RETRIES, "reason"),
            endpoint,
        }
    }

    /// The key of `keys`'s metric for the label value `id` (shown as `value()`).
    pub(super) fn labelled<'k, T: Copy + PartialEq, V: Into<SharedString>>(
        &self,
        keys: &'k LabelledKeys<T>,
        id: T,
        value: impl Fn() -> V,
    ) -> Cow<'k, Key> {
        let build = || {
            Key::from_parts(
                keys.name,
                vec![
                    Label::new("endpoint", self.endpoint.clone()),
                    Label::new(keys.label, value()),
                ],
            )
        };
        keys.get(id, build)
    }
}

/// One metric's keys by a label value, kept for the first [`SLOTS`] values seen.
#[derive(Clone, Debug)]
pub(crate) struct LabelledKeys<T> {
    name: &'static str,
    label: &'static str,
    slots: [OnceLock<(T, Key)>; SLOTS],
}

impl<T: Copy + PartialEq> LabelledKeys<T> {
    fn new(name: &'static str, label: &'static str) -> Self {
        LabelledKeys {
            name,
            label,
            slots: std::array::from_fn(|_| OnceLock::new()),
        }
    }

    /// The key for `id`: the kept one, or kept now in the first free slot; built for this
    /// record alone when every slot holds another value. Two threads filling the same free
    /// slot with different values is harmless: only one fills it, and the other goes on to
    /// the next slot.
    fn get(&self, id: T, build: impl Fn() -> Key) -> Cow<'_, Key> {
        for slot in &self.slots {
            let (kept, key) = slot.get_or_init(|| (id, build()));
            if *kept == id {
                return Cow::Borrowed(key);
            }
        }
        Cow::Owned(build())
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;
    use std::sync::Arc;
    use std::time::Duration;

    use http::{Method, StatusCode};
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    use stormguard::classify::Outcome;
    use stormguard::retry::StopReason;

    use super::{EndpointKeys, SLOTS};
    use crate::observe::{AttemptEnd, CallEnd, CallInfo};
    use crate::wire::Protocol;

    fn labels(key: &metrics::Key) -> Vec<String> {
        key.labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect()
    }

    #[test]
    fn a_value_keeps_its_key_and_one_past_the_slots_is_built_per_record() {
        let keys = EndpointKeys::new(&Arc::from("GET /users"));
        let codes: Vec<u16> = (0..SLOTS as u16).map(|i| 200 + i).collect();
        let kept: Vec<*const metrics::Key> = codes
            .iter()
            .map(
                |&code| match keys.labelled(&keys.responses, code, || code.to_string()) {
                    Cow::Borrowed(key) => std::ptr::from_ref(key),
                    Cow::Owned(key) => panic!("{code} not kept: {key:?}"),
                },
            )
            .collect();
        for (&code, &first) in codes.iter().zip(&kept) {
            let again = keys.labelled(&keys.responses, code, || code.to_string());
            assert!(matches!(again, Cow::Borrowed(key) if std::ptr::eq(key, first)));
            assert_eq!(
                labels(&again),
                ["endpoint=GET /users".to_owned(), format!("code={code}")]
            );
        }
        let past = keys.labelled(&keys.responses, 599, || "599");
        assert!(matches!(past, Cow::Owned(_)));
        assert_eq!(labels(&past), ["endpoint=GET /users", "code=599"]);
    }

    #[test]
    fn keys_built_before_the_recorder_record_into_it_like_the_macros() {
        let keys = EndpointKeys::new(&Arc::from("pay"));
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::with_local_recorder(&recorder, || {
            let method = Method::POST;
            let with_keys =
                CallInfo::new("pay", &method, Protocol::Http, None).with_metric_keys(&keys);
            let without = CallInfo::new("pay", &method, Protocol::Http, None);
            for (call, status) in [
                (with_keys, Some(StatusCode::SERVICE_UNAVAILABLE)),
                (without, Some(StatusCode::SERVICE_UNAVAILABLE)),
                (with_keys, None),
            ] {
                let end = AttemptEnd {
                    number: 1,
                    elapsed: Duration::from_millis(250),
                    outcome: Outcome::Retryable,
                    timed_out: status.is_none(),
                    status,
                    grpc_status: None,
                    error_type: None,
                };
                super::super::metrics::attempt_ended(&call, &end);
            }
            let end = CallEnd {
                attempts: 3,
                stop: StopReason::AttemptsExhausted,
                elapsed: Duration::from_secs(1),
                marked_exhausted: true,
            };
            super::super::metrics::call_finished(&with_keys, &end);
        });
        let recorded: Vec<(String, Vec<String>, DebugValue)> = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .map(|(key, _, _, value)| {
                let key = key.key();
                (key.name().to_owned(), labels(key), value)
            })
            .collect();
        let find = |name: &str, label: &str| {
            recorded
                .iter()
                .find(|(n, l, _)| n == name && l.iter().any(|x| x == label))
                .map(|(_, l, v)| (l.clone(), v))
        };
        let code = |c: &str| find(super::RESPONSES, &format!("code={c}"));
        assert_eq!(
            code("503"),
            Some((
                vec!["endpoint=pay".to_owned(), "code=503".to_owned()],
                &DebugValue::Counter(2)
            ))
        );
        assert_eq!(code("none").map(|(_, v)| v), Some(&DebugValue::Counter(1)));
        assert_eq!(
            find(super::REQUESTS, "outcome=attempts_exhausted").map(|(_, v)| v),
            Some(&DebugValue::Counter(1))
        );
        let durations = find(super::ATTEMPT_DURATION, "endpoint=pay").map(|(_, v)| v);
        assert!(
            matches!(&durations, Some(DebugValue::Histogram(v)) if v.len() == 3),
            "{durations:?}"
        );
    }
}
