//! The payment callback's front door (examples/payment-callback): the signature check and
//! the payload. Only the body's own signature passes, in either hex case; any other header
//! is refused before the payload is read; a payload that parses has valid fields and writes
//! back to JSON that parses to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stormguard_payment_callback::callback::{PaymentCallback, Rejection, verify_and_parse};
use stormguard_payment_callback::signature::{SignatureError, Signer};

// Input: the signature header up to the first newline, then the body.
fuzz_target!(|data: &[u8]| {
    let (header, body) = match data.iter().position(|&b| b == b'\n') {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &b""[..]),
    };
    let signer = Signer::new("fuzz-secret").expect("non-empty");
    let good = signer.sign(body);

    // An arbitrary header: only the right MAC (in any case) passes.
    let result = signer.verify(Some(header), body);
    let matches = header.eq_ignore_ascii_case(good.as_bytes());
    assert_eq!(result.is_ok(), matches, "{header:?}");
    if !matches {
        assert!(matches!(
            verify_and_parse(&signer, Some(header), body),
            Err(Rejection::Signature(_))
        ));
    }
    assert_eq!(signer.verify(None, body), Err(SignatureError::Missing));

    // The right signature reaches the payload parser.
    let parsed = PaymentCallback::parse(body);
    match verify_and_parse(&signer, Some(good.as_bytes()), body) {
        Ok(cb) => assert_eq!(Ok(&cb), parsed.as_ref()),
        Err(Rejection::Payload(e)) => assert_eq!(Err(e), parsed),
        Err(Rejection::Signature(e)) => panic!("own signature refused: {e}"),
    }
    if let Ok(cb) = parsed {
        let valid = |id: &str| {
            (1..=64).contains(&id.len())
                && id
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_-|*.".contains(&b))
        };
        assert!(valid(&cb.out_trade_no) && valid(&cb.trade_no), "{cb:?}");
        assert!(cb.amount > 0 && i64::try_from(cb.amount).is_ok());
        assert_eq!(PaymentCallback::parse(&cb.to_json()).as_ref(), Ok(&cb));
    }
});
