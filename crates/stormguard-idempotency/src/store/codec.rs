//! Byte encodings shared by the stores: header lists, and the whole Redis record.

use bytes::Bytes;
use http::{HeaderName, HeaderValue, StatusCode};

use super::{Completion, StoreError, StoredResponse};

/// Record states, as stored in the `state` column (SQL) and the first byte (Redis).
pub(crate) const IN_FLIGHT: i64 = 0;
pub(crate) const COMPLETED: i64 = 1;
pub(crate) const TOO_LARGE: i64 = 2;
pub(crate) const BODY_FAILED: i64 = 3;

/// `[u16 name len][name][u32 value len][value]` for each header, big-endian.
pub(crate) fn encode_headers(headers: &[(HeaderName, HeaderValue)]) -> Vec<u8> {
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

pub(crate) fn decode_headers(
    mut bytes: &[u8],
) -> Result<Vec<(HeaderName, HeaderValue)>, StoreError> {
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
pub(crate) fn completion_columns(c: &Completion) -> (i64, i64, Vec<u8>, Vec<u8>) {
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
pub(crate) fn completion_from_columns(
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
#[cfg(feature = "redis")]
pub(crate) fn encode_payload(c: &Completion) -> Vec<u8> {
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

#[cfg(feature = "redis")]
pub(crate) fn decode_payload(state: i64, payload: &[u8]) -> Result<Completion, StoreError> {
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
}
