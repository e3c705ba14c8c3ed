use std::io::{self, ErrorKind};
use std::time::{Duration, SystemTime};

use proptest::prelude::*;

use super::*;

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

// ---------------------------------------------------------------- Outcome

#[test]
fn outcome_labels_and_predicates() {
    let all = [
        (Outcome::Success, "success"),
        (Outcome::Retryable, "retryable"),
        (Outcome::NeverRetry, "never_retry"),
        (Outcome::Overloaded { retry_after: None }, "overloaded"),
        (
            Outcome::Overloaded {
                retry_after: Some(secs(1)),
            },
            "overloaded",
        ),
        (Outcome::InDoubt, "in_doubt"),
    ];
    for (outcome, label) in all {
        assert_eq!(outcome.label(), label);
        assert_eq!(outcome.is_success(), label == "success", "{outcome:?}");
        assert_eq!(outcome.is_failure(), label != "success", "{outcome:?}");
    }
}

// ---------------------------------------------------------------- HTTP

/// The expected class of every status, written as explicit lists from the rules.
fn expected_http(status: u16) -> Outcome {
    const RETRYABLE: [u16; 5] = [408, 425, 502, 503, 504];
    if (100..=399).contains(&status) {
        Outcome::Success
    } else if RETRYABLE.contains(&status) {
        Outcome::Retryable
    } else if status == 429 {
        Outcome::Overloaded { retry_after: None }
    } else {
        Outcome::NeverRetry
    }
}

#[test]
fn http_every_status_100_to_599() {
    for status in 100..=599 {
        assert_eq!(
            classify_http_status(status, None),
            expected_http(status),
            "status {status}"
        );
    }
}

#[test]
fn http_named_statuses() {
    for s in [100, 101, 200, 201, 204, 301, 302, 304, 307, 308] {
        assert_eq!(classify_http_status(s, None), Outcome::Success, "{s}");
    }
    for s in [408, 425, 502, 503, 504] {
        assert_eq!(classify_http_status(s, None), Outcome::Retryable, "{s}");
    }
    for s in [
        400, 401, 403, 404, 409, 422, 500, 501, 505, 511, 418, 499, 599,
    ] {
        assert_eq!(classify_http_status(s, None), Outcome::NeverRetry, "{s}");
    }
    assert_eq!(
        classify_http_status(429, None),
        Outcome::Overloaded { retry_after: None }
    );
}

#[test]
fn http_retry_after_only_matters_for_409_429_and_503() {
    let wait = Some(secs(7));
    for status in 100..=599 {
        let expected = match status {
            409 | 429 | 503 => Outcome::Overloaded { retry_after: wait },
            _ => expected_http(status),
        };
        assert_eq!(
            classify_http_status(status, wait),
            expected,
            "status {status}"
        );
    }
}

#[test]
fn http_out_of_range_never_retry() {
    for s in [0, 1, 42, 99, 600, 999, 1000, u16::MAX] {
        assert_eq!(classify_http_status(s, None), Outcome::NeverRetry, "{s}");
        assert_eq!(
            classify_http_status(s, Some(secs(1))),
            Outcome::NeverRetry,
            "{s}"
        );
    }
}

// ---------------------------------------------------------------- Retry-After

/// 30 seconds before Wed, 21 Oct 2015 07:28:00 GMT.
fn fixed_now() -> SystemTime {
    SystemTime::UNIX_EPOCH + secs(1_445_412_450)
}

#[test]
fn retry_after_delay_seconds() {
    let now = fixed_now();
    assert_eq!(parse_retry_after(b"120", now), Ok(secs(120)));
    assert_eq!(parse_retry_after(b"0", now), Ok(Duration::ZERO));
    assert_eq!(parse_retry_after(b"007", now), Ok(secs(7)));
    assert_eq!(
        parse_retry_after(b"18446744073709551615", now),
        Ok(secs(u64::MAX))
    );
}

