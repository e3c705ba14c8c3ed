//! The callback signature: HMAC-SHA256 over the raw body with a secret shared with the
//! payment platform.
//!
//! The signature is checked before anything else, on the exact bytes received (never on a
//! re-serialised payload, which could differ in whitespace or key order), and in constant time
//! ([`Mac::verify_slice`]), so a forger learns nothing from how long a rejection takes. A
//! request with a missing, malformed or wrong signature is answered without touching the risk
//! service or the database.
//!
//! On the wire the signature is the 64 hexadecimal digits of the MAC in [`SIGNATURE_HEADER`].

use std::fmt;

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The request header that carries the signature (64 hex digits, either case).
pub const SIGNATURE_HEADER: &str = "x-pay-signature";

/// Length of a signature on the wire: 32 bytes as hex.
const HEX_LEN: usize = 64;

/// Why a signature was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// The request carried no signature header.
    #[error("missing {SIGNATURE_HEADER} header")]
    Missing,
    /// The header is not 64 hexadecimal digits.
    #[error("malformed {SIGNATURE_HEADER} header: {0}")]
    Malformed(&'static str),
    /// The signature does not match the body.
    #[error("signature does not match the body")]
    Mismatch,
}

/// The shared secret was unusable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the callback secret must not be empty")]
pub struct EmptySecret;

/// Signs and verifies callback bodies with one shared secret.
///
/// # Example
///
/// ```
/// use stormguard_payment_callback::signature::{SignatureError, Signer};
///
/// let signer = Signer::new("shared-secret")?;
/// let body = br#"{"out_trade_no":"A1"}"#;
/// let signature = signer.sign(body);
/// assert_eq!(signer.verify(Some(signature.as_bytes()), body), Ok(()));
/// assert_eq!(signer.verify(Some(signature.as_bytes()), b"{}"), Err(SignatureError::Mismatch));
/// assert_eq!(signer.verify(None, body), Err(SignatureError::Missing));
/// # Ok::<(), stormguard_payment_callback::signature::EmptySecret>(())
/// ```
#[derive(Clone)]
pub struct Signer {
    keyed: Hmac<Sha256>,
}

impl fmt::Debug for Signer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the key.
        f.debug_struct("Signer").finish_non_exhaustive()
    }
}

impl Signer {
    /// A signer keyed with `secret`, which must not be empty.
    pub fn new(secret: impl AsRef<[u8]>) -> Result<Self, EmptySecret> {
        let secret = secret.as_ref();
        if secret.is_empty() {
            return Err(EmptySecret);
        }
        // HMAC accepts keys of any length, so this cannot fail; map it anyway.
        let keyed = Hmac::<Sha256>::new_from_slice(secret).map_err(|_| EmptySecret)?;
        Ok(Signer { keyed })
    }

    /// The signature of `body`: 64 lowercase hex digits.
    pub fn sign(&self, body: &[u8]) -> String {
        let mut mac = self.keyed.clone();
        mac.update(body);
        hex::encode(mac.finalize().into_bytes())
    }

