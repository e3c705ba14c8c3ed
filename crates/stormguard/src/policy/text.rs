//! Reading a policy from text: TOML or JSON, with every error placed at a line and column
//! and named by its field path.
//!
//! Both formats go through `serde_path_to_error`, so a wrong type deep in a JSON file names
//! its field (`endpoints."GET /a".retry.max_attempts`) as a TOML one does, not only a byte
//! position. A rule broken by a value (checked after parsing) is placed by walking the text's
//! tree to that field, or to the nearest enclosing table the text writes when the field was
//! left to its default; this second walk happens only on error.

use std::path::Path;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::error::bounded;
use super::file::RawFile;
use super::limits::MAX_FILE_BYTES;
use super::{FieldPath, Location, PolicyError, PolicyFile};
use crate::duration::{MAX_QUOTED, cut};

/// The two formats a policy is written in.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Format {
    Toml,
    Json,
}

pub(super) fn load(path: &Path) -> Result<PolicyFile, PolicyError> {
    let read = |message: String| PolicyError::Read {
        file: path.to_owned(),
        message: bounded(&message),
    };
    let format = match path.extension().and_then(|e| e.to_str()) {
        Some(e) if e.eq_ignore_ascii_case("toml") => Format::Toml,
        Some(e) if e.eq_ignore_ascii_case("json") => Format::Json,
        _ => {
            return Err(read(
                "a policy file's name ends in .toml or .json (that is how its format is known)"
                    .to_owned(),
            ));
        }
    };
    let size = std::fs::metadata(path)
        .map_err(|e| read(e.to_string()))?
        .len();
    if size > MAX_FILE_BYTES {
        return Err(read(format!(
            "{size} bytes is larger than the {MAX_FILE_BYTES}-byte maximum of a policy file"
        )));
    }
    let bytes = std::fs::read(path).map_err(|e| read(e.to_string()))?;
    let text = String::from_utf8(bytes).map_err(|e| read(format!("not UTF-8: {e}")))?;
    parse(&text, format, Some(path))
}

pub(super) fn parse(
    text: &str,
    format: Format,
    file: Option<&Path>,
) -> Result<PolicyFile, PolicyError> {
    let located = |e: PolicyError| match file {
        Some(file) => e.in_file(file),
        None => e,
    };
    // An empty file is an empty policy in both formats (TOML reads it so already).
    if text.trim().is_empty() {
        return Ok(PolicyFile::default());
    }
    let raw = match format {
        Format::Toml => toml_raw(text),
        Format::Json => json_raw(text),
    }
    .map_err(located)?;
    raw.into_file().map_err(|(name, error)| {
        let PolicyError::Invalid { field, rule, .. } = error else {
            return located(error);
        };
        let prefix = FieldPath::endpoint(&name).to_string();
        let rest = field
            .strip_prefix(&prefix)
            .unwrap_or_default()
            .split('.')
            .filter(|s| !s.is_empty())
            .flat_map(Key::parse);
        let keys: Vec<Key<'_>> = [Key::Name("endpoints"), Key::Name(name.as_str())]
            .into_iter()
            .chain(rest)
            .collect();
        let offset = match format {
            Format::Toml => toml_offset(text, &keys),
            Format::Json => json_offset(text, &keys),
        };
        located(PolicyError::Invalid {
            field,
            rule,
            at: Some(Location::of(text, offset)),
        })
    })
}

/// Parses TOML one endpoint table at a time when the text allows, else as one document.
///
/// The TOML parser holds every token of a document at once, about forty times the text's
/// size; a policy file is a list of `[endpoints."…"]` tables, so it is parsed table by
/// table, which keeps the peak near the size of the policies themselves. A piece is read
/// alone only when it means the same alone as in the document ([`stands_alone`]); any other
/// piece, one that does not parse alone, or a name defined twice, sends the whole text
/// through the one-document parse, so what is accepted, and every error (and its line), is
/// exactly that of the whole document. A text of one piece goes there directly.
fn toml_raw(text: &str) -> Result<RawFile, PolicyError> {
    let pieces = toml_pieces(text);
    if pieces.len() == 1 {
        return toml_document(text);
    }
    let mut merged = RawFile::default();
    for piece in pieces {
        let parsed = toml::de::DeTable::parse(piece)
            .ok()
            .filter(|root| stands_alone(piece, root.get_ref()))
            .and_then(|root| RawFile::deserialize(toml::Deserializer::from(root)).ok());
        if !parsed.is_some_and(|raw| merged.merge(raw)) {
            return toml_document(text);
        }
    }
    Ok(merged)
}

/// Whether `piece` (parsed as `root`) touches nothing outside its own endpoint: it writes no
/// table header but its first line, and that line opens an `[endpoints.…]` table, or else it
/// holds no key at all (the comments before the first table). Otherwise its meaning depends
/// on the rest of the document: `endpoints = {}` before `[endpoints.a]` is TOML's error (an
/// inline table is closed), as is an `[endpoints]` header in two pieces, yet each piece
/// alone is valid.
fn stands_alone(piece: &str, root: &toml::de::DeTable<'_>) -> bool {
    let mut lines = piece.lines();
    let opens_endpoint = lines
        .next()
        .is_some_and(|first| first.trim_start().starts_with("[endpoints."));
    (opens_endpoint || root.is_empty()) && lines.all(|line| !line.trim_start().starts_with('['))
}

