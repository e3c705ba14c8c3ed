use super::*;
use proptest::prelude::*;

fn kind(r: Result<impl fmt::Debug, HeaderError>) -> HeaderErrorKind {
    r.expect_err("should be rejected").kind
}

#[test]
fn grpc_all_six_units() {
    let cases: [(&[u8], Duration); 6] = [
        (b"1H", Duration::from_secs(3600)),
        (b"2M", Duration::from_secs(120)),
        (b"3S", Duration::from_secs(3)),
        (b"100m", Duration::from_millis(100)),
        (b"5u", Duration::from_micros(5)),
        (b"99999999n", Duration::from_nanos(99_999_999)),
    ];
    for (value, want) in cases {
        assert_eq!(parse_grpc_timeout(value), Ok(want), "{value:?}");
    }
    assert_eq!(
        parse_grpc_timeout(b"99999999H"),
        Ok(Duration::from_secs(99_999_999 * 3600))
    );
    assert_eq!(parse_grpc_timeout(b"0n"), Ok(Duration::ZERO));
    assert_eq!(parse_grpc_timeout(b"00000001S"), Ok(Duration::from_secs(1)));
}

#[test]
fn grpc_error_kinds() {
    use HeaderErrorKind::*;
    assert_eq!(kind(parse_grpc_timeout(b"")), Empty);
    assert_eq!(kind(parse_grpc_timeout(b"m")), MissingDigits);
    assert_eq!(
        kind(parse_grpc_timeout(b"123456789m")),
        TooManyDigits { max: 8, found: 9 }
    );
    assert_eq!(kind(parse_grpc_timeout(b"100")), MissingUnit);
    assert_eq!(kind(parse_grpc_timeout(b"100x")), BadUnit { unit: b'x' });
    assert_eq!(kind(parse_grpc_timeout(b"100h")), BadUnit { unit: b'h' });
    assert_eq!(kind(parse_grpc_timeout(b"-5S")), Sign { sign: b'-' });
    assert_eq!(kind(parse_grpc_timeout(b"+5S")), Sign { sign: b'+' });
    assert_eq!(kind(parse_grpc_timeout(b"-")), Sign { sign: b'-' });
    assert_eq!(
        kind(parse_grpc_timeout(b"1-5S")),
        NotADigit {
            position: 1,
            byte: b'-'
        }
    );
    assert_eq!(
        kind(parse_grpc_timeout("1\u{e9}S".as_bytes())),
        NonAscii {
            position: 1,
            byte: 0xc3
        }
    );
    assert_eq!(
        kind(parse_grpc_timeout("5\u{b5}".as_bytes())),
        NonAscii {
            position: 1,
            byte: 0xc2
        }
    );
    assert_eq!(kind(parse_grpc_timeout(b"1 S")), Whitespace { position: 1 });
    assert_eq!(kind(parse_grpc_timeout(b" 1S")), Whitespace { position: 0 });
    assert_eq!(kind(parse_grpc_timeout(b"1S ")), Whitespace { position: 2 });
    assert_eq!(kind(parse_grpc_timeout(b"1\t")), Whitespace { position: 1 });
    assert_eq!(
        kind(parse_grpc_timeout(b"1\xff")),
        NonAscii {
            position: 1,
            byte: 0xff
        }
    );
    assert_eq!(
        kind(parse_grpc_timeout(b"1.5S")),
        NotADigit {
            position: 1,
            byte: b'.'
        }
    );
    // Overflow cannot happen within 8 digits; the largest value parses.
    assert!(parse_grpc_timeout(b"99999999H").is_ok());
}