#[test]
fn retry_after_http_dates() {
    let now = fixed_now();
    assert_eq!(
        parse_retry_after(b"Wed, 21 Oct 2015 07:28:00 GMT", now),
        Ok(secs(30))
    );
    // The two obsolete formats RFC 9110 still asks recipients to accept.
    assert_eq!(
        parse_retry_after(b"Wednesday, 21-Oct-15 07:28:00 GMT", now),
        Ok(secs(30))
    );
    assert_eq!(
        parse_retry_after(b"Wed Oct 21 07:28:00 2015", now),
        Ok(secs(30))
    );
    // Exactly now, and in the past.
    let at = SystemTime::UNIX_EPOCH + secs(1_445_412_480);
    assert_eq!(
        parse_retry_after(b"Wed, 21 Oct 2015 07:28:00 GMT", at),
        Ok(Duration::ZERO)
    );
    assert_eq!(
        parse_retry_after(b"Wed, 21 Oct 2015 07:28:00 GMT", at + secs(3600)),
        Ok(Duration::ZERO)
    );
    assert_eq!(
        parse_retry_after(b"Thu, 01 Jan 1970 00:00:00 GMT", now),
        Ok(Duration::ZERO)
    );
}

#[test]
fn retry_after_rejections_name_the_problem() {
    use RetryAfterError as E;
    let now = fixed_now();
    let cases: &[(&[u8], E)] = &[
        (b"", E::Empty),
        (b"-1", E::Negative),
        (b"-0", E::Negative),
        (b"-1.5", E::Negative),
        (b"1.5", E::Fractional),
        (b".5", E::Fractional),
        (b"1.", E::Fractional),
        (b"1.2.3", E::NotAnInteger),
        (b" 12", E::Whitespace),
        (b"12 ", E::Whitespace),
        (b"\t12", E::Whitespace),
        (b"12abc", E::NotAnInteger),
        (b".5", E::Fractional),
        (b"-", E::NotAnInteger),
        (b"1e3", E::NotAnInteger),
        (b"123456789012345678901234567890", E::Overflow),
        (b"18446744073709551616", E::Overflow),
        ("١٢".as_bytes(), E::NonAscii),
        (b"12\xff", E::NonAscii),
        (b"soon", E::BadDate),
        (b"Wed, 21 Oct 2015 07:28:00 PST", E::BadDate),
        (b"Wed, 32 Oct 2015 07:28:00 GMT", E::BadDate),
    ];
    for (value, expected) in cases {
        assert_eq!(
            parse_retry_after(value, now),
            Err(*expected),
            "{:?}",
            String::from_utf8_lossy(value)
        );
    }
}

#[test]
fn retry_after_errors_display() {
    assert_eq!(RetryAfterError::Empty.to_string(), "Retry-After is empty");
    assert!(RetryAfterError::Overflow.to_string().contains("too large"));
}

// ---------------------------------------------------------------- io

const UNREACHABLE_KINDS: [ErrorKind; 5] = [
    ErrorKind::ConnectionRefused,
    ErrorKind::AddrNotAvailable,
    ErrorKind::HostUnreachable,
    ErrorKind::NetworkUnreachable,
    ErrorKind::NetworkDown,
];

const CONNECTION_KINDS: [ErrorKind; 8] = [
    ErrorKind::ConnectionReset,
    ErrorKind::ConnectionAborted,
    ErrorKind::NotConnected,
    ErrorKind::BrokenPipe,
    ErrorKind::TimedOut,
    ErrorKind::Interrupted,
    ErrorKind::WouldBlock,
    ErrorKind::UnexpectedEof,
];

#[test]
fn io_unreachable_server_is_always_retryable() {
    for kind in UNREACHABLE_KINDS {
        assert_eq!(
            classify_io_error(kind, false),
            Outcome::Retryable,
            "{kind:?}"
        );
        assert_eq!(
            classify_io_error(kind, true),
            Outcome::Retryable,
            "{kind:?}"
        );
    }
}

