//! Findings as SARIF 2.1.0, the format code-scanning services read to annotate a pull
//! request.
//!
//! Written with serde_json values of our own rather than a SARIF crate: the log needs a dozen
//! fields, and a test validates every log against the official 2.1.0 schema (vendored under
//! `tests/fixtures/`). Each rule is listed once in the driver with its id, name and
//! description; each finding is a result with its rule, level, message and a physical
//! location (the file's path as given, relative paths kept relative so the service resolves
//! them against the repository, and the line and column of the field) plus the field path as
//! a logical location.

use serde_json::{Value, json};
use stormguard::lint::{Finding, Rule, Severity};

use crate::run::Failure;

/// The SARIF 2.1.0 schema's address, written in every log.
const SCHEMA: &str = "https://json.schemastore.org/sarif-2.1.0.json";

pub(super) fn render(findings: &[Finding]) -> Result<String, Failure> {
    let rules: Vec<Value> = Rule::ALL
        .iter()
        .map(|rule| {
            json!({
                "id": rule.id(),
                "name": rule.name(),
                "shortDescription": { "text": rule.description() },
                "defaultConfiguration": { "level": level(rule.severity()) },
            })
        })
        .collect();
    let results: Vec<Value> = findings.iter().map(result).collect();
    let log = json!({
        "$schema": SCHEMA,
        "version": "2.1.0",
        "runs": [{
            "tool": { "driver": {
                "name": "stormguard",
                "version": env!("CARGO_PKG_VERSION"),
                "informationUri": env!("CARGO_PKG_REPOSITORY"),
                "rules": rules,
            }},
            "results": results,
        }],
    });
    serde_json::to_string_pretty(&log)
        .map(|s| s + "\n")
        .map_err(|e| Failure::Io(format!("JSON encoding failed: {e}")))
}

fn level(severity: Severity) -> &'static str {
    match severity {
        Severity::Error => "error",
        Severity::Warning => "warning",
        Severity::Note => "note",
    }
}

fn result(finding: &Finding) -> Value {
    let index = Rule::ALL
        .iter()
        .position(|r| *r == finding.rule)
        .unwrap_or(0);
    let mut location = json!({
        "logicalLocations": [{ "fullyQualifiedName": finding.field, "kind": "member" }],
    });
    if let Some(file) = &finding.file {
        let mut physical = json!({
            "artifactLocation": { "uri": uri(&file.display().to_string()) },
        });
        if let (Some(line), Some(column)) = (finding.line, finding.column) {
            physical["region"] = json!({ "startLine": line, "startColumn": column });
        }
        location["physicalLocation"] = physical;
    }
    json!({
        "ruleId": finding.rule.id(),
        "ruleIndex": index,
        "level": level(finding.severity),
        "message": { "text": format!("{}: {}", finding.field, finding.message) },
        "locations": [location],
    })
}

/// A path as a URI reference: `/` separators, spaces and other reserved bytes escaped; an
/// absolute path as a `file://` URI.
fn uri(path: &str) -> String {
    let mut out = String::with_capacity(path.len() + 7);
    if path.starts_with('/') {
        out.push_str("file://");
    }
    for byte in path.replace('\\', "/").bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'/' => {
                out.push(char::from(byte));
            }
            other => out.push_str(&format!("%{other:02X}")),
        }
    }
    out
}