#[test]
fn millis_headers_error_kinds() {
    use HeaderErrorKind::*;
    type Parser = fn(&[u8]) -> Result<Duration, HeaderError>;
    let parsers: [(Parser, &str); 2] = [
        (parse_connect_timeout_ms, CONNECT_TIMEOUT_MS),
        (
            parse_envoy_expected_timeout_ms,
            ENVOY_EXPECTED_RQ_TIMEOUT_MS,
        ),
    ];
    for (parse, header) in parsers {
        assert_eq!(parse(b"0"), Ok(Duration::ZERO));
        assert_eq!(
            parse(b"9999999999"),
            Ok(Duration::from_millis(9_999_999_999))
        );
        let err = parse(b"").expect_err("empty");
        assert_eq!(
            err,
            HeaderError {
                header,
                kind: Empty
            }
        );
        assert!(err.to_string().contains(header));
        assert_eq!(
            kind(parse(b"12345678901")),
            TooManyDigits { max: 10, found: 11 }
        );
        assert_eq!(kind(parse(b"-1")), Sign { sign: b'-' });
        assert_eq!(kind(parse(b"+1")), Sign { sign: b'+' });
        assert_eq!(
            kind(parse(b"10ms")),
            NotADigit {
                position: 2,
                byte: b'm'
            }
        );
        assert_eq!(
            kind(parse(b"1\x80")),
            NonAscii {
                position: 1,
                byte: 0x80
            }
        );
        assert_eq!(kind(parse(b"1 0")), Whitespace { position: 1 });
        assert_eq!(kind(parse(b"10\r\n")), Whitespace { position: 2 });
    }
    // Overflow: a custom header allowing more digits than u64 holds.
    assert_eq!(
        kind(parse_millis_header("x", b"99999999999999999999", 25)),
        Overflow
    );
}

#[test]
fn request_deadline_parsing() {
    use HeaderErrorKind::*;
    let epoch = SystemTime::UNIX_EPOCH;
    assert_eq!(
        parse_request_deadline(b"1700000000000"),
        Ok(epoch + Duration::from_secs(1_700_000_000))
    );
    // Long past: valid, just expired.
    assert_eq!(parse_request_deadline(b"0"), Ok(epoch));
    assert_eq!(kind(parse_request_deadline(b"")), Empty);
    assert_eq!(kind(parse_request_deadline(b"-1")), Sign { sign: b'-' });
    assert_eq!(
        kind(parse_request_deadline(b"123456789012345678901")),
        TooManyDigits { max: 20, found: 21 }
    );
    assert_eq!(
        kind(parse_request_deadline(b"99999999999999999999")),
        Overflow
    );
    assert_eq!(
        kind(parse_request_deadline(b"17e11")),
        NotADigit {
            position: 2,
            byte: b'e'
        }
    );
    assert_eq!(
        kind(parse_request_deadline(b"17\xff")),
        NonAscii {
            position: 2,
            byte: 0xff
        }
    );
    assert_eq!(
        kind(parse_request_deadline(b" 17")),
        Whitespace { position: 0 }
    );
    let err = parse_request_deadline(b"").expect_err("empty");
    assert_eq!(
        err.to_string(),
        "invalid x-request-deadline value: the value is empty"
    );
}

#[test]
fn request_deadline_encoding() {
    let epoch = SystemTime::UNIX_EPOCH;
    assert_eq!(encode_request_deadline(epoch), "0");
    assert_eq!(encode_request_deadline(epoch - Duration::from_secs(5)), "0");
    let at = epoch + Duration::from_millis(1_700_000_000_123);
    assert_eq!(encode_request_deadline(at), "1700000000123");
    assert_eq!(
        parse_request_deadline(encode_request_deadline(at).as_bytes()),
        Ok(at)
    );
}

#[test]
fn grpc_encoding_examples() {
    let enc = |d| encode_grpc_timeout(d).to_string();
    assert_eq!(enc(Duration::ZERO), "0n");
    assert_eq!(enc(Duration::from_nanos(99_999_999)), "99999999n");
    assert_eq!(enc(Duration::from_nanos(100_000_000)), "100000u");
    assert_eq!(enc(Duration::from_nanos(100_000_001)), "100001u");
    assert_eq!(enc(Duration::from_secs(3600)), "3600000m");
    assert_eq!(enc(Duration::from_secs(100_000)), "100000S");
    assert_eq!(enc(Duration::from_secs(99_999_999 * 3600)), "99999999H");
    assert_eq!(enc(Duration::MAX), "99999999H");
    assert_eq!(
        format!("{:?}", encode_grpc_timeout(Duration::from_millis(1))),
        "GrpcTimeout(\"1000000n\")"
    );
}

/// Nanoseconds per unit, by unit letter.
fn unit_nanos(unit: char) -> u128 {
    match unit {
        'H' => 3_600_000_000_000,
        'M' => 60_000_000_000,
        'S' => 1_000_000_000,
        'm' => 1_000_000,
        'u' => 1_000,
        _ => 1,
    }
}

