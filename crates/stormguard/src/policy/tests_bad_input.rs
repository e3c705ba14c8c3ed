//! The bad inputs of issue 12, each refused with the field named and a bounded message.

use std::time::Duration;

use super::*;

fn toml_err(text: &str) -> PolicyError {
    PolicyFile::from_toml(text).expect_err(text)
}

fn json_err(text: &str) -> PolicyError {
    PolicyFile::from_json(text).expect_err(text)
}

fn field_of(error: &PolicyError) -> &str {
    match error {
        PolicyError::Syntax { field, .. } | PolicyError::Invalid { field, .. } => field,
        PolicyError::Read { .. } => "",
    }
}

#[test]
fn unknown_fields_in_a_budget_are_refused_for_every_kind() {
    for budget in [
        r#"{ kind = "aws_standard", max_tokens = 5 }"#,
        r#"{ kind = "aws_standard", retry_ratio = 0.2 }"#,
        r#"{ kind = "aws_standard", ttl = "10s" }"#,
        r#"{ kind = "grpc", max_tokens = 5, token_ratio = 0.1, ttl = "10s" }"#,
        r#"{ kind = "ratio", retry_ratio = 0.2, ttl = "10s", max_tokens = 3 }"#,
        r#"{ kind = "concurrency", budget_percent = 20.0, typo = 1 }"#,
    ] {
        let error = toml_err(&format!("[endpoints.x]\nbudget = {budget}\n"));
        assert!(
            matches!(&error, PolicyError::Syntax { message, .. } if message.contains("unknown field")),
            "{budget}: {error}"
        );
        assert_eq!(field_of(&error), r#"endpoints."x".budget"#, "{error}");
    }
    let error =
        json_err(r#"{"endpoints": {"x": {"budget": {"kind": "aws_standard", "typo": true}}}}"#);
    assert!(error.to_string().contains("unknown field"), "{error}");
    let error = json_err(r#"{"endpoints": {"x": {"typo": true}}}"#);
    assert_eq!(field_of(&error), r#"endpoints."x".typo"#, "{error}");
}

#[test]
fn numbers_above_their_bound_are_refused() {
    let cases = [
        (
            "retry = { max_attempts = 4294967295 }\nbackoff = { base = \"0\", cap = \"0\" }",
            "retry.max_attempts",
        ),
        ("retry = { max_attempts = 11 }", "retry.max_attempts"),
        (
            r#"budget = { kind = "ratio", retry_ratio = 0.2, ttl = "10s", min_retries_per_sec = 4294967295 }"#,
            "budget.min_retries_per_sec",
        ),
        (
            r#"budget = { kind = "concurrency", budget_percent = 20.0, min_retry_concurrency = 4294967295 }"#,
            "budget.min_retry_concurrency",
        ),
        (r#"timeouts = { overall = "2h" }"#, "timeouts.overall"),
        (r#"timeouts = { connect = "61m" }"#, "timeouts.connect"),
        (r#"backoff = { cap = "5h" }"#, "backoff.cap"),
        ("backoff = { multiplier = 1000.0 }", "backoff.multiplier"),
        (r#"breaker = { count = 10, open = "1d" }"#, "breaker.open"),
        (r#"breaker = { count = 10, open = "2h" }"#, "breaker.open"),
        ("breaker = { count = 10, probes = 1000 }", "breaker.probes"),
        ("breaker = { count = 10, growth = 50.0 }", "breaker.growth"),
        (
            r#"breaker = { time = "10s", minimum_throughput = 4294967295 }"#,
            "breaker.minimum_throughput",
        ),
        ("throttle = { k = 1000.0 }", "throttle.k"),
        (
            r#"deadline = { reserve_fixed = "3h" }"#,
            "deadline.reserve_fixed",
        ),
        (
            r#"hedge = { max_attempts = 2, delay = "2h" }"#,
            "hedge.delay",
        ),
    ];
    for (body, field) in cases {
        let error = toml_err(&format!("[endpoints.x]\n{body}\n"));
        assert_eq!(
            field_of(&error),
            format!("endpoints.\"x\".{field}"),
            "{body}: {error}"
        );
    }
}

#[test]
fn a_minimum_call_time_that_no_retry_fits_is_refused() {
    let error = toml_err(
        "[endpoints.x]\ntimeouts = { overall = \"1s\" }\nretry = { min_call = \"10s\" }\n",
    );
    assert_eq!(
        field_of(&error),
        r#"endpoints."x".retry.min_call"#,
        "{error}"
    );
    assert!(
        error.to_string().contains("no retry could ever start"),
        "{error}"
    );
}

#[test]
fn attempts_the_per_try_timeouts_leave_no_room_for_are_named_in_a_warning() {
    let file = PolicyFile::from_toml(
        "[endpoints.x]\ntimeouts = { per_try = \"300ms\", overall = \"1s\" }\nretry = { max_attempts = 5 }\n",
    )
    .expect("legal");
    let warnings = file.warnings();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(warnings[0].field, r#"endpoints."x".retry.max_attempts"#);
    // Attempts 1..=4 start by 900 ms even if each earlier one times out; the fifth would
    // start at 1.2 s.
    assert!(
        warnings[0].message.starts_with("attempts 5..=5 never run"),
        "{}",
        warnings[0]
    );
    let fits = PolicyFile::from_toml(
        "[endpoints.x]\ntimeouts = { per_try = \"300ms\", overall = \"1s\" }\nretry = { max_attempts = 3 }\n",
    )
    .expect("legal");
    assert!(fits.warnings().is_empty());
}

#[test]
fn blank_endpoint_names_are_refused() {
    for text in ["[endpoints.\"\"]\n", "[endpoints.\" \"]\n"] {
        let error = toml_err(text);
        assert!(matches!(error, PolicyError::Invalid { .. }), "{error}");
        assert!(error.to_string().contains("not blank"), "{error}");
    }
    let error = json_err(r#"{"endpoints": {"": {}}}"#);
    assert!(error.to_string().contains("not blank"), "{error}");
}

#[test]
fn empty_toml_and_empty_json_are_both_no_endpoints() {
    for text in ["", " \n\t", "\n"] {
        assert_eq!(PolicyFile::from_toml(text), Ok(PolicyFile::default()));
        assert_eq!(PolicyFile::from_json(text), Ok(PolicyFile::default()));
    }
    assert_eq!(PolicyFile::from_json("{}"), Ok(PolicyFile::default()));
}

#[test]
fn json_errors_name_the_field_and_its_position() {
    let error = json_err("{\"endpoints\": {\"x\": {\"retry\": {\"max_attempts\": 3.5}}}}");
    let PolicyError::Syntax { at, field, message } = &error else {
        panic!("{error:?}")
    };
    assert_eq!(field, r#"endpoints."x".retry.max_attempts"#);
    assert_eq!((at.line, at.column), (1, 50), "{error}");
    assert!(!message.contains("at line"), "{message}");
    assert_eq!(
        error.to_string(),
        r#"line 1, column 50: endpoints."x".retry.max_attempts: invalid type: floating point `3.5`, expected u32"#
    );
}

#[test]
fn a_broken_rule_is_placed_at_its_line_and_column_in_both_formats() {
    let toml = "[endpoints.x]\ntimeouts = { overall = \"1s\" }\nretry = { max_attempts = 0 }\n";
    let error = toml_err(toml);
    let PolicyError::Invalid {
        field,
        at: Some(at),
        ..
    } = &error
    else {
        panic!("{error:?}")
    };
    assert_eq!(field, r#"endpoints."x".retry.max_attempts"#);
    assert_eq!((at.line, at.column), (3, 26), "{error}");
    let json = "{\n  \"endpoints\": {\n    \"x\": {\n      \"retry\": { \"max_attempts\": 0 }\n    }\n  }\n}";
    let error = json_err(json);
    let PolicyError::Invalid { at: Some(at), .. } = &error else {
        panic!("{error:?}")
    };
    assert_eq!((at.line, at.column), (4, 34), "{error}");
    // A rule broken by a default the file did not write is placed at the nearest table.
    let error = toml_err(
        "[endpoints.x]\nhedge = { max_attempts = 2, delay = \"5ms\" }\nretry = { min_call = \"1ms\", max_attempts = 2 }\n",
    );
    assert!(
        matches!(&error, PolicyError::Invalid { at: Some(at), .. } if at.line == 3),
        "{error}"
    );
}

#[test]
fn load_names_the_file_and_picks_the_format_by_extension() {
    let dir = std::env::temp_dir().join(format!("stormguard-load-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let toml = dir.join("p.toml");
    std::fs::write(&toml, "[endpoints.x]\nretry = { max_attempts = 2 }\n").expect("write");
    let file = PolicyFile::load(&toml).expect("loads");
    assert_eq!(
        file.endpoint("x").map(|e| e.retry().max_attempts()),
        Some(2)
    );
    let json = dir.join("p.json");
    std::fs::write(
        &json,
        r#"{"endpoints": {"x": {"retry": {"max_attempts": 0}}}}"#,
    )
    .expect("write");
    let error = PolicyFile::load(&json).expect_err("invalid");
    assert!(
        error
            .to_string()
            .starts_with(&format!("{}:1:", json.display())),
        "{error}"
    );
    let bad = dir.join("p.yaml");
    std::fs::write(&bad, "").expect("write");
    assert!(matches!(
        PolicyFile::load(&bad),
        Err(PolicyError::Read { .. })
    ));
    assert!(matches!(
        PolicyFile::load(dir.join("missing.toml")),
        Err(PolicyError::Read { .. })
    ));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_huge_bad_value_gives_a_small_message() {
    let junk = "9".repeat(10 << 20);
    for text in [
        format!("[endpoints.x]\nbackoff = {{ base = \"{junk}x\" }}\n"),
        format!("[endpoints.x]\nbudget = {{ kind = \"{junk}\" }}\n"),
        format!("[endpoints.\"{junk}\"]\nretry = {{ max_attempts = 0 }}\n"),
    ] {
        let message = toml_err(&text).to_string();
        assert!(message.len() < 1024, "{} bytes", message.len());
    }
    let json = format!(r#"{{"endpoints": {{"x": {{"backoff": {{"base": "{junk}x"}}}}}}}}"#);
    let message = json_err(&json).to_string();
    assert!(message.len() < 1024, "{} bytes", message.len());
}

#[test]
fn policies_built_in_code_meet_the_same_bounds() {
    let error = EndpointPolicy::new(crate::retry::RetryPolicy::new(50))
        .validate()
        .expect_err("too many attempts");
    assert_eq!(field_of(&error), "retry.max_attempts");
    let error = EndpointPolicy::new(
        crate::retry::RetryPolicy::new(2).with_min_call(Duration::from_secs(2)),
    )
    .with_overall_timeout(Duration::from_secs(1))
    .validate()
    .expect_err("min_call above overall");
    assert_eq!(field_of(&error), "retry.min_call");
}

#[test]
fn a_file_read_table_by_table_reads_as_one_document() {
    // A name defined twice is TOML's own error, at the second definition.
    let error = toml_err(
        "[endpoints.x]\nretry = { max_attempts = 2 }\n\n[endpoints.x]\nretry = { max_attempts = 3 }\n",
    );
    assert!(
        matches!(&error, PolicyError::Syntax { at, .. } if at.line == 4),
        "{error}"
    );
    // Tables split across pieces, and an `[endpoints]` table with dotted keys, read as one.
    let file = PolicyFile::from_toml(
        "[endpoints]\n\"a\".retry = { max_attempts = 2 }\n[endpoints.b]\nretry = { max_attempts = 3 }\n[endpoints.b.timeouts]\noverall = \"1s\"\n",
    )
    .expect("valid");
    assert_eq!(
        file.endpoint("a").map(|e| e.retry().max_attempts()),
        Some(2)
    );
    assert_eq!(
        file.endpoint("b").and_then(|e| e.overall_timeout()),
        Some(Duration::from_secs(1))
    );
    // A syntax error keeps its line in the whole document.
    let error = toml_err("[endpoints.a]\n\n[endpoints.b]\nretry = { max_attempts = }\n");
    assert!(
        matches!(&error, PolicyError::Syntax { at, .. } if at.line == 4),
        "{error}"
    );
}

#[test]
fn a_piece_that_means_something_else_alone_is_read_in_the_document() {
    // Each piece of these is valid TOML alone, the whole is not: an inline `endpoints`
    // table is closed, so a later `[endpoints.a]` may not add to it, and a table is defined
    // once. The file is refused as the whole document is: the same text with its headers
    // written `[ endpoints.…]`, which is never cut into pieces.
    for text in [
        "endpoints = {}\n[endpoints.a]\nretry = { max_attempts = 2 }\n",
        "endpoints = { b = {} }\n\n[endpoints.a]\n",
        "[endpoints.a]\n[endpoints]\n[endpoints.c]\n[endpoints]\n",
    ] {
        let error = toml_err(text);
        let whole = toml_err(&text.replace("\n[endpoints.", "\n[ endpoints."));
        let line = |e: &PolicyError| match e {
            PolicyError::Syntax { at, .. } => at.line,
            _ => 0,
        };
        assert!(line(&error) > 1, "{text:?}: {error}");
        assert_eq!(line(&error), line(&whole), "{text:?}: {error} / {whole}");
    }
    // Dotted keys before the first header define `endpoints` legally: read in the document.
    let file = PolicyFile::from_toml("endpoints.b.retry = { max_attempts = 3 }\n[endpoints.a]\n")
        .expect("valid");
    assert_eq!(
        file.endpoint("b").map(|e| e.retry().max_attempts()),
        Some(3)
    );
    assert!(file.endpoint("a").is_some());
}