const DETERMINISTIC_KINDS: [ErrorKind; 10] = [
    ErrorKind::NotFound,
    ErrorKind::PermissionDenied,
    ErrorKind::InvalidInput,
    ErrorKind::InvalidData,
    ErrorKind::Unsupported,
    ErrorKind::AlreadyExists,
    ErrorKind::AddrInUse,
    ErrorKind::WriteZero,
    ErrorKind::OutOfMemory,
    ErrorKind::Other,
];

#[test]
fn io_connection_loss_before_and_after_sending() {
    for kind in CONNECTION_KINDS {
        assert_eq!(
            classify_io_error(kind, false),
            Outcome::Retryable,
            "{kind:?}"
        );
        assert_eq!(classify_io_error(kind, true), Outcome::InDoubt, "{kind:?}");
    }
}

#[test]
fn io_deterministic_kinds_never_retry() {
    for kind in DETERMINISTIC_KINDS {
        assert_eq!(
            classify_io_error(kind, false),
            Outcome::NeverRetry,
            "{kind:?}"
        );
        assert_eq!(
            classify_io_error(kind, true),
            Outcome::NeverRetry,
            "{kind:?}"
        );
    }
}

#[test]
fn io_error_assumes_request_was_sent() {
    let reset = io::Error::from(ErrorKind::ConnectionReset);
    assert_eq!(Classify::classify(&reset), Outcome::InDoubt);
    let refused = io::Error::new(ErrorKind::ConnectionRefused, "refused");
    assert_eq!(Classify::classify(&refused), Outcome::Retryable);
    let denied = io::Error::from(ErrorKind::PermissionDenied);
    assert_eq!(Classify::classify(&denied), Outcome::NeverRetry);
}

// ---------------------------------------------------------------- classifiers

#[test]
fn by_error_class_and_closures() {
    let ok: Result<u8, io::Error> = Ok(1);
    let timed_out: Result<u8, io::Error> = Err(ErrorKind::TimedOut.into());
    assert_eq!(ByErrorClass.classify(&ok), Outcome::Success);
    assert_eq!(ByErrorClass.classify(&timed_out), Outcome::InDoubt);

    let closure = |r: &Result<u8, &str>| match r {
        Ok(_) => Outcome::Success,
        Err(_) => Outcome::NeverRetry,
    };
    assert_eq!(closure.classify(&Ok(1)), Outcome::Success);
    assert_eq!(closure.classify(&Err("no")), Outcome::NeverRetry);

    fn takes<C: Classifier<u8, io::Error>>(c: &C, r: &Result<u8, io::Error>) -> Outcome {
        c.classify(r)
    }
    assert_eq!(takes(&ByErrorClass, &timed_out), Outcome::InDoubt);
}

// ---------------------------------------------------------------- gRPC codes

#[test]
fn grpc_code_numbers_names_and_headers() {
    let names = [
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    ];
    for (n, (code, name)) in GrpcCode::ALL.into_iter().zip(names).enumerate() {
        let n32 = i32::try_from(n).unwrap_or(i32::MAX);
        assert_eq!(code as usize, n);
        assert_eq!(GrpcCode::from_i32(n32), Some(code));
        assert_eq!(GrpcCode::parse_header(n.to_string().as_bytes()), Ok(code));
        assert_eq!(code.name(), name);
        assert_eq!(code.to_string(), name);
        assert_eq!(GrpcCode::from_name(name), Some(code));
        assert_eq!(GrpcCode::from_name(&name.to_lowercase()), Some(code));
        assert_eq!(GrpcCode::from_name(&n.to_string()), Some(code));
    }
    for bad in [-1, 17, i32::MIN, i32::MAX] {
        assert_eq!(GrpcCode::from_i32(bad), None);
    }
    assert_eq!(GrpcCode::from_name(""), None);
    assert_eq!(GrpcCode::from_name("UNAVAILABLE "), None);
    assert_eq!(GrpcCode::from_name("17"), None);
    assert_eq!(GrpcCode::from_name("-1"), None);
}

