//! Byte encodings shared by the stores: header lists, and the whole Redis record.
//!
//! Public but hidden: the functions that read stored bytes are entry points for fuzzing
//! (every decoder returns [`StoreError::Corrupt`] for bytes it cannot read, never panics).

use bytes::Bytes;
use http::{HeaderName, HeaderValue, StatusCode};

use super::{Completion, StoreError, StoredResponse};

/// Record state: in flight (as stored in the `state` column (SQL) and the first byte (Redis)).
pub const IN_FLIGHT: i64 = 0;
/// Record state: completed with a stored response.
pub const COMPLETED: i64 = 1;
/// Record state: completed, the response too large to keep.
pub const TOO_LARGE: i64 = 2;
/// Record state: completed, the response body failed.
pub const BODY_FAILED: i64 = 3;

/// `[u16 name len][name][u32 value len][value]` for each header, big-endian.
pub fn encode_headers(headers: &[(HeaderName, HeaderValue)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in headers {
        let name = name.as_str().as_bytes();
        // Header names are far below 64 KiB and values below 4 GiB; http rejects larger.
        out.extend_from_slice(&u16::try_from(name.len()).unwrap_or(u16::MAX).to_be_bytes());
        out.extend_from_slice(name);
        let value = value.as_bytes();
        out.extend_from_slice(&u32::try_from(value.len()).unwrap_or(u32::MAX).to_be_bytes());
        out.extend_from_slice(value);
    }
    out
}

/// Reads a header list written by [`encode_headers`].
pub fn decode_headers(mut bytes: &[u8]) -> Result<Vec<(HeaderName, HeaderValue)>, StoreError> {
    let corrupt = |what: &str| StoreError::Corrupt(format!("stored headers: {what}"));
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let (len, rest) = split_u16(bytes).ok_or_else(|| corrupt("truncated name length"))?;
        let (name, rest) =
            split(rest, usize::from(len)).ok_or_else(|| corrupt("truncated name"))?;
        let (len, rest) = split_u32(rest).ok_or_else(|| corrupt("truncated value length"))?;
        let len = usize::try_from(len).map_err(|_| corrupt("value length"))?;
        let (value, rest) = split(rest, len).ok_or_else(|| corrupt("truncated value"))?;
        let name = HeaderName::from_bytes(name).map_err(|_| corrupt("invalid name"))?;
        let value = HeaderValue::from_bytes(value).map_err(|_| corrupt("invalid value"))?;
        out.push((name, value));
        bytes = rest;
    }
    Ok(out)
}

fn split(bytes: &[u8], n: usize) -> Option<(&[u8], &[u8])> {
    (bytes.len() >= n).then(|| bytes.split_at(n))
}

fn split_u16(bytes: &[u8]) -> Option<(u16, &[u8])> {
    let (head, rest) = split(bytes, 2)?;
    Some((u16::from_be_bytes(head.try_into().ok()?), rest))
}

fn split_u32(bytes: &[u8]) -> Option<(u32, &[u8])> {
    let (head, rest) = split(bytes, 4)?;
    Some((u32::from_be_bytes(head.try_into().ok()?), rest))
}

/// The state, status, headers and body columns of a completion.
pub fn completion_columns(c: &Completion) -> (i64, i64, Vec<u8>, Vec<u8>) {
    match c {
        Completion::Response(r) => (
            COMPLETED,
            i64::from(r.status.as_u16()),
            encode_headers(&r.headers),
            r.body.to_vec(),
        ),
        Completion::TooLarge { status } => (
            TOO_LARGE,
            i64::from(status.as_u16()),
            Vec::new(),
            Vec::new(),
        ),
        Completion::BodyFailed { status } => (
            BODY_FAILED,
            i64::from(status.as_u16()),
            Vec::new(),
            Vec::new(),
        ),
    }
}

/// The completion stored in these columns.
pub fn completion_from_columns(
    state: i64,
    status: Option<i64>,
    headers: Option<Vec<u8>>,
    body: Option<Vec<u8>>,
) -> Result<Completion, StoreError> {
    let status = status
        .and_then(|s| u16::try_from(s).ok())
        .and_then(|s| StatusCode::from_u16(s).ok())
        .ok_or_else(|| StoreError::Corrupt("completed record without a valid status".into()))?;
    match state {
        COMPLETED => Ok(Completion::Response(StoredResponse {
            status,
            headers: decode_headers(headers.as_deref().unwrap_or_default())?,
            body: Bytes::from(body.unwrap_or_default()),
        })),
        TOO_LARGE => Ok(Completion::TooLarge { status }),
        BODY_FAILED => Ok(Completion::BodyFailed { status }),
        other => Err(StoreError::Corrupt(format!("unknown record state {other}"))),
    }
}

