//! A model test of the default fingerprint over JSON bodies: any two renderings of one JSON
//! document (object keys in any order, any whitespace, any string escaping) are the same
//! request, and changing any single value anywhere in it makes another request.

use http::Request;
use http::request::Parts;
use proptest::prelude::*;
use stormguard_idempotency::{DefaultFingerprinter, Fingerprint, Fingerprinter};

/// A JSON document whose numbers are kept as text (as a client wrote them).
#[derive(Clone, Debug)]
enum J {
    Num(String),
    Str(String),
    Bool(bool),
    Null,
    Arr(Vec<J>),
    /// Keys are distinct.
    Obj(Vec<(String, J)>),
}

fn number() -> impl Strategy<Value = String> {
    prop_oneof![
        "-?(0|[1-9][0-9]{0,25})",
        "-?(0|[1-9][0-9]{0,5})\\.[0-9]{1,20}",
        "-?[1-9]\\.[0-9]{1,5}[eE][+-]?[0-9]{1,3}",
    ]
}

fn json() -> impl Strategy<Value = J> {
    let leaf = prop_oneof![
        number().prop_map(J::Num),
        "[ -~é€]{0,8}".prop_map(J::Str),
        any::<bool>().prop_map(J::Bool),
        Just(J::Null),
    ];
    leaf.prop_recursive(4, 40, 5, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..5).prop_map(J::Arr),
            proptest::collection::btree_map("[a-z]{1,6}", inner, 0..5)
                .prop_map(|m| J::Obj(m.into_iter().collect())),
        ]
    })
}

/// Writes `j` with object entries rotated by `seed`, whitespace from `seed`, and every other
/// string character escaped as `\uXXXX` when `seed` is odd.
fn render(j: &J, seed: u64, out: &mut String) {
    let ws = |n: u64| [" ", "", "\n  ", "\t", ""][(n % 5) as usize];
    match j {
        J::Num(n) => out.push_str(n),
        J::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        J::Null => out.push_str("null"),
        J::Str(s) => write_string(s, seed % 2 == 1, out),
        J::Arr(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(ws(seed + i as u64));
                render(item, seed.wrapping_mul(31).wrapping_add(i as u64), out);
            }
            out.push(']');
        }
        J::Obj(entries) => {
            out.push('{');
            let n = entries.len().max(1);
            for i in 0..entries.len() {
                let (k, v) = &entries[(i + seed as usize) % n];
                if i > 0 {
                    out.push(',');
                }
                out.push_str(ws(seed + i as u64));
                write_string(k, seed % 3 == 0, out);
                out.push_str(ws(seed + 1));
                out.push(':');
                render(v, seed.wrapping_mul(17).wrapping_add(i as u64), out);
            }
            out.push('}');
        }
    }
}

fn write_string(s: &str, escape_all: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if escape_all && (c as u32) < 0x10000 => {
                out.push_str(&format!("\\u{:04x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Every place a value can change: returns `j` with the `n`-th leaf (in some fixed walk)
/// changed, or `None` when there are fewer leaves.
fn mutate(j: &J, n: &mut usize) -> Option<J> {
    let changed = |j: &J| match j {
        J::Num(s) => J::Num(if s.ends_with('9') {
            format!("{}8", &s[..s.len() - 1])
        } else {
            let last = s.chars().last().unwrap_or('0');
            let bumped =
                char::from_digit(last.to_digit(10).map_or(1, |d| d + 1), 10).unwrap_or('1');
            format!("{}{bumped}", &s[..s.len() - last.len_utf8()])
        }),
        J::Str(s) => J::Str(format!("{s}x")),
        J::Bool(b) => J::Bool(!b),
        J::Null => J::Num("0".into()),
        J::Arr(items) => J::Arr(items.iter().cloned().chain([J::Null]).collect()),
        J::Obj(entries) => J::Obj(
            entries
                .iter()
                .skip(1)
                .cloned()
                .collect::<Vec<_>>()
                .into_iter()
                .chain(if entries.is_empty() {
                    vec![("added".to_owned(), J::Null)]
                } else {
                    vec![]
                })
                .collect(),
        ),
    };
    if *n == 0 {
        return Some(changed(j));
    }
    *n -= 1;
    match j {
        J::Arr(items) => {
            for (i, item) in items.iter().enumerate() {
                if let Some(m) = mutate(item, n) {
                    let mut items = items.clone();
                    items[i] = m;
                    return Some(J::Arr(items));
                }
            }
            None
        }
        J::Obj(entries) => {
            for (i, (k, v)) in entries.iter().enumerate() {
                if let Some(m) = mutate(v, n) {
                    let mut entries = entries.clone();
                    entries[i] = (k.clone(), m);
                    return Some(J::Obj(entries));
                }
            }
            None
        }
        _ => None,
    }
}

fn parts() -> Parts {
    Request::post("/pay")
        .header("content-type", "application/json")
        .body(())
        .unwrap_or_default()
        .into_parts()
        .0
}

fn fingerprint(text: &str) -> Fingerprint {
    DefaultFingerprinter::new().fingerprint(&parts(), text.as_bytes())
}

fn rendered(j: &J, seed: u64) -> String {
    let mut out = String::new();
    render(j, seed, &mut out);
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn renderings_of_one_document_are_one_request(j in json(), a in any::<u64>(), b in any::<u64>()) {
        let (x, y) = (rendered(&j, a), rendered(&j, b));
        prop_assert_eq!(fingerprint(&x), fingerprint(&y), "{} vs {}", x, y);
    }

    #[test]
    fn any_changed_value_is_another_request(j in json(), which in 0usize..64, seed in any::<u64>()) {
        let mut n = which;
        if let Some(changed) = mutate(&j, &mut n) {
            let (x, y) = (rendered(&j, seed), rendered(&changed, seed));
            prop_assert_ne!(fingerprint(&x), fingerprint(&y), "{} vs {}", x, y);
        }
    }
}