#[test]
fn grpc_status_header_rejections() {
    use GrpcStatusError as E;
    assert_eq!(GrpcCode::parse_header(b"014"), Ok(GrpcCode::Unavailable));
    let cases: &[(&[u8], E)] = &[
        (b"", E::Empty),
        (b"-1", E::NotAnInteger),
        (b"+1", E::NotAnInteger),
        (b" 1", E::NotAnInteger),
        (b"1 ", E::NotAnInteger),
        (b"UNAVAILABLE", E::NotAnInteger),
        (b"\xff", E::NotAnInteger),
        (b"17", E::OutOfRange),
        (b"99999999999999999999999999", E::OutOfRange),
    ];
    for (value, expected) in cases {
        assert_eq!(GrpcCode::parse_header(value), Err(*expected), "{value:?}");
    }
}

#[test]
fn grpc_code_set_const_construction() {
    const EMPTY: GrpcCodeSet = GrpcCodeSet::EMPTY;
    const PAIR: GrpcCodeSet = GrpcCodeSet::of(&[GrpcCode::Aborted, GrpcCode::Unavailable]);
    const GROWN: GrpcCodeSet = GrpcCodeSet::EMPTY
        .with(GrpcCode::Unavailable)
        .with(GrpcCode::Aborted);
    const ALL: GrpcCodeSet = GrpcCodeSet::of(&GrpcCode::ALL);
    const _: () = assert!(PAIR.contains(GrpcCode::Aborted));

    assert_eq!(PAIR, GROWN);
    assert_eq!(GrpcCodeSet::default(), EMPTY);
    assert_eq!(GrpcCodeSet::of(&[]), EMPTY);
    for code in GrpcCode::ALL {
        assert!(!EMPTY.contains(code), "{code}");
        assert!(ALL.contains(code), "{code}");
        let in_pair = matches!(code, GrpcCode::Aborted | GrpcCode::Unavailable);
        assert_eq!(PAIR.contains(code), in_pair, "{code}");
        assert_eq!(
            GrpcCodeSet::A6_DEFAULT.contains(code),
            code == GrpcCode::Unavailable,
            "{code}"
        );
        assert!(GrpcCodeSet::EMPTY.with(code).contains(code), "{code}");
        assert_eq!(
            GrpcCodeSet::of(&[code, code]),
            GrpcCodeSet::EMPTY.with(code)
        );
    }
    let collected: GrpcCodeSet = [GrpcCode::Unavailable, GrpcCode::Aborted]
        .into_iter()
        .collect();
    assert_eq!(collected, PAIR);
}

// ---------------------------------------------------------------- gRPC classification

#[test]
fn grpc_pushback_parsing() {
    assert_eq!(
        parse_grpc_pushback(b"0"),
        Pushback::RetryAfter(Duration::ZERO)
    );
    assert_eq!(parse_grpc_pushback(b"250"), Pushback::RetryAfter(ms(250)));
    assert_eq!(
        parse_grpc_pushback(b"18446744073709551615"),
        Pushback::RetryAfter(ms(u64::MAX))
    );
    for bad in [
        &b""[..],
        b"-1",
        b"-0",
        b"+1",
        b"1.5",
        b" 1",
        b"1 ",
        b"abc",
        b"18446744073709551616",
        b"\xff",
    ] {
        assert_eq!(parse_grpc_pushback(bad), Pushback::DoNotRetry, "{bad:?}");
    }
}

