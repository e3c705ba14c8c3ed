//! A canonical form of JSON text that keeps every number exactly as written.
//!
//! One pass over the bytes builds a small tree (object entries, array items, decoded strings,
//! and the untouched text of numbers and literals), then writes it back with object keys sorted
//! by their UTF-8 bytes, no whitespace, and strings in serde_json's escaping. The scanner only
//! finds where a token ends and checks the number grammar of RFC 8259; decoding a string
//! (escapes, surrogate pairs, UTF-8) is serde_json's job.

use serde_json::to_writer;

/// Nesting deeper than this is not canonicalised (the body is hashed as sent).
const MAX_DEPTH: usize = 128;

/// The canonical form of the JSON text `body`, or `None` when it is not one JSON value
/// (RFC 8259, surrounding whitespace allowed) or nests deeper than 128 levels.
///
/// Object keys are sorted by their bytes (entries with equal keys keep their order, so
/// `{"a":1,"a":2}` and `{"a":2,"a":1}` stay different), whitespace between tokens is
/// dropped, strings are written with serde_json's escaping, and numbers, `true`, `false` and
/// `null` are copied exactly as written: no number is ever rounded through `f64`.
///
/// ```
/// use stormguard_idempotency::fingerprint::canonical_json;
///
/// let a = canonical_json(br#"{ "b": [1, 2.50], "a": "\u00e9" }"#).unwrap();
/// assert_eq!(a, r#"{"a":"é","b":[1,2.50]}"#.as_bytes());
/// // Digits past f64 precision still count.
/// assert_ne!(
///     canonical_json(br#"{"amount":100000000000000000001}"#),
///     canonical_json(br#"{"amount":100000000000000000002}"#),
/// );
/// assert_eq!(canonical_json(b"{\"a\":}"), None);
/// ```
pub fn canonical_json(body: &[u8]) -> Option<Vec<u8>> {
    let mut parser = Parser { bytes: body, at: 0 };
    let node = parser.value(0)?;
    parser.skip_whitespace();
    if parser.at != body.len() {
        return None;
    }
    let mut out = Vec::with_capacity(body.len());
    node.write(&mut out);
    Some(out)
}

