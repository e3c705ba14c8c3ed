//! The idempotency key a retried call carries on every attempt.

use std::fmt;
use std::sync::Arc;

/// A client-chosen key that lets the server recognise a repeated request (the IETF httpapi
/// `Idempotency-Key` draft): 1 to 255 printable ASCII characters.
///
/// Cloning is cheap (a reference count), so the retrier hands the *same* key to every attempt.
///
/// # Example
///
/// ```
/// use stormguard::retry::IdempotencyKey;
///
/// let key = IdempotencyKey::new("order-8812-pay")?;
/// assert_eq!(key.as_str(), "order-8812-pay");
/// assert_eq!(key.to_header_value(), "\"order-8812-pay\"");
/// assert!(IdempotencyKey::new("").is_err());
/// # Ok::<(), stormguard::retry::InvalidKey>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(Arc<str>);

/// Why a string is not a valid idempotency key.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidKey {
    /// The key is empty.
    #[error("idempotency key is empty")]
    Empty,
    /// The key is longer than 255 characters.
    #[error("idempotency key is {0} characters long; at most 255 are allowed")]
    TooLong(usize),
    /// The key holds a character outside printable ASCII (0x20..=0x7E).
    #[error("idempotency key has a non-printable or non-ASCII character at byte {0}")]
    NotPrintable(usize),
}

impl IdempotencyKey {
    /// The longest key accepted.
    pub const MAX_LEN: usize = 255;

    /// Validates `key`.
    pub fn new(key: &str) -> Result<Self, InvalidKey> {
        if key.is_empty() {
            return Err(InvalidKey::Empty);
        }
        if key.len() > Self::MAX_LEN {
            return Err(InvalidKey::TooLong(key.len()));
        }
        if let Some(at) = key.bytes().position(|b| !(0x20..=0x7e).contains(&b)) {
            return Err(InvalidKey::NotPrintable(at));
        }
        Ok(IdempotencyKey(Arc::from(key)))
    }

    /// The key itself.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key as a structured-field string (RFC 8941), the form the `Idempotency-Key`
    /// header carries: quoted, with `"` and `\` escaped.
    pub fn to_header_value(&self) -> String {
        let mut out = String::with_capacity(self.0.len() + 2);
        out.push('"');
        for c in self.0.chars() {
            if c == '"' || c == '\\' {
                out.push('\\');
            }
            out.push(c);
        }
        out.push('"');
        out
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("IdempotencyKey").field(&&*self.0).finish()
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn rejects_each_broken_rule() {
        assert_eq!(IdempotencyKey::new(""), Err(InvalidKey::Empty));
        assert_eq!(
            IdempotencyKey::new(&"k".repeat(256)),
            Err(InvalidKey::TooLong(256))
        );
        assert_eq!(
            IdempotencyKey::new("ab\ncd"),
            Err(InvalidKey::NotPrintable(2))
        );
        assert_eq!(IdempotencyKey::new("clé"), Err(InvalidKey::NotPrintable(2)));
        assert!(IdempotencyKey::new(&"k".repeat(255)).is_ok());
    }

    #[test]
    fn header_value_escapes_quotes_and_backslashes() {
        let key = IdempotencyKey::new(r#"a"b\c"#).expect("valid");
        assert_eq!(key.to_header_value(), r#""a\"b\\c""#);
    }

    proptest! {
        /// A key is 1 to 255 bytes of printable ASCII; the error names the first rule broken.
        #[test]
        fn accepts_exactly_printable_ascii(s in prop_oneof![".{0,300}", "[ -~]{250,260}", "[ -~\\t\\x7f]{0,6}"]) {
            let expected = if s.is_empty() {
                Err(InvalidKey::Empty)
            } else if s.len() > IdempotencyKey::MAX_LEN {
                Err(InvalidKey::TooLong(s.len()))
            } else if let Some(at) = s.bytes().position(|b| !(b' '..=b'~').contains(&b)) {
                Err(InvalidKey::NotPrintable(at))
            } else {
                Ok(s.clone())
            };
            prop_assert_eq!(IdempotencyKey::new(&s).map(|k| k.as_str().to_owned()), expected);
        }

        #[test]
        fn printable_ascii_keys_are_accepted(s in "[ -~]{1,255}") {
            prop_assert_eq!(IdempotencyKey::new(&s).map(|k| k.as_str().to_owned()), Ok(s));
        }
    }
}