/// Durations up to 99999999 hours, biased towards each unit's exact multiples.
fn grpc_duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        (0u64..=u64::MAX).prop_map(Duration::from_nanos),
        (0u64..=99_999_999, 0u32..6).prop_map(|(n, u)| {
            let per = [
                1u64,
                1_000,
                1_000_000,
                1_000_000_000,
                60_000_000_000,
                3_600_000_000_000,
            ];
            let nanos = u128::from(n) * u128::from(per[u as usize]);
            Duration::new(
                u64::try_from(nanos / 1_000_000_000).unwrap_or(0),
                u32::try_from(nanos % 1_000_000_000).unwrap_or(0),
            )
        }),
    ]
}

proptest! {
    // Parsers are cheap: many more cases than the default 256.
    #![proptest_config(ProptestConfig::with_cases(4096))]

    #[test]
    fn grpc_round_trip(d in grpc_duration()) {
        let encoded = encode_grpc_timeout(d);
        let s = encoded.as_str();
        let unit = s.chars().last().unwrap_or('?');
        let digits = &s[..s.len() - 1];
        prop_assert!((1..=8).contains(&digits.len()), "{s}");
        prop_assert!(digits.bytes().all(|b| b.is_ascii_digit()), "{s}");
        prop_assert!("HMSmun".contains(unit), "{s}");
        let back = parse_grpc_timeout(s.as_bytes());
        prop_assert!(back.is_ok(), "{s}");
        let back = back.unwrap_or_default();
        let per = unit_nanos(unit);
        if d.as_nanos() % per == 0 {
            prop_assert_eq!(back, d);
        } else {
            prop_assert!(back >= d);
            prop_assert!(back.as_nanos() < d.as_nanos() + per);
        }
    }

    #[test]
    fn grpc_encoding_is_always_valid(nanos in any::<u128>()) {
        let d = Duration::new(
            u64::try_from(nanos >> 64).unwrap_or(u64::MAX),
            u32::try_from(nanos % 1_000_000_000).unwrap_or(0),
        );
        let s = encode_grpc_timeout(d).to_string();
        prop_assert!((2..=9).contains(&s.len()));
        prop_assert!(parse_grpc_timeout(s.as_bytes()).is_ok(), "{s}");
    }

    /// Each parser accepts exactly its grammar (1 to N ASCII digits, plus a unit for
    /// `grpc-timeout`) with the value the digits state; anything else is an error.
    #[test]
    fn parsers_match_their_grammar(
        bytes in prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..32),
            "[-+ 0-9HMSmunx\u{b5}]{0,12}".prop_map(String::into_bytes),
            "[0-9]{1,22}[HMSmun]?".prop_map(String::into_bytes),
        ],
    ) {
        let digits = |d: &[u8], max: usize| -> Option<u64> {
            if d.is_empty() || d.len() > max || !d.iter().all(u8::is_ascii_digit) {
                return None;
            }
            std::str::from_utf8(d).ok()?.parse().ok()
        };
        let grpc = bytes.split_last().and_then(|(&unit, d)| {
            let per = "HMSmun".contains(char::from(unit)).then(|| unit_nanos(char::from(unit)))?;
            let nanos = u128::from(digits(d, 8)?) * per;
            Some(Duration::new(
                u64::try_from(nanos / 1_000_000_000).ok()?,
                u32::try_from(nanos % 1_000_000_000).ok()?,
            ))
        });
        prop_assert_eq!(parse_grpc_timeout(&bytes).ok(), grpc);
        let millis = digits(&bytes, 10).map(Duration::from_millis);
        prop_assert_eq!(parse_connect_timeout_ms(&bytes).ok(), millis);
        prop_assert_eq!(parse_envoy_expected_timeout_ms(&bytes).ok(), millis);
        let epoch = digits(&bytes, 20).map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms));
        prop_assert_eq!(parse_request_deadline(&bytes).ok(), epoch);
        let any_len = digits(&bytes, usize::MAX).map(Duration::from_millis);
        prop_assert_eq!(parse_millis_header("x", &bytes, usize::MAX).ok(), any_len);
    }

    #[test]
    fn millis_round_trip(ms in 0u64..=9_999_999_999) {
        prop_assert_eq!(
            parse_connect_timeout_ms(ms.to_string().as_bytes()),
            Ok(Duration::from_millis(ms))
        );
    }
}
