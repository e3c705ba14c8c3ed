//! Models the fuzz targets compare stormguard's parsers against.
//!
//! Each model is written from the specification, not from the code it checks, and as plainly
//! as possible (no fast paths): a disagreement is a bug in one of the two, and the target
//! says which input shows it.

pub mod sf {
    //! A structured-field Item (RFC 9651 §4.2.3), parsed the way the RFC's algorithm reads,
    //! keeping only what the `Idempotency-Key` header needs: whether the value is one valid
    //! Item, and the String it holds if its bare item is a String.

    /// The bytes are not one structured-field Item.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct NotAnItem;

    /// The bare item of a valid Item: `Some(text)` for a String, `None` for any other type.
    /// `Err(NotAnItem)` when the bytes are not one Item at all.
    pub fn item_string(input: &[u8]) -> Result<Option<String>, NotAnItem> {
        // The field value must be ASCII (§4.2, "convert input_bytes into an ASCII string").
        if !input.is_ascii() {
            return Err(NotAnItem);
        }
        let mut p = Parser { s: input, at: 0 };
        p.skip_sp();
        let bare = p.bare_item()?;
        p.parameters()?;
        p.skip_sp();
        if p.at != p.s.len() {
            return Err(NotAnItem);
        }
        Ok(match bare {
            Bare::String(s) => Some(s),
            Bare::Other => None,
        })
    }

    enum Bare {
        String(String),
        Other,
    }