/// Every code, in and out of the retryable set, with every kind of pushback.
#[test]
fn grpc_every_code_set_and_pushback() {
    let pushbacks: [Option<&[u8]>; 4] = [None, Some(b"250"), Some(b"-250"), Some(b"2.5s")];
    for code in GrpcCode::ALL {
        // "Not in the set" uses every other code, so a wrong bit cannot pass unnoticed.
        let others: GrpcCodeSet = GrpcCode::ALL.into_iter().filter(|c| *c != code).collect();
        for (set, in_set) in [(GrpcCodeSet::EMPTY.with(code), true), (others, false)] {
            assert_eq!(set.contains(code), in_set);
            for pushback in pushbacks {
                let is_re = code == GrpcCode::ResourceExhausted;
                let expected = match (code, pushback) {
                    (GrpcCode::Ok, _) => Outcome::Success,
                    (_, None) if in_set && is_re => Outcome::Overloaded { retry_after: None },
                    (_, None) if in_set => Outcome::Retryable,
                    (_, None) => Outcome::NeverRetry,
                    (_, Some(b"250")) if in_set || is_re => Outcome::Overloaded {
                        retry_after: Some(ms(250)),
                    },
                    (_, Some(_)) => Outcome::NeverRetry,
                };
                assert_eq!(
                    classify_grpc(code, set, pushback),
                    expected,
                    "{code} in_set={in_set} pushback={pushback:?}"
                );
            }
        }
    }
}

#[test]
fn grpc_named_cases() {
    let a6 = GrpcCodeSet::A6_DEFAULT;
    assert_eq!(
        classify_grpc(GrpcCode::Ok, a6, Some(b"-1")),
        Outcome::Success
    );
    assert_eq!(
        classify_grpc(GrpcCode::Unavailable, a6, None),
        Outcome::Retryable
    );
    assert_eq!(
        classify_grpc(GrpcCode::DeadlineExceeded, a6, None),
        Outcome::NeverRetry
    );
    assert_eq!(
        classify_grpc(GrpcCode::Internal, a6, None),
        Outcome::NeverRetry
    );
    assert_eq!(
        classify_grpc(GrpcCode::ResourceExhausted, a6, None),
        Outcome::NeverRetry
    );
    assert_eq!(
        classify_grpc(GrpcCode::ResourceExhausted, a6, Some(b"0")),
        Outcome::Overloaded {
            retry_after: Some(Duration::ZERO)
        }
    );
    assert_eq!(
        classify_grpc(GrpcCode::Unavailable, a6, Some(b"")),
        Outcome::NeverRetry
    );
    assert_eq!(
        classify_grpc(GrpcCode::Internal, a6, Some(b"100")),
        Outcome::NeverRetry
    );
}

// ---------------------------------------------------------------- properties

fn headerish() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..64),
        "[0-9 .+\\-a-zA-Z,:]{0,40}".prop_map(String::into_bytes),
        "[0-9]{0,40}".prop_map(String::into_bytes),
    ]
}

/// Plain digits as a `u64`, the reading both delay headers give them.
fn digits_model(v: &[u8]) -> Option<u64> {
    if v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(v).ok()?.parse().ok()
}

/// Values near the HTTP-date forms, for the date branch of `parse_retry_after`.
fn dateish() -> impl Strategy<Value = Vec<u8>> {
    (
        "(Mon|Tue|Wed|Thu|Fri|Sat|Sun|Monday|Xyz)",
        0u32..40,
        "(Jan|Feb|Oct|Dec|Oct2)",
        1960u32..2300,
        0u32..30,
        "( GMT| UTC|)",
    )
        .prop_map(|(day, d, mon, y, h, zone)| {
            format!("{day}, {d:02} {mon} {y} {h:02}:28:00{zone}").into_bytes()
        })
}