/// The Redis payload after the fixed-width prefix: `[u16 status][u32 headers len][headers][body]`.
pub fn encode_payload(c: &Completion) -> Vec<u8> {
    let (_, status, headers, body) = completion_columns(c);
    let mut out = Vec::with_capacity(6 + headers.len() + body.len());
    out.extend_from_slice(&u16::try_from(status).unwrap_or(0).to_be_bytes());
    out.extend_from_slice(
        &u32::try_from(headers.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes(),
    );
    out.extend_from_slice(&headers);
    out.extend_from_slice(&body);
    out
}

/// Reads a Redis payload written by [`encode_payload`] for a record in `state`.
pub fn decode_payload(state: i64, payload: &[u8]) -> Result<Completion, StoreError> {
    let corrupt = || StoreError::Corrupt("truncated Redis payload".into());
    let (status, rest) = split_u16(payload).ok_or_else(corrupt)?;
    let (hlen, rest) = split_u32(rest).ok_or_else(corrupt)?;
    let (headers, body) =
        split(rest, usize::try_from(hlen).map_err(|_| corrupt())?).ok_or_else(corrupt)?;
    completion_from_columns(
        state,
        Some(i64::from(status)),
        Some(headers.to_vec()),
        Some(body.to_vec()),
    )
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn headers_round_trip() {
        let headers = vec![
            (
                HeaderName::from_static("content-type"),
                HeaderValue::from_static("application/json"),
            ),
            (
                HeaderName::from_static("location"),
                HeaderValue::from_static("/p/1"),
            ),
            (
                HeaderName::from_static("x-bin"),
                HeaderValue::from_bytes(b"\x80\xff ok").expect("opaque value"),
            ),
        ];
        assert_eq!(
            decode_headers(&encode_headers(&headers)).expect("decodes"),
            headers
        );
        assert!(decode_headers(&[0, 5, b'a']).is_err());
    }

    fn header() -> impl Strategy<Value = (HeaderName, HeaderValue)> {
        (
            "[a-z][a-z0-9-]{0,20}",
            proptest::collection::vec(32u8..=255, 0..40),
        )
            .prop_filter_map("valid header", |(name, value)| {
                let value: Vec<u8> = value.into_iter().filter(|b| *b != 127).collect();
                Some((
                    HeaderName::from_bytes(name.as_bytes()).ok()?,
                    HeaderValue::from_bytes(&value).ok()?,
                ))
            })
    }

    fn completion() -> impl Strategy<Value = Completion> {
        let status = (100u16..=999).prop_filter_map("status", |s| StatusCode::from_u16(s).ok());
        prop_oneof![
            (
                status.clone(),
                proptest::collection::vec(header(), 0..6),
                proptest::collection::vec(any::<u8>(), 0..200),
            )
                .prop_map(|(status, headers, body)| {
                    Completion::Response(StoredResponse {
                        status,
                        headers,
                        body: Bytes::from(body),
                    })
                }),
            status
                .clone()
                .prop_map(|status| Completion::TooLarge { status }),
            status.prop_map(|status| Completion::BodyFailed { status }),
        ]
    }

    proptest! {
        #[test]
        fn every_completion_round_trips_through_columns_and_payload(c in completion()) {
            let (state, status, headers, body) = completion_columns(&c);
            let back = completion_from_columns(state, Some(status), Some(headers), Some(body))
                .expect("decodes");
            prop_assert_eq!(&back, &c);
            prop_assert_eq!(decode_payload(state, &encode_payload(&c)).expect("decodes"), c);
        }

        /// Whatever arbitrary bytes decode to encodes back to bytes that decode to the same
        /// thing; what does not decode is `Corrupt`.
        #[test]
        fn arbitrary_bytes_decode_to_what_encodes_back(
            bytes in prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..300),
                // Well-formed lengths around arbitrary names and values.
                proptest::collection::vec(("[a-zA-Z0-9 -]{0,6}", proptest::collection::vec(any::<u8>(), 0..6)), 0..4)
                    .prop_map(|list| list.into_iter().flat_map(|(n, v)| {
                        let mut out = (n.len() as u16).to_be_bytes().to_vec();
                        out.extend_from_slice(n.as_bytes());
                        out.extend_from_slice(&(v.len() as u32).to_be_bytes());
                        out.extend_from_slice(&v);
                        out
                    }).collect()),
            ],
            state in 0i64..5,
        ) {
            match decode_headers(&bytes) {
                Ok(headers) => prop_assert_eq!(decode_headers(&encode_headers(&headers)).ok(), Some(headers)),
                Err(e) => prop_assert!(matches!(e, StoreError::Corrupt(_))),
            }
            match decode_payload(state, &bytes) {
                Ok(c) => {
                    prop_assert_eq!(completion_columns(&c).0, state);
                    prop_assert_eq!(decode_payload(state, &encode_payload(&c)).ok(), Some(c));
                }
                Err(e) => prop_assert!(matches!(e, StoreError::Corrupt(_))),
            }
            let readable = match state {
                COMPLETED => decode_headers(&bytes).is_ok(),
                TOO_LARGE | BODY_FAILED => true,
                _ => false,
            };
            let columns = completion_from_columns(state, Some(200), Some(bytes.clone()), Some(bytes));
            prop_assert_eq!(columns.is_ok(), readable);
        }

        #[test]
        fn a_truncated_header_list_is_corrupt(headers in proptest::collection::vec(header(), 1..5), cut in 1usize..8) {
            let bytes = encode_headers(&headers);
            let cut = cut.min(bytes.len());
            let short = &bytes[..bytes.len() - cut];
            match decode_headers(short) {
                Err(StoreError::Corrupt(_)) => {}
                // A cut exactly between two headers leaves a valid, shorter list.
                Ok(fewer) => prop_assert!(fewer.len() < headers.len()),
                Err(other) => prop_assert!(false, "unexpected {other:?}"),
            }
        }
    }
}