    struct Parser<'a> {
        s: &'a [u8],
        at: usize,
    }

    fn is_tchar(c: u8) -> bool {
        c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c)
    }

    impl Parser<'_> {
        fn peek(&self) -> Option<u8> {
            self.s.get(self.at).copied()
        }

        fn next(&mut self) -> Option<u8> {
            let c = self.peek()?;
            self.at += 1;
            Some(c)
        }

        fn skip_sp(&mut self) {
            while self.peek() == Some(b' ') {
                self.at += 1;
            }
        }

        fn bare_item(&mut self) -> Result<Bare, NotAnItem> {
            match self.peek().ok_or(NotAnItem)? {
                b'-' | b'0'..=b'9' => self.number().map(|_| Bare::Other),
                b'"' => self.string().map(Bare::String),
                b'*' | b'a'..=b'z' | b'A'..=b'Z' => {
                    self.token();
                    Ok(Bare::Other)
                }
                b':' => self.bytes().map(|()| Bare::Other),
                b'?' => {
                    self.at += 1;
                    match self.next() {
                        Some(b'0' | b'1') => Ok(Bare::Other),
                        _ => Err(NotAnItem),
                    }
                }
                b'@' => {
                    self.at += 1;
                    match self.number()? {
                        true => Ok(Bare::Other),
                        false => Err(NotAnItem),
                    }
                }
                b'%' => self.display_string().map(|()| Bare::Other),
                _ => Err(NotAnItem),
            }
        }

        /// §4.2.4: `Ok(true)` for an Integer, `Ok(false)` for a Decimal.
        fn number(&mut self) -> Result<bool, NotAnItem> {
            if self.peek() == Some(b'-') {
                self.at += 1;
            }
            if !self.peek().is_some_and(|c| c.is_ascii_digit()) {
                return Err(NotAnItem);
            }
            let mut digits = String::new();
            let mut integer = true;
            while let Some(c) = self.peek() {
                if c.is_ascii_digit() {
                    digits.push(char::from(c));
                } else if integer && c == b'.' {
                    if digits.len() > 12 {
                        return Err(NotAnItem);
                    }
                    digits.push('.');
                    integer = false;
                } else {
                    break;
                }
                self.at += 1;
                if (integer && digits.len() > 15) || (!integer && digits.len() > 16) {
                    return Err(NotAnItem);
                }
            }
            if !integer {
                let (_, frac) = digits.split_once('.').ok_or(NotAnItem)?;
                if frac.is_empty() || frac.len() > 3 {
                    return Err(NotAnItem);
                }
            }
            Ok(integer)
        }

        /// §4.2.5.
        fn string(&mut self) -> Result<String, NotAnItem> {
            self.at += 1;
            let mut out = String::new();
            loop {
                let c = self.next().ok_or(NotAnItem)?;
                match c {
                    b'\\' => match self.next() {
                        Some(e @ (b'"' | b'\\')) => out.push(char::from(e)),
                        _ => return Err(NotAnItem),
                    },
                    b'"' => return Ok(out),
                    0x00..=0x1f | 0x7f..=0xff => return Err(NotAnItem),
                    _ => out.push(char::from(c)),
                }
            }
        }

        /// §4.2.6.
        fn token(&mut self) {
            self.at += 1;
            while self
                .peek()
                .is_some_and(|c| is_tchar(c) || c == b':' || c == b'/')
            {
                self.at += 1;
            }
        }

        /// §4.2.7: base64 between colons, "synthesizing padding if necessary": padding may be
        /// missing or short (`aG`, `aG=`, `aG==`), never in excess (`aGk==`) or where no
        /// group is partial (`aGk=x`, `aGkh=`).
        fn bytes(&mut self) -> Result<(), NotAnItem> {
            self.at += 1;
            let rest = &self.s[self.at..];
            let end = rest.iter().position(|&c| c == b':').ok_or(NotAnItem)?;
            let content = &rest[..end];
            self.at += end + 1;
            let data_len = content.iter().take_while(|&&c| c != b'=').count();
            let (data, pad) = content.split_at(data_len);
            let alphabet = |c: &u8| c.is_ascii_alphanumeric() || *c == b'+' || *c == b'/';
            if !data.iter().all(alphabet) || !pad.iter().all(|&c| c == b'=') {
                return Err(NotAnItem);
            }
            let tail = data.len() % 4;
            let ok = match pad.len() {
                0 => tail != 1,
                n => tail >= 2 && tail + n <= 4,
            };
            if ok { Ok(()) } else { Err(NotAnItem) }
        }

        /// §4.2.10: `%"` then printable ASCII and `%xx` (lower-case hex), valid UTF-8.
        fn display_string(&mut self) -> Result<(), NotAnItem> {
            self.at += 1;
            if self.next() != Some(b'"') {
                return Err(NotAnItem);
            }
            let mut octets = Vec::new();
            loop {
                let c = self.next().ok_or(NotAnItem)?;
                match c {
                    0x00..=0x1f | 0x7f..=0xff => return Err(NotAnItem),
                    b'%' => {
                        let hex = |c: Option<u8>| match c {
                            Some(d @ b'0'..=b'9') => Ok(d - b'0'),
                            Some(d @ b'a'..=b'f') => Ok(d - b'a' + 10),
                            _ => Err(NotAnItem),
                        };
                        let hi = hex(self.next())?;
                        let lo = hex(self.next())?;
                        octets.push(hi * 16 + lo);
                    }
                    b'"' => return String::from_utf8(octets).map(|_| ()).map_err(|_| NotAnItem),
                    _ => octets.push(c),
                }
            }
        }

        /// §4.2.3.2: `;key[=bare-item]`, repeated.
        fn parameters(&mut self) -> Result<(), NotAnItem> {
            while self.peek() == Some(b';') {
                self.at += 1;
                self.skip_sp();
                match self.next() {
                    Some(b'a'..=b'z' | b'*') => {}
                    _ => return Err(NotAnItem),
                }
                while self.peek().is_some_and(|c| {
                    c.is_ascii_lowercase() || c.is_ascii_digit() || b"_-.*".contains(&c)
                }) {
                    self.at += 1;
                }
                if self.peek() == Some(b'=') {
                    self.at += 1;
                    self.bare_item()?;
                }
            }
            Ok(())
        }
    }

    #[cfg(test)]
    mod tests {
        use super::item_string;

        #[test]
        fn reads_the_rfc_examples() {
            assert_eq!(item_string(b"\"abc\""), Ok(Some("abc".into())));
            assert_eq!(item_string(br#"  "a\"b";v=1;w"#), Ok(Some("a\"b".into())));
            assert_eq!(item_string(b"abc"), Ok(None));
            assert_eq!(item_string(b"-12.345"), Ok(None));
            assert_eq!(item_string(b":aGk=:"), Ok(None));
            assert_eq!(item_string(b"%\"caf%c3%a9\""), Ok(None));
            assert_eq!(item_string(b"\"a\";k=:aGk:"), Ok(Some("a".into())));
            assert_eq!(item_string(b":aG=:"), Ok(None));
            for bad in [
                &b""[..],
                b"\"abc",
                b"\"a\\x\"",
                b"1.",
                b"1.2345",
                b"1234567890123456",
                b"\"a\" x",
                b"\"a\";K=1",
                b":a:",
                b":aGk==:",
                b"%\"%C3%A9\"",
                b"%\"%ff\"",
                b"@1.5",
                b"?2",
                b"\"\xc3\xa9\"",
            ] {
                assert_eq!(item_string(bad), Err(NotAnItem), "{bad:?}");
            }
        }
    }
}

/// A policy file that loaded must write back, as TOML and as JSON, to text that loads to the
/// same file (the round trip both policy targets check).
pub fn assert_policy_round_trip(text: &str, file: &stormguard::policy::PolicyFile) {
    use stormguard::policy::PolicyFile;
    let toml = file.to_toml();
    assert_eq!(
        PolicyFile::from_toml(&toml).as_ref(),
        Ok(file),
        "{text:?} -> TOML {toml}"
    );
    let json = file.to_json();
    assert_eq!(
        PolicyFile::from_json(&json).as_ref(),
        Ok(file),
        "{text:?} -> JSON {json}"
    );
}