proptest! {
    // Parsers are cheap: many more cases than the default 256.
    #![proptest_config(ProptestConfig::with_cases(4096))]

    /// Delay-seconds are exactly the all-digit values; a date is accepted exactly when
    /// httpdate (the date parser) reads it, and means its distance from now; every other
    /// value is refused.
    #[test]
    fn parse_retry_after_matches_its_grammar(
        v in prop_oneof![headerish(), dateish()],
        t in any::<u32>(),
    ) {
        let now = SystemTime::UNIX_EPOCH + secs(u64::from(t));
        let expected = match digits_model(&v) {
            Some(n) => Some(secs(n)),
            None if v.iter().all(u8::is_ascii_digit) => None,
            None => std::str::from_utf8(&v)
                .ok()
                .filter(|s| !s.starts_with(|c: char| c.is_ascii_digit() || "+-.".contains(c)))
                .and_then(|s| httpdate::parse_http_date(s).ok())
                .map(|at| at.duration_since(now).unwrap_or(Duration::ZERO)),
        };
        prop_assert_eq!(parse_retry_after(&v, now).ok(), expected, "{:?}", String::from_utf8_lossy(&v));
    }

    /// Every HTTP-date httpdate writes is read back as its distance from now.
    #[test]
    fn retry_after_dates_round_trip(at in any::<u32>(), t in any::<u32>()) {
        let at = SystemTime::UNIX_EPOCH + secs(u64::from(at));
        let now = SystemTime::UNIX_EPOCH + secs(u64::from(t));
        let value = httpdate::fmt_http_date(at);
        prop_assert_eq!(
            parse_retry_after(value.as_bytes(), now),
            Ok(at.duration_since(now).unwrap_or(Duration::ZERO))
        );
    }

    /// A pushback is a delay exactly for plain digits that fit a `u64`; anything else asks
    /// for no retry.
    #[test]
    fn parse_grpc_pushback_matches_its_grammar(v in headerish()) {
        let expected = digits_model(&v).map_or(Pushback::DoNotRetry, |n| Pushback::RetryAfter(ms(n)));
        prop_assert_eq!(parse_grpc_pushback(&v), expected);
    }

    /// `grpc-status` is the code at that index, for plain digits only.
    #[test]
    fn grpc_parse_header_matches_its_grammar(v in headerish()) {
        let expected = digits_model(&v)
            .and_then(|n| usize::try_from(n).ok())
            .and_then(|i| GrpcCode::ALL.get(i).copied());
        prop_assert_eq!(GrpcCode::parse_header(&v).ok(), expected);
    }

    /// A name is a code's spec name in any case, or its number.
    #[test]
    fn from_name_matches_names_and_numbers(
        s in prop_oneof![
            "\\PC{0,24}",
            "(unavailable|UNAVAILABLE|Data_Loss|ok|OK |0|16|17|014|-1)",
        ],
    ) {
        let expected = GrpcCode::ALL
            .into_iter()
            .find(|c| c.name().eq_ignore_ascii_case(&s))
            .or_else(|| {
                digits_model(s.as_bytes())
                    .and_then(|n| usize::try_from(n).ok())
                    .and_then(|i| GrpcCode::ALL.get(i).copied())
            });
        prop_assert_eq!(GrpcCode::from_name(&s), expected);
    }

    #[test]
    fn delay_seconds_round_trip(n in any::<u32>()) {
        let v = n.to_string();
        prop_assert_eq!(parse_retry_after(v.as_bytes(), fixed_now()), Ok(secs(u64::from(n))));
    }

    #[test]
    fn pushback_round_trip(n in any::<u32>()) {
        let v = n.to_string();
        prop_assert_eq!(parse_grpc_pushback(v.as_bytes()), Pushback::RetryAfter(ms(u64::from(n))));
    }

    #[test]
    fn http_classification_is_total(status in any::<u16>(), delay in proptest::option::of(any::<u32>())) {
        let retry_after = delay.map(|s| secs(u64::from(s)));
        let outcome = classify_http_status(status, retry_after);
        if !(100..=599).contains(&status) {
            prop_assert_eq!(outcome, Outcome::NeverRetry);
        }
    }
}
