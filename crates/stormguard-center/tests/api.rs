//! The center's API against a real server on 127.0.0.1 with SQLite (and PostgreSQL where a
//! test says so): versions, compare-and-set, rollback, auth, bodies, polls, audit.
#![allow(clippy::unwrap_used)]

mod support;

use serde_json::json;
use stormguard_center::CenterConfig;
use support::{TestCenter, attempts};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_are_numbered_hashed_diffed_and_kept() {
    let center = TestCenter::sqlite().await;
    let editor = center.api(&center.editor);
    let (status, first) = editor.publish("pay", 0, &attempts(3)).await;
    assert_eq!(status, 201, "{first}");
    assert_eq!(first["version"], 1);
    assert_eq!(first["author"], "alice");
    let (status, second) = editor.publish("pay", 1, &attempts(1)).await;
    assert_eq!(status, 201, "{second}");
    assert_eq!(second["version"], 2);
    assert_ne!(first["hash"], second["hash"]);
    assert_eq!(
        second["diff"],
        json!([{ "path": "endpoints.\"default\".retry.max_attempts", "old": "3", "new": "1" }])
    );
    let (status, history) = center
        .api(&center.viewer)
        .get("/v1/services/pay/versions")
        .await;
    assert_eq!(status, 200);
    assert_eq!(history.as_array().map(Vec::len), Some(2));
    assert_eq!(history[0]["version"], 2);
    let (status, one) = center
        .api(&center.viewer)
        .get("/v1/services/pay/versions/1")
        .await;
    assert_eq!((status, &one["hash"]), (200, &first["hash"]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_on_an_old_base_is_a_conflict() {
    let center = TestCenter::sqlite().await;
    let editor = center.api(&center.editor);
    assert_eq!(editor.publish("pay", 0, &attempts(3)).await.0, 201);
    let (status, body) = editor.publish("pay", 0, &attempts(2)).await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap_or_default()
            .contains("latest version is 1")
    );
    assert_eq!(editor.publish("pay", 5, &attempts(2)).await.0, 409);
}

async fn exactly_one_of_concurrent_publishes_wins(center: &TestCenter) {
    let editor = center.api(&center.editor);
    assert_eq!(editor.publish("race", 0, &attempts(3)).await.0, 201);
    for round in 1..=5u64 {
        let publishes = (0..8).map(|i| {
            let api = center.api(&center.editor);
            async move { api.publish("race", round, &attempts(1 + (i % 5))).await.0 }
        });
        let statuses = futures_util::future::join_all(publishes).await;
        let won = statuses.iter().filter(|s| **s == 201).count();
        let lost = statuses.iter().filter(|s| **s == 409).count();
        assert_eq!((won, lost), (1, 7), "round {round}: {statuses:?}");
    }
    let (_, history) = center
        .api(&center.viewer)
        .get("/v1/services/race/versions")
        .await;
    let numbers: Vec<_> = history
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["version"].as_u64().unwrap())
        .collect();
    assert_eq!(numbers, vec![6, 5, 4, 3, 2, 1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_concurrent_publishes_on_one_base_exactly_one_wins_on_sqlite() {
    exactly_one_of_concurrent_publishes_wins(&TestCenter::sqlite().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_concurrent_publishes_on_one_base_exactly_one_wins_on_postgres() {
    let Some(url) = support::postgres_url("concurrent publishes") else {
        return;
    };
    let url = support::postgres_schema(&url).await;
    exactly_one_of_concurrent_publishes_wins(&TestCenter::on(&url, None).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_policy_is_refused_with_the_field_named() {
    let center = TestCenter::sqlite().await;
    let (status, body) = center
        .api(&center.editor)
        .publish(
            "pay",
            0,
            "[endpoints.default]\nretry = { max_attempts = 0 }\n",
        )
        .await;
    assert_eq!(status, 422, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("max_attempts"),
        "{body}"
    );
    assert_eq!(
        center
            .api(&center.viewer)
            .get("/v1/services/pay/versions")
            .await
            .1,
        json!([])
    );
}

/// A POST declared idempotent and retried without a key is a lint error (`policy lint`'s
/// SG006): the center refuses to publish it by default, naming the rule and the field; a
/// center configured not to block on lint publishes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_with_a_lint_error_is_refused_unless_lint_does_not_block() {
    let risky =
        "[endpoints.\"POST /pay\"]\nidempotency = \"idempotent\"\nretry = { max_attempts = 3 }\n";
    let center = TestCenter::sqlite().await;
    let (status, body) = center.api(&center.editor).publish("pay", 0, risky).await;
    assert_eq!(status, 422, "{body}");
    let error = body["error"].as_str().unwrap();
    assert!(error.contains("lint: error SG"), "{body}");
    assert!(error.contains(r#"endpoints."POST /pay""#), "{body}");
    let config = CenterConfig {
        lint_blocks: None,
        ..CenterConfig::default()
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("lenient.db").display());
    let lenient = TestCenter::with_config(&url, None, config).await;
    let (status, body) = lenient.api(&lenient.editor).publish("pay", 0, risky).await;
    assert_eq!(status, 201, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_republishes_an_old_version_as_a_new_one() {
    let center = TestCenter::sqlite().await;
    let editor = center.api(&center.editor);
    let (_, first) = editor.publish("pay", 0, &attempts(3)).await;
    editor.publish("pay", 1, &attempts(1)).await;
    let (status, third) = editor
        .post("/v1/services/pay/rollback", json!({ "base": 2, "to": 1 }))
        .await;
    assert_eq!(status, 201, "{third}");
    assert_eq!(third["version"], 3);
    assert_eq!(third["rollback_of"], 1);
    assert_eq!(third["hash"], first["hash"]);
    assert_eq!(
        editor
            .post("/v1/services/pay/rollback", json!({ "base": 3, "to": 9 }))
            .await
            .0,
        404
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_needs_a_token_and_the_right_role() {
    let center = TestCenter::sqlite().await;
    center
        .api(&center.editor)
        .publish("a", 0, &attempts(3))
        .await;
    let routes = [
        ("GET", "/metrics"),
        ("GET", "/v1/audit"),
        ("POST", "/v1/tokens"),
        ("GET", "/v1/services/a/versions"),
        ("POST", "/v1/services/a/versions"),
        ("GET", "/v1/services/a/versions/1"),
        ("POST", "/v1/services/a/rollback"),
        ("POST", "/v1/services/a/canary/promote"),
        ("POST", "/v1/services/a/canary/abort"),
        ("GET", "/v1/services/a/status"),
        ("GET", "/v1/services/a/policy?instance=i"),
        ("GET", "/v1/services/a/watch?instance=i"),
        ("POST", "/v1/services/a/acks"),
    ];
    for (method, path) in routes {
        let (status, _) = center
            .anonymous()
            .send(method, path, Some(b"{}".to_vec()))
            .await;
        assert_eq!(status, 401, "{method} {path} without a token");
        let (status, _) = center
            .api("sg_not-a-token")
            .send(method, path, Some(b"{}".to_vec()))
            .await;
        assert_eq!(status, 401, "{method} {path} with an unknown token");
    }
    let viewer = center.api(&center.viewer);
    assert_eq!(viewer.publish("a", 1, &attempts(2)).await.0, 403);
    assert_eq!(
        viewer
            .post("/v1/services/a/rollback", json!({"base": 1, "to": 1}))
            .await
            .0,
        403
    );
    assert_eq!(
        viewer
            .post("/v1/tokens", json!({"name": "x", "role": "admin"}))
            .await
            .0,
        403
    );
    assert_eq!(viewer.get("/v1/services/a/watch?instance=i").await.0, 403);
    let editor = center.api(&center.editor);
    assert_eq!(
        editor
            .post("/v1/tokens", json!({"name": "x", "role": "admin"}))
            .await
            .0,
        403
    );
    let instance_a = center.api(&center.instance_token("a").await);
    assert_eq!(instance_a.publish("a", 1, &attempts(2)).await.0, 403);
    assert_eq!(instance_a.get("/v1/audit").await.0, 403);
    assert_eq!(
        instance_a.get("/v1/services/a/policy?instance=i").await.0,
        200
    );
    let admin = center.api(&center.admin);
    let (status, made) = admin
        .post("/v1/tokens", json!({"name": "ci", "role": "editor"}))
        .await;
    assert_eq!(status, 201, "{made}");
    let made = center.api(made["token"].as_str().unwrap());
    assert_eq!(made.publish("a", 1, &attempts(2)).await.0, 201);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_token_of_one_service_cannot_read_or_ack_another() {
    let center = TestCenter::sqlite().await;
    let editor = center.api(&center.editor);
    editor.publish("a", 0, &attempts(3)).await;
    editor.publish("b", 0, &attempts(3)).await;
    let instance_a = center.api(&center.instance_token("a").await);
    for path in [
        "/v1/services/b/policy?instance=i",
        "/v1/services/b/watch?instance=i",
        "/v1/services/b/versions",
        "/v1/services/b/status",
        "/v1/audit?service=b",
    ] {
        assert_eq!(instance_a.get(path).await.0, 403, "{path}");
    }
    let ack = json!({ "instance": "i", "version": 1, "applied": true });
    assert_eq!(
        instance_a.post("/v1/services/b/acks", ack.clone()).await.0,
        403
    );
    assert_eq!(instance_a.post("/v1/services/a/acks", ack).await.0, 204);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_huge_bodies_are_refused_without_harm() {
    let center = TestCenter::sqlite().await;
    let editor = center.api(&center.editor);
    let path = "/v1/services/pay/versions";
    for body in [
        b"".to_vec(),
        b"{".to_vec(),
        b"[1,2,3]".to_vec(),
        b"{\"base\": -1, \"policy\": \"\"}".to_vec(),
        b"{\"base\": 0, \"policy\": 7}".to_vec(),
        b"{\"base\": 0, \"policy\": \"\", \"surprise\": 1}".to_vec(),
        vec![0xff, 0xfe, 0x00],
    ] {
        let (status, _) = editor.send("POST", path, Some(body.clone())).await;
        assert!((400..500).contains(&status), "{status} for {body:?}");
    }
    let huge = format!(
        "{{\"base\": 0, \"policy\": \"{}\"}}",
        "#".repeat(10 * 1024 * 1024)
    );
    // The center answers 413 past its body limit, without reading the rest, and closes:
    // the client either reads that answer or has its write cut (a broken pipe or a reset)
    // when the close comes first. Either way the body was refused; the center serving on
    // afterwards (below) is the "without harm".
    match editor.try_send("POST", path, Some(huge.into_bytes())).await {
        Ok((status, _)) => assert_eq!(status, 413),
        Err(e) => assert!(write_cut_by_the_server(&e), "{e:?}"),
    }
    let bad_service = editor.publish("no/such", 0, &attempts(1)).await.0;
    assert!((400..500).contains(&bad_service));
    let bad_name = editor.publish("a%20b", 0, &attempts(1)).await.0;
    assert_eq!(bad_name, 400);
    // The center still serves.
    assert_eq!(editor.publish("pay", 0, &attempts(3)).await.0, 201);
}

/// Whether `e` is a request body write cut by the server closing the connection.
fn write_cut_by_the_server(e: &reqwest::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            return matches!(
                io.kind(),
                std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
            );
        }
        source = err.source();
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_poll_answers_304_while_the_version_is_unchanged() {
    let center = TestCenter::sqlite().await;
    center
        .api(&center.editor)
        .publish("pay", 0, &attempts(3))
        .await;
    let token = center.instance_token("pay").await;
    let client = reqwest::Client::new();
    let url = format!("{}/v1/services/pay/policy?instance=i-1", center.url());
    let first = client.get(&url).bearer_auth(&token).send().await.unwrap();
    assert_eq!(first.status(), 200);
    assert_eq!(first.headers()["etag"], "\"1\"");
    let again = client
        .get(&url)
        .bearer_auth(&token)
        .header("if-none-match", "\"1\"")
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 304);
    center
        .api(&center.editor)
        .publish("pay", 1, &attempts(2))
        .await;
    let changed = client
        .get(&url)
        .bearer_auth(&token)
        .header("if-none-match", "\"1\"")
        .send()
        .await
        .unwrap();
    assert_eq!(changed.status(), 200);
    assert_eq!(changed.headers()["etag"], "\"2\"");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishes_rollbacks_acks_and_nacks_are_audited() {
    let center = TestCenter::sqlite().await;
    let editor = center.api(&center.editor);
    editor.publish("pay", 0, &attempts(3)).await;
    editor
        .post("/v1/services/pay/rollback", json!({"base": 1, "to": 1}))
        .await;
    let instance = center.api(&center.instance_token("pay").await);
    instance
        .post(
            "/v1/services/pay/acks",
            json!({"instance": "i-1", "version": 2, "applied": true}),
        )
        .await;
    let (status, _) = instance
        .post(
            "/v1/services/pay/acks",
            json!({"instance": "i-2", "version": 2, "applied": false}),
        )
        .await;
    assert_eq!(status, 400, "a NACK needs its reason");
    instance
        .post(
            "/v1/services/pay/acks",
            json!({"instance": "i-2", "version": 2, "applied": false, "reason": "no route"}),
        )
        .await;
    let (status, audit) = center
        .api(&center.viewer)
        .get("/v1/audit?service=pay")
        .await;
    assert_eq!(status, 200);
    let actions: Vec<_> = audit
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["action"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(actions, ["nack", "ack", "rollback", "publish"]);
    assert_eq!(audit[0]["detail"], "no route");
    assert_eq!(audit[0]["instance"], "i-2");
    let (_, status) = center
        .api(&center.viewer)
        .get("/v1/services/pay/status")
        .await;
    let i2 = &status["instances"][1];
    assert_eq!(
        (&i2["instance"], &i2["applied"], &i2["reason"]),
        (&json!("i-2"), &json!(false), &json!("no route"))
    );
}

/// 200 instances acknowledge at once (one group commit or a few): every ACK answers 204 and
/// the status lists every instance on the version.
async fn concurrent_acks_all_land(center: &TestCenter) {
    center
        .api(&center.editor)
        .publish("fleet", 0, &attempts(2))
        .await;
    let instance = center.api(&center.instance_token("fleet").await);
    let acks = (0..200).map(|i| {
        let instance = &instance;
        async move {
            instance
                .post(
                    "/v1/services/fleet/acks",
                    json!({"instance": format!("i-{i:03}"), "version": 1, "applied": true}),
                )
                .await
                .0
        }
    });
    let statuses = futures_util::future::join_all(acks).await;
    assert!(statuses.iter().all(|s| *s == 204), "{statuses:?}");
    let (_, status) = center
        .api(&center.viewer)
        .get("/v1/services/fleet/status")
        .await;
    let instances = status["instances"].as_array().expect("instances");
    assert_eq!(instances.len(), 200);
    assert!(
        instances
            .iter()
            .all(|i| i["version"] == json!(1) && i["applied"] == json!(true))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_acks_all_land_on_sqlite() {
    concurrent_acks_all_land(&TestCenter::sqlite().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_acks_all_land_on_postgres() {
    let Some(url) = support::postgres_url("concurrent acks") else {
        return;
    };
    let url = support::postgres_schema(&url).await;
    concurrent_acks_all_land(&TestCenter::on(&url, None).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nack_reason_with_a_nul_character_is_refused() {
    let center = TestCenter::sqlite().await;
    center
        .api(&center.editor)
        .publish("pay", 0, &attempts(2))
        .await;
    let instance = center.api(&center.instance_token("pay").await);
    let (status, body) = instance
        .post(
            "/v1/services/pay/acks",
            json!({"instance": "i-1", "version": 1, "applied": false, "reason": "bad\u{0}byte"}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
}
