//! Counters and histograms through the `metrics` facade (feature `metrics`).

use std::time::Duration;

use metrics::{Counter, Unit, counter, describe_counter, describe_histogram, histogram};
use stormguard::retry::{RetryReason, StopReason};

use super::active::AttemptEnd;
use crate::metric_names::{
    ATTEMPT_DURATION, ATTEMPTS, BUDGET_REFUSALS, REQUESTS, RETRIES, RETRY_DELAY,
};

/// Registers units and help texts for the retry layer's metrics with the installed
/// recorder. Call it once after installing the recorder (an exporter then prints `# HELP`
/// lines); the metrics are recorded whether or not it is called.
pub fn describe_metrics() {
    describe_counter!(
        REQUESTS,
        Unit::Count,
        "Logical requests through the retry layer, by how they ended (outcome)."
    );
    describe_counter!(ATTEMPTS, Unit::Count, "Attempts sent, the first included.");
    describe_counter!(RETRIES, Unit::Count, "Retries sent, by reason.");
    describe_counter!(
        BUDGET_REFUSALS,
        Unit::Count,
        "Retries the retry budget refused."
    );
    describe_histogram!(ATTEMPT_DURATION, Unit::Seconds, "Duration of each attempt.");
    describe_histogram!(RETRY_DELAY, Unit::Seconds, "Wait before each retry.");
}

pub(super) fn attempt_started(retry: Option<(RetryReason, Duration)>) {
    counter!(ATTEMPTS).increment(1);
    if let Some((reason, delay)) = retry {
        retries(reason).increment(1);
        histogram!(RETRY_DELAY).record(delay.as_secs_f64());
    }
}

// The label values are literals so that the keys are statics: recording allocates
// nothing. They equal the core's `label()`s (checked by the tests below).

fn retries(reason: RetryReason) -> Counter {
    match reason {
        RetryReason::Failed => counter!(RETRIES, "reason" => "failed"),
        RetryReason::Overloaded => counter!(RETRIES, "reason" => "overloaded"),
        RetryReason::InDoubt => counter!(RETRIES, "reason" => "in_doubt"),
        RetryReason::TimedOut => counter!(RETRIES, "reason" => "timed_out"),
    }
}

fn requests(stop: StopReason) -> Counter {
    match stop {
        StopReason::Succeeded => counter!(REQUESTS, "outcome" => "succeeded"),
        StopReason::NeverRetry => counter!(REQUESTS, "outcome" => "never_retry"),
        StopReason::NotIdempotent => counter!(REQUESTS, "outcome" => "not_idempotent"),
        StopReason::AttemptsExhausted => counter!(REQUESTS, "outcome" => "attempts_exhausted"),
        StopReason::BudgetExhausted => counter!(REQUESTS, "outcome" => "budget_exhausted"),
        StopReason::DeadlineTooClose => counter!(REQUESTS, "outcome" => "deadline_too_close"),
        StopReason::Cancelled => counter!(REQUESTS, "outcome" => "cancelled"),
        StopReason::BreakerOpen => counter!(REQUESTS, "outcome" => "breaker_open"),
        StopReason::Throttled => counter!(REQUESTS, "outcome" => "throttled"),
    }
}

pub(super) fn attempt_ended(end: &AttemptEnd<'_>) {
    histogram!(ATTEMPT_DURATION).record(end.elapsed.as_secs_f64());
}

pub(super) fn request_finished(stop: StopReason) {
    requests(stop).increment(1);
    if stop == StopReason::BudgetExhausted {
        counter!(BUDGET_REFUSALS).increment(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use metrics_util::debugging::DebuggingRecorder;

    fn labels_of(record: impl FnOnce()) -> Vec<String> {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::with_local_recorder(&recorder, record);
        snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .flat_map(|(key, ..)| {
                key.key()
                    .labels()
                    .map(|l| l.value().to_owned())
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    #[test]
    fn static_labels_are_the_cores_labels() {
        use StopReason as S;
        for stop in [
            S::Succeeded,
            S::NeverRetry,
            S::NotIdempotent,
            S::AttemptsExhausted,
            S::BudgetExhausted,
            S::DeadlineTooClose,
            S::Cancelled,
        ] {
            assert_eq!(labels_of(|| requests(stop).increment(1)), [stop.label()]);
        }
        use RetryReason as R;
        for reason in [R::Failed, R::Overloaded, R::InDoubt, R::TimedOut] {
            assert_eq!(labels_of(|| retries(reason).increment(1)), [reason.label()]);
        }
    }
}
