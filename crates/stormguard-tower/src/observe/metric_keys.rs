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

use metrics::{Key, Label, SharedString};

use crate::metric_names::{ATTEMPT_DURATION, ATTEMPTS, RETRY_DELAY};

/// Label values kept per metric: the nine outcomes, four retry reasons, and the status codes
/// one endpoint sees in practice.
const SLOTS: usize = 16;

/// One endpoint's keys for the metrics recorded on every call.
#[derive(Clone, Debug)]
pub(crate) struct EndpointKeys {
    /// The endpoint the keys are labelled with.
    endpoint: Arc<str>,
    pub(super) attempts: Key,
    pub(super) attempt_duration: Key,
    pub(super) retry_delay: Key,
    /// `stormguard_requests_total` by `outcome`.
    pub(super) requests: LabelledKeys<&'static str>,
    /// `stormguard_responses_total` by `code` (0 for `none`).
    pub(super) responses: LabelledKeys<u16>,
    /// `stormguard_retries_total` by `reason`.
    pub(super) retries: LabelledKeys<&'static str>,
}

impl EndpointKeys {
    /// The keys of `endpoint`'s metrics.
    pub(crate) fn new(endpoint: &Arc<str>) -> Self {
        let label = SharedString::from(Arc::clone(endpoint));
        let plain =
            |name: &'static str| Key::from_parts(name, vec![Label::new("endpoint", label.clone())]);
        EndpointKeys {
            attempts: plain(ATTEMPTS),
            attempt_duration: plain(ATTEMPT_DURATION),
            retry_delay: plain(RETRY_DELAY),
            requests: LabelledKeys::new(),
            responses: LabelledKeys::new(),
            retries: LabelledKeys::new(),
            endpoint: Arc::clone(endpoint),
        }
    }

    /// Whether these are `endpoint`'s keys: an observer may hand on a copy of the call's
    /// context with another endpoint, and its metrics must carry that one.
    pub(super) fn serve(&self, endpoint: &str) -> bool {
        *self.endpoint == *endpoint
    }
}

/// One metric's keys by a label value, kept for the first [`SLOTS`] values seen.
#[derive(Clone, Debug)]
pub(crate) struct LabelledKeys<T> {
    slots: [OnceLock<(T, Key)>; SLOTS],
}

impl<T: Copy + PartialEq> LabelledKeys<T> {
    fn new() -> Self {
        LabelledKeys {
            slots: std::array::from_fn(|_| OnceLock::new()),
        }
    }

    /// The key for `id`: the kept one, or `build`'s kept now in the first free slot; built for
    /// this record alone when every slot holds another value. Slots fill in order, so a value
    /// is kept in one slot at most; two threads filling the same free slot with different
    /// values is harmless: only one fills it, and the other goes on to the next slot.
    pub(super) fn get(&self, id: T, build: impl Fn() -> Key) -> Cow<'_, Key> {
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
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use http::{Method, StatusCode};
    use metrics::{
        Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit,
    };
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    use stormguard::classify::Outcome;
    use stormguard::retry::StopReason;

    use super::{EndpointKeys, LabelledKeys, SLOTS};
    use crate::metric_names::{ATTEMPT_DURATION, REQUESTS, RESPONSES};
    use crate::observe::{AttemptEnd, CallEnd, CallInfo, metrics as record};
    use crate::wire::Protocol;

    fn labels(key: &Key) -> Vec<String> {
        key.labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect()
    }

    fn code_key(code: u16) -> Key {
        Key::from_parts(
            RESPONSES,
            vec![metrics::Label::new("code", code.to_string())],
        )
    }

    fn ended(status: Option<StatusCode>) -> AttemptEnd {
        AttemptEnd {
            number: 1,
            elapsed: Duration::from_millis(250),
            outcome: Outcome::Retryable,
            timed_out: status.is_none(),
            status,
            grpc_status: None,
            error_type: None,
        }
    }

    #[test]
    fn a_value_keeps_its_key_and_one_past_the_slots_is_built_per_record() {
        let keys = LabelledKeys::<u16>::new();
        let codes: Vec<u16> = (0..SLOTS as u16).map(|i| 200 + i).collect();
        let kept: Vec<*const Key> = codes
            .iter()
            .map(|&code| match keys.get(code, || code_key(code)) {
                Cow::Borrowed(key) => std::ptr::from_ref(key),
                Cow::Owned(key) => panic!("{code} not kept: {key:?}"),
            })
            .collect();
        for (&code, &first) in codes.iter().zip(&kept) {
            let again = keys.get(code, || panic!("{code} built twice"));
            assert!(matches!(again, Cow::Borrowed(key) if std::ptr::eq(key, first)));
            assert_eq!(labels(&again), [format!("code={code}")]);
        }
        let past = keys.get(599, || code_key(599));
        assert!(matches!(past, Cow::Owned(_)));
        assert_eq!(labels(&past), ["code=599"]);
    }