    /// Checks `header` (the raw value of [`SIGNATURE_HEADER`], if present) against `body`,
    /// in constant time.
    pub fn verify(&self, header: Option<&[u8]>, body: &[u8]) -> Result<(), SignatureError> {
        let header = header.ok_or(SignatureError::Missing)?;
        if header.len() != HEX_LEN {
            return Err(SignatureError::Malformed("expected 64 hexadecimal digits"));
        }
        let mut expected = [0u8; HEX_LEN / 2];
        hex::decode_to_slice(header, &mut expected)
            .map_err(|_| SignatureError::Malformed("not hexadecimal"))?;
        let mut mac = self.keyed.clone();
        mac.update(body);
        mac.verify_slice(&expected)
            .map_err(|_| SignatureError::Mismatch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn signer() -> Signer {
        Signer::new("demo-secret").expect("non-empty")
    }

    const BODY: &[u8] = br#"{"out_trade_no":"T1","trade_no":"W1","amount":100,"status":"SUCCESS"}"#;

    #[test]
    fn a_valid_signature_passes() {
        let s = signer();
        let sig = s.sign(BODY);
        assert_eq!(sig.len(), 64);
        assert_eq!(s.verify(Some(sig.as_bytes()), BODY), Ok(()));
        // Upper-case hex is the same signature.
        assert_eq!(
            s.verify(Some(sig.to_ascii_uppercase().as_bytes()), BODY),
            Ok(())
        );
    }

    #[test]
    fn rfc4231_test_case_2() {
        // RFC 4231 §4.3: key "Jefe", data "what do ya want for nothing?".
        let s = Signer::new("Jefe").expect("non-empty");
        assert_eq!(
            s.sign(b"what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn a_tampered_body_or_signature_is_a_mismatch() {
        let s = signer();
        let sig = s.sign(BODY);
        let tampered = String::from_utf8_lossy(BODY).replace("100", "1");
        assert_eq!(
            s.verify(Some(sig.as_bytes()), tampered.as_bytes()),
            Err(SignatureError::Mismatch)
        );
        let mut flipped = sig.into_bytes();
        flipped[10] = if flipped[10] == b'0' { b'1' } else { b'0' };
        assert_eq!(
            s.verify(Some(&flipped), BODY),
            Err(SignatureError::Mismatch)
        );
        let other = Signer::new("another-secret").expect("non-empty");
        assert_eq!(
            other.verify(Some(s.sign(BODY).as_bytes()), BODY),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn a_missing_or_malformed_signature_is_named() {
        let s = signer();
        assert_eq!(s.verify(None, BODY), Err(SignatureError::Missing));
        assert!(matches!(
            s.verify(Some(b""), BODY),
            Err(SignatureError::Malformed(_))
        ));
        assert!(matches!(
            s.verify(Some(&[b'z'; 64]), BODY),
            Err(SignatureError::Malformed("not hexadecimal"))
        ));
        let padded = format!(" {}", &s.sign(BODY)[1..]);
        assert!(matches!(
            s.verify(Some(padded.as_bytes()), BODY),
            Err(SignatureError::Malformed(_))
        ));
    }

    #[test]
    fn an_empty_secret_is_refused_and_the_key_is_never_printed() {
        assert_eq!(Signer::new("").map(|_| ()), Err(EmptySecret));
        assert!(!format!("{:?}", signer()).contains("demo-secret"));
    }

    proptest! {
        /// Only the body's own MAC passes (in either hex case); every other header is
        /// missing, malformed (not 64 hex digits) or a mismatch, in that order.
        #[test]
        fn only_the_right_mac_passes(
            header in proptest::option::of(prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..80),
                "[0-9a-fA-F]{64}".prop_map(String::into_bytes),
            ]),
            flip in proptest::option::of(0usize..64),
            body in proptest::collection::vec(any::<u8>(), 0..256),
        ) {
            let s = signer();
            let good = s.sign(&body);
            // Half the cases: the right MAC, or the right MAC with one digit changed.
            let header = match flip {
                None => header,
                Some(i) => {
                    let mut h = good.clone().into_bytes();
                    if i % 2 == 0 { h[i] = if h[i] == b'0' { b'1' } else { b'0' }; }
                    Some(h)
                }
            };
            let expected = match &header {
                None => Err(SignatureError::Missing),
                Some(h) if h.len() != 64 || !h.iter().all(u8::is_ascii_hexdigit) => {
                    Err(SignatureError::Malformed(if h.len() != 64 { "expected 64 hexadecimal digits" } else { "not hexadecimal" }))
                }
                Some(h) if h.eq_ignore_ascii_case(good.as_bytes()) => Ok(()),
                Some(_) => Err(SignatureError::Mismatch),
            };
            prop_assert_eq!(s.verify(header.as_deref(), &body), expected);
        }

        #[test]
        fn sign_then_verify_round_trips(body in proptest::collection::vec(any::<u8>(), 0..256)) {
            let s = signer();
            let sig = s.sign(&body);
            prop_assert_eq!(s.verify(Some(sig.as_bytes()), &body), Ok(()));
        }
    }
}