/// `text` cut before each line that opens an `[endpoints.…]` table.
fn toml_pieces(text: &str) -> Vec<&str> {
    let mut starts = vec![0];
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        if offset > 0 && line.trim_start().starts_with("[endpoints.") {
            starts.push(offset);
        }
        offset += line.len();
    }
    starts.push(text.len());
    starts.windows(2).map(|w| &text[w[0]..w[1]]).collect()
}

fn toml_document(text: &str) -> Result<RawFile, PolicyError> {
    deserialize(text, Format::Toml, path)
}

fn json_raw(text: &str) -> Result<RawFile, PolicyError> {
    deserialize(text, Format::Json, path)
}

/// `text` in `format` read as `T`: a syntax or shape error is placed at its line and column,
/// named by `field` (the failing serde path, rendered in the caller's notation) and its
/// message bounded. The policy files and the rule files both read this way.
pub(crate) fn deserialize<T: serde::de::DeserializeOwned>(
    text: &str,
    format: Format,
    field: fn(&serde_path_to_error::Path) -> String,
) -> Result<T, PolicyError> {
    match format {
        Format::Toml => {
            let error = |field: String, e: toml::de::Error| PolicyError::Syntax {
                at: Location::of(text, e.span().map_or(0, |s| s.start)),
                field,
                message: bounded(e.message().trim_end()),
            };
            let root = toml::de::DeTable::parse(text).map_err(|e| error(String::new(), e))?;
            serde_path_to_error::deserialize(toml::Deserializer::from(root)).map_err(|e| {
                let at = field(e.path());
                error(at, e.into_inner())
            })
        }
        Format::Json => {
            let error = |field: String, e: serde_json::Error| {
                let message = e.to_string();
                let suffix = format!(" at line {} column {}", e.line(), e.column());
                PolicyError::Syntax {
                    at: Location {
                        file: None,
                        line: e.line(),
                        column: e.column(),
                    },
                    field,
                    message: bounded(message.strip_suffix(&suffix).unwrap_or(&message)),
                }
            };
            let mut de = serde_json::Deserializer::from_str(text);
            let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
                let at = field(e.path());
                error(at, e.into_inner())
            })?;
            de.end().map_err(|e| error(String::new(), e))?;
            Ok(value)
        }
    }
}

/// A serde path in the policy's own notation: the endpoint's name quoted and cut, as
/// [`FieldPath`] writes it.
fn path(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut out = String::new();
    for (depth, segment) in path.iter().enumerate() {
        match segment {
            Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            Segment::Map { key } | Segment::Enum { variant: key } => {
                if !out.is_empty() {
                    out.push('.');
                }
                if depth == 1 {
                    out.push_str(&format!("{:?}", cut(key, MAX_QUOTED)));
                } else {
                    out.push_str(&cut(key, MAX_QUOTED));
                }
            }
            Segment::Unknown => out.push_str(".?"),
        }
    }
    out
}

/// One step of a field path: a table's key, or a list's element (`windows[0]`).
#[derive(Clone, Copy)]
pub(crate) enum Key<'a> {
    Name(&'a str),
    Index(usize),
}

impl<'a> Key<'a> {
    /// The steps of one dotted segment: `windows[0]` is `windows`, then element 0.
    fn parse(segment: &'a str) -> Vec<Key<'a>> {
        match segment.split_once('[') {
            Some((name, rest)) => {
                let index = rest.strip_suffix(']').and_then(|i| i.parse().ok());
                let mut keys = vec![Key::Name(name)];
                keys.extend(index.map(Key::Index));
                keys
            }
            None => vec![Key::Name(segment)],
        }
    }
}

/// The byte offset of the deepest of `keys` the TOML text writes.
pub(crate) fn toml_offset(text: &str, keys: &[Key<'_>]) -> usize {
    let Ok(root) = toml::de::DeTable::parse(text) else {
        return 0;
    };
    let mut offset = root.span().start;
    let root = toml::de::DeValue::Table(root.into_inner());
    let mut value = &root;
    for key in keys {
        let next = match *key {
            Key::Name(name) => value.get(name),
            Key::Index(index) => value.get(index),
        };
        let Some(next) = next else { break };
        offset = next.span().start;
        value = next.get_ref();
    }
    offset
}

/// The byte offset of the deepest of `keys` the JSON text writes.
pub(crate) fn json_offset(text: &str, keys: &[Key<'_>]) -> usize {
    let mut offset = 0;
    let mut current = text;
    for key in keys {
        let next = match *key {
            Key::Name(name) => {
                serde_json::from_str::<std::collections::BTreeMap<String, &RawValue>>(current)
                    .ok()
                    .and_then(|object| object.get(name).copied())
            }
            Key::Index(index) => serde_json::from_str::<Vec<&RawValue>>(current)
                .ok()
                .and_then(|list| list.get(index).copied()),
        };
        let Some(next) = next else { break };
        current = next.get();
        offset = current.as_ptr() as usize - text.as_ptr() as usize;
    }
    offset
}
