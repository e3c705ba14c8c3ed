//! The callback payload: what the payment platform says happened to one order.
//!
//! The payload is parsed only after its signature was verified ([`verify_and_parse`] does
//! both, in that order), strictly: unknown fields, a zero or negative amount, or an order
//! number outside the platform's alphabet are refused with an error that names the field.
//! `out_trade_no` (ours) is the business key that makes processing exactly-once; `trade_no`
//! (the platform's) is recorded with it.

use serde::{Deserialize, Serialize};

use crate::signature::{SignatureError, Signer};

/// The longest `out_trade_no` / `trade_no` accepted (the platform's own limit is 32).
pub const MAX_ID_LEN: usize = 64;

/// The topic of the event published once per paid order.
pub const ORDER_PAID: &str = "order.paid";

/// What the platform reports for an order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TradeStatus {
    /// The payment succeeded: the order is paid.
    Success,
    /// The trade was closed without payment: acknowledged, nothing recorded.
    Closed,
}

/// One payment notification.
///
/// # Example
///
/// ```
/// use stormguard_payment_callback::callback::{PaymentCallback, TradeStatus};
///
/// let cb = PaymentCallback::paid("ORDER-1", "WX-9", 1250);
/// let parsed = PaymentCallback::parse(&cb.to_json()).unwrap();
/// assert_eq!(parsed, cb);
/// assert_eq!(parsed.status, TradeStatus::Success);
/// assert_eq!(parsed.event_id(), "order.paid/ORDER-1");
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PaymentCallback {
    /// Our order number: the business key (unique).
    pub out_trade_no: String,
    /// The platform's transaction number.
    pub trade_no: String,
    /// The amount in the currency's smallest unit (fen, cents), above zero.
    pub amount: u64,
    /// What happened.
    pub status: TradeStatus,
}

/// Why a payload was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CallbackError {
    /// Not JSON of the callback's shape (the message names the field or position).
    #[error("malformed callback: {0}")]
    Syntax(String),
    /// A field breaks a rule.
    #[error("callback field `{field}`: {rule}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// The rule broken.
        rule: &'static str,
    },
}

/// Why a request was refused before any processing.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    /// The signature is missing, malformed or wrong (checked first).
    #[error(transparent)]
    Signature(#[from] SignatureError),
    /// The signature is right but the payload is not a valid callback.
    #[error(transparent)]
    Payload(#[from] CallbackError),
}

impl PaymentCallback {
    /// A `SUCCESS` notification for `out_trade_no`.
    pub fn paid(out_trade_no: impl Into<String>, trade_no: impl Into<String>, amount: u64) -> Self {
        PaymentCallback {
            out_trade_no: out_trade_no.into(),
            trade_no: trade_no.into(),
            amount,
            status: TradeStatus::Success,
        }
    }

    /// Parses and checks a payload.
    pub fn parse(body: &[u8]) -> Result<Self, CallbackError> {
        let cb: PaymentCallback =
            serde_json::from_slice(body).map_err(|e| CallbackError::Syntax(e.to_string()))?;
        check_id("out_trade_no", &cb.out_trade_no)?;
        check_id("trade_no", &cb.trade_no)?;
        if cb.amount == 0 || i64::try_from(cb.amount).is_err() {
            return Err(CallbackError::Invalid {
                field: "amount",
                rule: "must be above zero and at most 2^63 - 1",
            });
        }
        Ok(cb)
    }

    /// The JSON body the platform sends.
    pub fn to_json(&self) -> Vec<u8> {
        // Serialising a struct of strings, an integer and a unit enum cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// The id of this order's `order.paid` event: derived from the business key, so even a
    /// second enqueue could never make a second event.
    pub fn event_id(&self) -> String {
        format!("{ORDER_PAID}/{}", self.out_trade_no)
    }

    /// The amount as stored (checked by [`parse`](Self::parse) to fit).
    pub fn amount_i64(&self) -> i64 {
        i64::try_from(self.amount).unwrap_or(i64::MAX)
    }
}

/// Order numbers: 1 to [`MAX_ID_LEN`] characters from `A-Z a-z 0-9 _ - | * .`.
fn check_id(field: &'static str, id: &str) -> Result<(), CallbackError> {
    if id.is_empty() || id.len() > MAX_ID_LEN {
        return Err(CallbackError::Invalid {
            field,
            rule: "must be 1 to 64 characters",
        });
    }
    if !id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'|' | b'*' | b'.'))
    {
        return Err(CallbackError::Invalid {
            field,
            rule: "may hold only A-Z, a-z, 0-9 and _ - | * .",
        });
    }
    Ok(())
}

