//! A parser of server-sent event streams (the WHATWG `text/event-stream` format), fed the
//! bytes of a response as they arrive, in chunks cut anywhere.
//!
//! Only what a policy watch needs: `event`, `data` (several lines joined by `\n`) and `id`
//! fields, comments (`:` lines, the keep-alives) ignored, lines ended by `\n`, `\r\n` or
//! `\r`. The bytes come from the network: a line longer than the limit is an error, not an
//! unbounded buffer, and bytes that are not UTF-8 are an error, not a panic.

/// One event of the stream.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event` field (`message` when absent).
    pub event: Option<String>,
    /// The `data` lines, joined by `\n`.
    pub data: String,
    /// The `id` field.
    pub id: Option<String>,
}

/// Why a stream could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SseError {
    /// A line (or an event's data) is longer than the limit.
    #[error("a server-sent event is longer than {limit} bytes")]
    TooLong {
        /// The limit.
        limit: usize,
    },
    /// A line is not UTF-8.
    #[error("a server-sent event line is not UTF-8")]
    NotUtf8,
}

/// Turns chunks of bytes into events.
#[derive(Debug)]
pub struct SseParser {
    line: Vec<u8>,
    pending: SseEvent,
    has_data: bool,
    /// The last byte was `\r`: a `\n` right after it ends nothing more.
    after_cr: bool,
    limit: usize,
}

impl SseParser {
    /// A parser refusing lines and events longer than `limit` bytes.
    pub fn new(limit: usize) -> SseParser {
        SseParser {
            line: Vec::new(),
            pending: SseEvent::default(),
            has_data: false,
            after_cr: false,
            limit,
        }
    }

    /// Parses `chunk`, returning the events it completes.
    pub fn push(&mut self, chunk: &[u8]) -> Result<Vec<SseEvent>, SseError> {
        let mut events = Vec::new();
        for &byte in chunk {
            let after_cr = std::mem::replace(&mut self.after_cr, byte == b'\r');
            match byte {
                b'\n' if after_cr => {}
                b'\n' | b'\r' => {
                    if let Some(event) = self.end_line()? {
                        events.push(event);
                    }
                }
                _ => {
                    if self.line.len() >= self.limit {
                        return Err(SseError::TooLong { limit: self.limit });
                    }
                    self.line.push(byte);
                }
            }
        }
        Ok(events)
    }

    fn end_line(&mut self) -> Result<Option<SseEvent>, SseError> {
        let line = std::mem::take(&mut self.line);
        if line.is_empty() {
            if !self.has_data {
                self.pending = SseEvent::default();
                return Ok(None);
            }
            self.has_data = false;
            return Ok(Some(std::mem::take(&mut self.pending)));
        }
        let line = std::str::from_utf8(&line).map_err(|_| SseError::NotUtf8)?;
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match field {
            "" => {} // a comment
            "event" => self.pending.event = Some(value.to_owned()),
            "id" => self.pending.id = Some(value.to_owned()),
            "data" => {
                if self.has_data {
                    self.pending.data.push('\n');
                }
                if self.pending.data.len() + value.len() > self.limit {
                    return Err(SseError::TooLong { limit: self.limit });
                }
                self.pending.data.push_str(value);
                self.has_data = true;
            }
            _ => {} // retry and unknown fields
        }
        Ok(None)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn events_are_cut_at_blank_lines_and_comments_skipped() {
        let mut parser = SseParser::new(1024);
        let events = parser
            .push(b": keep-alive\n\nevent: policy\nid: 7\ndata: {\"a\":\ndata: 1}\n\n")
            .unwrap();
        assert_eq!(
            events,
            vec![SseEvent {
                event: Some("policy".into()),
                data: "{\"a\":\n1}".into(),
                id: Some("7".into())
            }]
        );
    }

    #[test]
    fn a_line_over_the_limit_is_an_error() {
        let mut parser = SseParser::new(8);
        assert_eq!(
            parser.push(b"data: 0123456789\n"),
            Err(SseError::TooLong { limit: 8 })
        );
    }

    proptest! {
        #[test]
        fn any_bytes_parse_or_fail_without_panicking(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = SseParser::new(64).push(&bytes);
        }

        #[test]
        fn chunks_cut_anywhere_give_the_same_events(
            datas in proptest::collection::vec("[a-z{}\":0-9 ]{0,20}", 1..5),
            cut in any::<prop::sample::Index>(),
            crlf in any::<bool>(),
        ) {
            let end = if crlf { "\r\n" } else { "\n" };
            let text: String = datas
                .iter()
                .enumerate()
                .map(|(i, d)| format!("id: {i}{end}data: {d}{end}{end}"))
                .collect();
            let whole = SseParser::new(1024).push(text.as_bytes()).unwrap();
            let at = cut.index(text.len() + 1);
            let mut parser = SseParser::new(1024);
            let mut parts = parser.push(&text.as_bytes()[..at]).unwrap();
            parts.extend(parser.push(&text.as_bytes()[at..]).unwrap());
            prop_assert_eq!(&whole, &parts);
            prop_assert_eq!(whole.len(), datas.len());
        }
    }
}
