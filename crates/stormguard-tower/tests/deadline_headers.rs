//! Property tests of the deadline header selection over an `http::HeaderMap`
//! ([`stormguard_tower::wire::read_deadline`]): which header wins under each precedence rule,
//! which errors are reported, and that no bytes make the reader or the server layer panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use proptest::prelude::*;
use stormguard::deadline::{DeadlineHeader, DeadlineHeaders, Selection, WallClock};
use stormguard_tower::deadline::{DeadlineLayer, MalformedPolicy};
use stormguard_tower::wire::read_deadline;
use tower::{Layer, ServiceExt, service_fn};

const ALL: [DeadlineHeader; 4] = [
    DeadlineHeader::GrpcTimeout,
    DeadlineHeader::ConnectTimeoutMs,
    DeadlineHeader::EnvoyExpectedRqTimeoutMs,
    DeadlineHeader::RequestDeadline,
];

fn wall() -> WallClock {
    WallClock::fixed(SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000))
}

/// Header values: arbitrary bytes, near-valid text, and valid values of every format.
fn value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..24),
        "[-+ 0-9HMSmun.x]{0,12}".prop_map(String::into_bytes),
        (0u64..100_000_000, "[HMSmun]").prop_map(|(n, u)| format!("{n}{u}").into_bytes()),
        (0u64..10_000_000_000).prop_map(|n| n.to_string().into_bytes()),
        (1_699_999_000_000u64..1_700_001_000_000).prop_map(|n| n.to_string().into_bytes()),
    ]
}

/// Up to two values for each of the four headers (zero: absent).
fn header_map() -> impl Strategy<Value = HeaderMap> {
    proptest::collection::vec(proptest::collection::vec(value(), 0..3), 4).prop_map(|per_header| {
        let mut map = HeaderMap::new();
        for (header, values) in ALL.iter().zip(per_header) {
            for value in values {
                // Bytes that cannot be a header value never reach a service.
                if let Ok(value) = HeaderValue::from_bytes(&value) {
                    map.append(header.name(), value);
                }
            }
        }
        map
    })
}

/// A non-empty ordered subset of the four headers.
fn header_list() -> impl Strategy<Value = Vec<DeadlineHeader>> {
    Just(ALL.to_vec())
        .prop_shuffle()
        .prop_flat_map(|all| (1usize..=4).prop_map(move |n| all[..n].to_vec()))
}

/// What one header on its own says: `None` when absent, else whether it is reported as an
/// error (malformed, or repeated) and the time left it still counts for (a repeated header
/// counts as its earliest valid value).
fn alone(map: &HeaderMap, header: DeadlineHeader) -> Option<(bool, Option<Duration>)> {
    let values: Vec<_> = map.get_all(header.name()).iter().collect();
    if values.is_empty() {
        return None;
    }
    let parsed: Vec<_> = values
        .iter()
        .map(|v| header.parse(v.as_bytes(), &wall()))
        .collect();
    let error = values.len() > 1 || parsed.iter().any(Result::is_err);
    let earliest = parsed.into_iter().filter_map(Result::ok).min();
    Some((error, earliest))
}

proptest! {
    #[test]
    fn selection_matches_a_reference_model(map in header_map(), list in header_list()) {
        let headers = DeadlineHeaders::new(&list).unwrap();

        // First present: the first listed header with a valid value; errors up to it.
        let reading = read_deadline(&map, headers, Selection::FirstPresent, &wall());
        let mut expected_errors = Vec::new();
        let mut expected = None;
        for &header in &list {
            let Some((error, left)) = alone(&map, header) else {
                continue;
            };
            if error {
                expected_errors.push(header);
            }
            if let Some(left) = left {
                expected = Some((header, left));
                break;
            }
        }
        prop_assert_eq!(reading.found.map(|f| (f.header, f.remaining)), expected);
        let errors: Vec<_> = reading.errors().map(|e| e.header()).collect();
        prop_assert_eq!(errors, expected_errors);

        // Earliest: the smallest time left among all valid listed headers, ties to the
        // earlier in the list; every invalid one reported.
        let reading = read_deadline(&map, headers, Selection::Earliest, &wall());
        let mut expected_errors = Vec::new();
        let mut expected: Option<(DeadlineHeader, Duration)> = None;
        for &header in &list {
            let Some((error, left)) = alone(&map, header) else {
                continue;
            };
            if error {
                expected_errors.push(header);
            }
            if let Some(left) = left.filter(|&l| expected.is_none_or(|(_, best)| l < best)) {
                expected = Some((header, left));
            }
        }
        prop_assert_eq!(reading.found.map(|f| (f.header, f.remaining)), expected);
        let errors: Vec<_> = reading.errors().map(|e| e.header()).collect();
        prop_assert_eq!(errors, expected_errors);
        // Display never panics either.
        for error in reading.errors() {
            prop_assert!(error.to_string().contains(error.header().name()));
        }
    }

    #[test]
    fn server_layer_answers_any_headers_without_panicking(
        map in header_map(),
        grpc in any::<bool>(),
        reject in any::<bool>(),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let policy = if reject { MalformedPolicy::Reject } else { MalformedPolicy::Ignore };
        let layer = DeadlineLayer::new().with_malformed(policy).with_wall_clock(wall());
        let service = layer.layer(service_fn(|_req: Request<()>| async {
            Ok::<_, Infallible>(Response::new(String::new()))
        }));
        let mut request = Request::new(());
        *request.headers_mut() = map.clone();
        if grpc {
            request.headers_mut().insert("content-type", HeaderValue::from_static("application/grpc"));
        }
        let response = runtime.block_on(service.oneshot(request)).unwrap();
        let reading = read_deadline(&map, DeadlineHeaders::ALL, Selection::Earliest, &wall());
        let status = response.status();
        let grpc_status = response.headers().get("grpc-status").cloned();
        if reject && reading.first_error().is_some() {
            if grpc {
                prop_assert_eq!(grpc_status, Some(HeaderValue::from_static("3")));
            } else {
                prop_assert_eq!(status, StatusCode::BAD_REQUEST);
            }
        } else if reading.found.is_some_and(|f| f.remaining < Duration::from_millis(1)) {
            // Expired, or below the default minimum of 1 ms left.
            if grpc {
                prop_assert_eq!(grpc_status, Some(HeaderValue::from_static("4")));
            } else {
                prop_assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
            }
        } else {
            prop_assert_eq!(status, StatusCode::OK);
            prop_assert_eq!(grpc_status, None);
        }
        prop_assert_eq!(layer.stats().malformed_headers, reading.errors().count() as u64);
    }
}