/// Verifies the signature of `body`, then parses it: the whole check a request goes through
/// before any state is read or written.
pub fn verify_and_parse(
    signer: &Signer,
    signature: Option<&[u8]>,
    body: &[u8],
) -> Result<PaymentCallback, Rejection> {
    signer.verify(signature, body)?;
    Ok(PaymentCallback::parse(body)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn signer() -> Signer {
        Signer::new("demo-secret").expect("non-empty")
    }

    #[test]
    fn fields_are_checked_by_name() {
        let cases: [(&[u8], &str); 6] = [
            (br#"{"out_trade_no":"","trade_no":"W","amount":1,"status":"SUCCESS"}"#, "out_trade_no"),
            (br#"{"out_trade_no":"A B","trade_no":"W","amount":1,"status":"SUCCESS"}"#, "out_trade_no"),
            (br#"{"out_trade_no":"A","trade_no":"W'","amount":1,"status":"SUCCESS"}"#, "trade_no"),
            (br#"{"out_trade_no":"A","trade_no":"W","amount":0,"status":"SUCCESS"}"#, "amount"),
            (br#"{"out_trade_no":"A","trade_no":"W","amount":9223372036854775808,"status":"SUCCESS"}"#, "amount"),
            (br#"{"out_trade_no":"A","trade_no":"W","amount":1,"status":"SUCCESS","extra":1}"#, "extra"),
        ];
        for (body, field) in cases {
            let err = PaymentCallback::parse(body).expect_err("refused");
            assert!(err.to_string().contains(field), "{err}");
        }
        assert!(
            PaymentCallback::parse(
                br#"{"out_trade_no":"A","trade_no":"W","amount":-1,"status":"SUCCESS"}"#
            )
            .is_err()
        );
        assert!(
            PaymentCallback::parse(
                br#"{"out_trade_no":"A","trade_no":"W","amount":1,"status":"PAID"}"#
            )
            .is_err()
        );
    }

    #[test]
    fn the_signature_is_checked_before_the_payload() {
        let s = signer();
        // A bad payload with no signature is a signature rejection: nothing is parsed.
        assert_eq!(
            verify_and_parse(&s, None, b"not json"),
            Err(Rejection::Signature(SignatureError::Missing))
        );
        let body = b"not json";
        let sig = s.sign(body);
        assert!(matches!(
            verify_and_parse(&s, Some(sig.as_bytes()), body),
            Err(Rejection::Payload(CallbackError::Syntax(_)))
        ));
        let cb = PaymentCallback::paid("A-1", "W-1", 7);
        let body = cb.to_json();
        let sig = s.sign(&body);
        assert_eq!(verify_and_parse(&s, Some(sig.as_bytes()), &body), Ok(cb));
    }

    fn id() -> impl Strategy<Value = String> {
        "[A-Za-z0-9_|*.-]{1,64}"
    }

    proptest! {
        /// The signature is checked first: a wrong one is refused whatever the body; the
        /// right one hands the body to the parser, whose verdict is returned as is.
        #[test]
        fn the_signature_gates_the_parser(body in proptest::collection::vec(any::<u8>(), 0..300),
                                          sig in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..80))) {
            let s = signer();
            let good = s.sign(&body);
            let wrong = sig.as_deref().is_none_or(|h| !h.eq_ignore_ascii_case(good.as_bytes()));
            prop_assume!(wrong);
            prop_assert!(matches!(verify_and_parse(&s, sig.as_deref(), &body), Err(Rejection::Signature(_))));
            let parsed = PaymentCallback::parse(&body).map_err(Rejection::Payload);
            prop_assert_eq!(verify_and_parse(&s, Some(good.as_bytes()), &body), parsed);
        }

        /// A payload is accepted exactly when it is the callback object with valid fields
        /// (checked here by a model of the rules, over near-valid JSON).
        #[test]
        fn parse_accepts_exactly_valid_fields(
            out in "[A-Za-z0-9_|*. -]{0,66}",
            trade in "[A-Za-z0-9_|*.é]{0,3}",
            amount in prop_oneof![any::<u64>(), 0u64..3, Just(i64::MAX as u64), Just(i64::MAX as u64 + 1)],
            status in "(SUCCESS|CLOSED|PAID|success)",
        ) {
            let body = serde_json::json!({"out_trade_no": out, "trade_no": trade, "amount": amount, "status": status});
            let valid_id = |id: &str| (1..=64).contains(&id.len())
                && id.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-|*.".contains(&b));
            let valid = valid_id(&out) && valid_id(&trade) && amount > 0 && i64::try_from(amount).is_ok()
                && (status == "SUCCESS" || status == "CLOSED");
            let parsed = PaymentCallback::parse(body.to_string().as_bytes());
            prop_assert_eq!(parsed.is_ok(), valid, "{}", body);
            if let Ok(cb) = parsed {
                prop_assert_eq!(PaymentCallback::parse(&cb.to_json()), Ok(cb));
            }
        }

        #[test]
        fn valid_callbacks_round_trip(out in id(), trade in id(), amount in 1..=i64::MAX as u64, closed in any::<bool>()) {
            let cb = PaymentCallback {
                out_trade_no: out,
                trade_no: trade,
                amount,
                status: if closed { TradeStatus::Closed } else { TradeStatus::Success },
            };
            prop_assert_eq!(PaymentCallback::parse(&cb.to_json()), Ok(cb));
        }
    }
}