    #[test]
    fn threads_filling_the_slots_at_once_keep_each_value_once_under_its_own_key() {
        let keys = LabelledKeys::<u16>::new();
        std::thread::scope(|scope| {
            for thread in 0..8u16 {
                let keys = &keys;
                scope.spawn(move || {
                    for i in 0..12u16 {
                        let code = 200 + (i + thread) % 12;
                        let key = keys.get(code, || code_key(code));
                        assert_eq!(labels(&key), [format!("code={code}")]);
                    }
                });
            }
        });
        let mut kept: Vec<u16> = keys
            .slots
            .iter()
            .filter_map(|s| s.get().map(|(c, _)| *c))
            .collect();
        assert_eq!(kept.len(), 12, "{kept:?}");
        kept.sort_unstable();
        kept.dedup();
        assert_eq!(kept.len(), 12, "a value kept in two slots");
    }

    #[test]
    fn kept_keys_record_what_the_macros_record() {
        let keys = EndpointKeys::new(&Arc::from("pay"));
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::with_local_recorder(&recorder, || {
            let method = Method::POST;
            let with_keys =
                CallInfo::new("pay", &method, Protocol::Http, None).with_metric_keys(&keys);
            let without = CallInfo::new("pay", &method, Protocol::Http, None);
            let mut renamed = with_keys;
            renamed.endpoint = "refund";
            let unavailable = Some(StatusCode::SERVICE_UNAVAILABLE);
            for (call, status) in [
                (with_keys, unavailable),
                (without, unavailable),
                (renamed, unavailable),
                (with_keys, None),
            ] {
                record::attempt_ended(&call, &ended(status));
            }
            metrics::counter!(RESPONSES, "endpoint" => "pay".to_owned(), "code" => "503")
                .increment(1);
            let end = CallEnd {
                attempts: 3,
                stop: StopReason::AttemptsExhausted,
                elapsed: Duration::from_secs(1),
                marked_exhausted: true,
            };
            record::call_finished(&with_keys, &end);
        });
        let recorded: Vec<(String, Vec<String>, DebugValue)> = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .map(|(key, _, _, value)| (key.key().name().to_owned(), labels(key.key()), value))
            .collect();
        let value = |name: &str, wanted: &[&str]| {
            recorded
                .iter()
                .find(|(n, l, _)| n == name && l == wanted)
                .map(|(_, _, v)| v)
        };
        // Kept keys, keys built per record and the macro's meet in one series.
        assert_eq!(
            value(RESPONSES, &["endpoint=pay", "code=503"]),
            Some(&DebugValue::Counter(3))
        );
        // A context handed on with another endpoint is labelled with that endpoint.
        assert_eq!(
            value(RESPONSES, &["endpoint=refund", "code=503"]),
            Some(&DebugValue::Counter(1))
        );
        assert_eq!(
            value(RESPONSES, &["endpoint=pay", "code=none"]),
            Some(&DebugValue::Counter(1))
        );
        assert_eq!(
            value(REQUESTS, &["endpoint=pay", "outcome=attempts_exhausted"]),
            Some(&DebugValue::Counter(1))
        );
        let durations = value(ATTEMPT_DURATION, &["endpoint=pay"]);
        assert!(
            matches!(durations, Some(DebugValue::Histogram(v)) if v.len() == 3),
            "{durations:?}"
        );
    }

    /// Keeps the target of every counter registered.
    #[derive(Default)]
    struct Targets(Mutex<Vec<String>>);

    impl Recorder for Targets {
        fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn register_counter(&self, _: &Key, metadata: &Metadata<'_>) -> Counter {
            let mut targets = self
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            targets.push(format!("{} {:?}", metadata.target(), metadata.level()));
            Counter::noop()
        }
        fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
            Gauge::noop()
        }
        fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
            Histogram::noop()
        }
    }

    #[test]
    fn kept_keys_record_with_the_macros_target_and_level() {
        let keys = EndpointKeys::new(&Arc::from("pay"));
        let targets = Targets::default();
        metrics::with_local_recorder(&targets, || {
            let method = Method::GET;
            let call = CallInfo::new("pay", &method, Protocol::Http, None).with_metric_keys(&keys);
            record::attempt_ended(&call, &ended(Some(StatusCode::OK)));
            record::refused(&call, "budget");
        });
        let targets = targets
            .0
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        assert_eq!(targets.len(), 3, "{targets:?}");
        assert!(targets.iter().all(|t| t == &targets[0]), "{targets:?}");
        assert_eq!(targets[0], "stormguard_tower::observe::metrics Level(Info)");
    }
}