enum Node<'a> {
    Object(Vec<(String, Node<'a>)>),
    Array(Vec<Node<'a>>),
    String(String),
    /// A number or literal, as written.
    Verbatim(&'a [u8]),
}

impl Node<'_> {
    fn write(&self, out: &mut Vec<u8>) {
        match self {
            Node::Object(entries) => {
                let mut sorted: Vec<&(String, Node<'_>)> = entries.iter().collect();
                sorted.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
                out.push(b'{');
                for (i, (key, value)) in sorted.into_iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    write_string(key, out);
                    out.push(b':');
                    value.write(out);
                }
                out.push(b'}');
            }
            Node::Array(items) => {
                out.push(b'[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    item.write(out);
                }
                out.push(b']');
            }
            Node::String(s) => write_string(s, out),
            Node::Verbatim(text) => out.extend_from_slice(text),
        }
    }
}

fn write_string(s: &str, out: &mut Vec<u8>) {
    // Writing a string into a Vec cannot fail.
    let _ = to_writer(&mut *out, s);
}

struct Parser<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    fn skip_whitespace(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    fn eat(&mut self, byte: u8) -> bool {
        if self.peek() == Some(byte) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    fn value(&mut self, depth: usize) -> Option<Node<'a>> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.skip_whitespace();
        match self.peek()? {
            b'{' => self.object(depth),
            b'[' => self.array(depth),
            b'"' => self.string().map(Node::String),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            _ => self.number(),
        }
    }

    fn object(&mut self, depth: usize) -> Option<Node<'a>> {
        self.at += 1; // '{'
        let mut entries = Vec::new();
        self.skip_whitespace();
        if self.eat(b'}') {
            return Some(Node::Object(entries));
        }
        loop {
            self.skip_whitespace();
            if self.peek()? != b'"' {
                return None;
            }
            let key = self.string()?;
            self.skip_whitespace();
            if !self.eat(b':') {
                return None;
            }
            entries.push((key, self.value(depth + 1)?));
            self.skip_whitespace();
            if self.eat(b'}') {
                return Some(Node::Object(entries));
            }
            if !self.eat(b',') {
                return None;
            }
        }
    }

    fn array(&mut self, depth: usize) -> Option<Node<'a>> {
        self.at += 1; // '['
        let mut items = Vec::new();
        self.skip_whitespace();
        if self.eat(b']') {
            return Some(Node::Array(items));
        }
        loop {
            items.push(self.value(depth + 1)?);
            self.skip_whitespace();
            if self.eat(b']') {
                return Some(Node::Array(items));
            }
            if !self.eat(b',') {
                return None;
            }
        }
    }

    /// A string token, decoded by serde_json (escapes, surrogates, UTF-8, control bytes).
    fn string(&mut self) -> Option<String> {
        let start = self.at;
        self.at += 1; // '"'
        loop {
            match self.peek()? {
                b'"' => break,
                b'\\' => self.at += 2,
                _ => self.at += 1,
            }
        }
        self.at += 1; // '"'
        serde_json::from_slice(self.bytes.get(start..self.at)?).ok()
    }

    fn literal(&mut self, word: &'static [u8]) -> Option<Node<'a>> {
        let text = self.bytes.get(self.at..self.at + word.len())?;
        if text != word {
            return None;
        }
        self.at += word.len();
        Some(Node::Verbatim(text))
    }

    /// `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`, kept as written.
    fn number(&mut self) -> Option<Node<'a>> {
        let start = self.at;
        self.eat(b'-');
        match self.peek()? {
            b'0' => self.at += 1,
            b'1'..=b'9' => self.digits(),
            _ => return None,
        }
        if self.eat(b'.') {
            self.at_least_one_digit()?;
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.at += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.at += 1;
            }
            self.at_least_one_digit()?;
        }
        Some(Node::Verbatim(self.bytes.get(start..self.at)?))
    }

    fn digits(&mut self) {
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.at += 1;
        }
    }

    fn at_least_one_digit(&mut self) -> Option<()> {
        let start = self.at;
        self.digits();
        (self.at > start).then_some(())
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::canonical_json;

    fn canon(s: &str) -> Option<String> {
        canonical_json(s.as_bytes()).map(|v| String::from_utf8(v).expect("canonical JSON is UTF-8"))
    }

    #[test]
    fn numbers_keep_their_text() {
        for (a, b) in [
            ("100000000000000000001", "100000000000000000002"),
            ("0.1", "0.10000000000000001"),
            ("1", "1.0"),
            ("1e2", "100"),
            ("-0", "0"),
        ] {
            assert_ne!(canon(a), canon(b), "{a} vs {b}");
            assert_eq!(canon(a).as_deref(), Some(a));
        }
    }

    #[test]
    fn only_meaningless_differences_vanish() {
        assert_eq!(
            canon(" {\"b\" : [ true ,null], \"a\":{\"y\":\"\\u0041\",\"x\":-1.5e-3}} "),
            canon(r#"{"a":{"x":-1.5e-3,"y":"A"},"b":[true,null]}"#)
        );
        assert_eq!(
            canon(r#"{"b":1,"a":2}"#).as_deref(),
            Some(r#"{"a":2,"b":1}"#)
        );
        // Repeated keys keep their order: a handler reading the last one sees a difference.
        assert_ne!(canon(r#"{"a":1,"a":2}"#), canon(r#"{"a":2,"a":1}"#));
    }

    #[test]
    fn invalid_json_is_refused() {
        for bad in [
            "",
            " ",
            "{",
            "}",
            "[1,]",
            "{\"a\":1,}",
            "01",
            "1.",
            ".5",
            "1e",
            "+1",
            "-",
            "tru",
            "nul",
            "\"abc",
            "\"\\x\"",
            "\"\\ud800\"",
            "{\"a\" 1}",
            "[1 2]",
            "1 2",
            "{1:2}",
            "\"\u{1}\"",
            "NaN",
            "Infinity",
        ] {
            assert_eq!(canon(bad), None, "{bad:?}");
        }
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        assert_eq!(canon(&deep), None, "nesting is bounded");
        let fine = format!("{}{}", "[".repeat(100), "]".repeat(100));
        assert_eq!(canon(&fine), Some(fine.clone()));
    }

    proptest! {
        /// Whatever serde_json accepts, the canonical form accepts too and means the same;
        /// whatever it accepts (serde_json also refuses numbers beyond f64, which are valid
        /// JSON), its canonical form is a fixed point.
        #[test]
        fn agrees_with_serde_json(text in "[\\[\\]{}\",:0-9a-z.eE+\\- \\\\]{0,40}") {
            let ours = canon(&text);
            if let Ok(value) = serde_json::from_str::<serde_json::Value>(&text) {
                let c = ours.clone().expect("serde_json accepted it");
                let again: serde_json::Value = serde_json::from_str(&c).expect("canonical parses");
                prop_assert_eq!(again, value);
            }
            if let Some(c) = ours {
                let again = canon(&c);
                prop_assert_eq!(again.as_deref(), Some(c.as_str()));
            }
        }
    }
}
