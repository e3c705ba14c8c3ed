//! The OpenAPI document (`openapi.json`, served at `GET /openapi.json`) against a running
//! center: every answer of a tour through the API — successes, refusals, errors — has a
//! status the document lists for its operation, and a body that validates against the
//! schema the document gives for it (JSON Schema 2020-12, OpenAPI 3.1's dialect). That the
//! document lists exactly the router's routes is a unit test of the crate (`api`).
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use serde_json::{Value, json};
use stormguard_tower::client::center::SseParser;
use support::{TestCenter, attempts};

/// One answer: status, content type, body.
struct Answer {
    status: u16,
    content_type: String,
    body: Vec<u8>,
}

struct Tour {
    base: String,
    client: reqwest::Client,
    document: Value,
    checked: usize,
}

impl Tour {
    async fn send(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&str>,
        headers: &[(&str, &str)],
    ) -> Answer {
        let mut request = self
            .client
            .request(method.parse().unwrap(), format!("{}{path}", self.base))
            .timeout(Duration::from_secs(30));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body.to_owned());
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = request.send().await.unwrap();
        Answer {
            status: response.status().as_u16(),
            content_type: response
                .headers()
                .get("content-type")
                .map(|v| v.to_str().unwrap().to_owned())
                .unwrap_or_default(),
            body: response.bytes().await.unwrap().to_vec(),
        }
    }

    /// Follows a `$ref` within the document.
    fn resolve<'a>(&'a self, value: &'a Value) -> &'a Value {
        match value.get("$ref").and_then(Value::as_str) {
            Some(pointer) => self
                .document
                .pointer(pointer.trim_start_matches('#'))
                .unwrap_or_else(|| panic!("dangling $ref {pointer}")),
            None => value,
        }
    }

    /// Validates `instance` against `schema`, whose `$ref`s point into the document.
    fn validate(&self, what: &str, schema: &Value, instance: &Value) {
        let root = json!({ "components": self.document["components"], "allOf": [schema] });
        let validator = jsonschema::draft202012::new(&root).unwrap();
        let errors: Vec<String> = validator
            .iter_errors(instance)
            .map(|e| format!("{e} at {}", e.instance_path()))
            .collect();
        assert!(
            errors.is_empty(),
            "{what}: {instance} does not validate: {errors:?}"
        );
    }

    /// Checks the answer against the operation `method path` of the document.
    fn check(&mut self, method: &str, path: &str, answer: &Answer) {
        let what = format!("{} {path} → {}", method.to_uppercase(), answer.status);
        let operation = &self.document["paths"][path][method];
        assert!(operation.is_object(), "{what}: not documented");
        let response = operation["responses"]
            .get(answer.status.to_string())
            .unwrap_or_else(|| panic!("{what}: status not documented for the operation"));
        let response = self.resolve(response);
        match response.get("content").and_then(Value::as_object) {
            None => assert!(
                answer.body.is_empty(),
                "{what}: a body where none is documented"
            ),
            Some(content) => {
                let media = answer.content_type.split(';').next().unwrap().trim();
                let schema = &content
                    .get(media)
                    .unwrap_or_else(|| panic!("{what}: content type {media:?} not documented"))["schema"];
                let instance = if media == "application/json" {
                    serde_json::from_slice(&answer.body)
                        .unwrap_or_else(|e| panic!("{what}: not JSON ({e})"))
                } else {
                    Value::String(String::from_utf8(answer.body.clone()).unwrap())
                };
                self.validate(&what, schema, &instance);
            }
        }
        self.checked += 1;
    }

    async fn tour(
        &mut self,
        method: &str,
        template: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&str>,
    ) -> Value {
        let answer = self.send(method, path, token, body, &[]).await;
        self.check(&method.to_lowercase(), template, &answer);
        serde_json::from_slice(&answer.body).unwrap_or(Value::Null)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_of_a_running_center_validates_against_the_openapi_document() {
    let center = TestCenter::sqlite().await;
    let client = reqwest::Client::new();
    let served = client
        .get(format!("{}/openapi.json", center.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(served.status(), 200, "served without a token");
    let document: Value = serde_json::from_slice(&served.bytes().await.unwrap()).unwrap();
    assert!(document["openapi"].as_str().unwrap().starts_with("3.1"));
    let mut tour = Tour {
        base: center.url(),
        client,
        document,
        checked: 0,
    };
    let (admin, editor, viewer) = (
        center.admin.clone(),
        center.editor.clone(),
        center.viewer.clone(),
    );
    let (admin, editor, viewer) = (Some(&*admin), Some(&*editor), Some(&*viewer));
    let versions = "/v1/services/{service}/versions";
    let publish = |base: u64, n: u32| {
        json!({ "base": base, "policy": attempts(n), "message": "tour" }).to_string()
    };

    tour.tour("GET", "/healthz", "/healthz", None, None).await;
    tour.tour("GET", "/openapi.json", "/openapi.json", None, None)
        .await;
    let made = tour
        .tour(
            "POST",
            "/v1/tokens",
            "/v1/tokens",
            admin,
            Some(r#"{"name": "orders-fleet", "role": "instance", "service": "orders"}"#),
        )
        .await;
    let instance_token = made["token"].as_str().unwrap().to_owned();
    let instance = Some(&*instance_token);
    let path = "/v1/services/orders/versions";
    tour.tour("POST", versions, path, editor, Some(&publish(0, 3)))
        .await;
    let second = tour
        .tour("POST", versions, path, editor, Some(&publish(1, 1)))
        .await;
    assert!(!second["diff"].as_array().unwrap().is_empty(), "{second}");
    // Refusals: a stale base, an invalid policy, a malformed body, a body of the wrong
    // shape, no content type, a viewer, no token, a bad token.
    tour.tour("POST", versions, path, editor, Some(&publish(1, 2)))
        .await;
    tour.tour(
        "POST",
        versions,
        path,
        editor,
        Some(r#"{"base": 2, "policy": "[endpoints.x]\nretry = { max_attempts = 0 }"}"#),
    )
    .await;
    tour.tour("POST", versions, path, editor, Some("{")).await;
    tour.tour("POST", versions, path, editor, Some(r#"{"base": "two"}"#))
        .await;
    let bare = tour
        .client
        .post(format!("{}{path}", tour.base))
        .bearer_auth(&center.editor)
        .body(publish(2, 2))
        .send()
        .await
        .unwrap();
    let bare = Answer {
        status: bare.status().as_u16(),
        content_type: bare.headers()["content-type"].to_str().unwrap().to_owned(),
        body: bare.bytes().await.unwrap().to_vec(),
    };
    assert_eq!(bare.status, 415);
    tour.check("post", versions, &bare);
    tour.tour("POST", versions, path, viewer, Some(&publish(2, 2)))
        .await;
    tour.tour("POST", versions, path, None, Some(&publish(2, 2)))
        .await;
    tour.tour(
        "POST",
        versions,
        path,
        Some("sg_nobody"),
        Some(&publish(2, 2)),
    )
    .await;
    tour.tour(
        "POST",
        versions,
        "/v1/services/a%20b/versions",
        editor,
        Some(&publish(0, 2)),
    )
    .await;
    // A canary, the status showing it, its promotion; a rollback.
    tour.tour(
        "POST",
        versions,
        path,
        editor,
        Some(r#"{"base": 2, "policy": "[endpoints.default]\nretry = { max_attempts = 2 }\n", "canary": {"share": 50}}"#),
    )
    .await;
    tour.tour("GET", versions, path, viewer, None).await;
    tour.tour(
        "GET",
        "/v1/services/{service}/versions/{version}",
        "/v1/services/orders/versions/2",
        viewer,
        None,
    )
    .await;
    tour.tour(
        "GET",
        "/v1/services/{service}/versions/{version}",
        "/v1/services/orders/versions/99",
        viewer,
        None,
    )
    .await;
    tour.tour(
        "GET",
        "/v1/services/{service}/versions/{version}",
        "/v1/services/orders/versions/two",
        viewer,
        None,
    )
    .await;

    // An instance: its poll, its watch (the first event's data is a snapshot), its ACK.
    let policy = "/v1/services/{service}/policy";
    let polled = tour
        .send(
            "GET",
            "/v1/services/orders/policy?instance=i-1&labels=zone=a",
            instance,
            None,
            &[],
        )
        .await;
    tour.check("get", policy, &polled);
    let snapshot: Value = serde_json::from_slice(&polled.body).unwrap();
    let etag = format!("\"{}\"", snapshot["version"]);
    let unchanged = tour
        .send(
            "GET",
            "/v1/services/orders/policy?instance=i-1&labels=zone=a",
            instance,
            None,
            &[("if-none-match", &etag)],
        )
        .await;
    assert_eq!(unchanged.status, 304);
    tour.check("get", policy, &unchanged);
    let empty = tour
        .send(
            "GET",
            "/v1/services/orders/policy?instance=i-1",
            viewer,
            None,
            &[],
        )
        .await;
    assert_eq!(empty.status, 200);
    let nothing = tour
        .send(
            "GET",
            "/v1/services/none/policy?instance=i-1",
            viewer,
            None,
            &[],
        )
        .await;
    tour.check("get", policy, &nothing);
    let bad_labels = tour
        .send(
            "GET",
            "/v1/services/orders/policy?instance=i-1&labels=zone",
            viewer,
            None,
            &[],
        )
        .await;
    tour.check("get", policy, &bad_labels);

    let mut watch = tour
        .client
        .get(format!(
            "{}/v1/services/orders/watch?instance=i-1&labels=zone=a",
            tour.base
        ))
        .bearer_auth(&instance_token)
        .send()
        .await
        .unwrap();
    let watch_answer = Answer {
        status: watch.status().as_u16(),
        content_type: watch.headers()["content-type"].to_str().unwrap().to_owned(),
        body: Vec::new(),
    };
    let mut parser = SseParser::new(1 << 20);
    let event = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let chunk = watch.chunk().await.unwrap().expect("the stream stays open");
            if let Some(event) = parser.push(&chunk).unwrap().into_iter().next() {
                return event;
            }
        }
    })
    .await
    .unwrap();
    drop(watch);
    assert_eq!(event.event.as_deref(), Some("policy"));
    let data: Value = serde_json::from_str(&event.data).unwrap();
    assert_eq!(event.id, Some(data["version"].to_string()));
    tour.check(
        "get",
        "/v1/services/{service}/watch",
        &Answer {
            body: b"event stream".to_vec(),
            ..watch_answer
        },
    );
    let snapshot_schema = json!({ "$ref": "#/components/schemas/Snapshot" });
    tour.validate("watch event data", &snapshot_schema, &data);
    let watch_of_viewer = tour
        .send(
            "GET",
            "/v1/services/orders/watch?instance=i-1",
            viewer,
            None,
            &[],
        )
        .await;
    tour.check("get", "/v1/services/{service}/watch", &watch_of_viewer);

    let acks = "/v1/services/{service}/acks";
    let ack = format!(
        r#"{{"instance": "i-1", "version": {}, "applied": true}}"#,
        data["version"]
    );
    tour.tour(
        "POST",
        acks,
        "/v1/services/orders/acks",
        instance,
        Some(&ack),
    )
    .await;
    tour.tour(
        "POST",
        acks,
        "/v1/services/orders/acks",
        instance,
        Some(r#"{"instance": "i-2", "version": 1, "applied": false}"#),
    )
    .await;
    tour.tour(
        "POST",
        acks,
        "/v1/services/billing/acks",
        instance,
        Some(&ack),
    )
    .await;
    let status = tour
        .tour(
            "GET",
            "/v1/services/{service}/status",
            "/v1/services/orders/status",
            viewer,
            None,
        )
        .await;
    assert!(status["canary"].is_array(), "{status}");
    assert!(
        !status["instances"].as_array().unwrap().is_empty(),
        "{status}"
    );

    tour.tour(
        "POST",
        "/v1/services/{service}/canary/promote",
        "/v1/services/orders/canary/promote",
        editor,
        Some(r#"{"version": 999}"#),
    )
    .await;
    tour.tour(
        "POST",
        "/v1/services/{service}/canary/promote",
        "/v1/services/orders/canary/promote",
        editor,
        Some(r#"{"message": "looks good"}"#),
    )
    .await;
    tour.tour(
        "POST",
        "/v1/services/{service}/canary/abort",
        "/v1/services/orders/canary/abort",
        editor,
        Some("{}"),
    )
    .await;
    tour.tour(
        "POST",
        "/v1/services/{service}/rollback",
        "/v1/services/orders/rollback",
        editor,
        Some(r#"{"base": 3, "to": 1}"#),
    )
    .await;
    tour.tour(
        "POST",
        "/v1/services/{service}/rollback",
        "/v1/services/orders/rollback",
        editor,
        Some(r#"{"base": 4, "to": 77}"#),
    )
    .await;
    tour.tour("GET", "/v1/audit", "/v1/audit?service=orders", viewer, None)
        .await;
    tour.tour("GET", "/v1/audit", "/v1/audit?nonsense=1", viewer, None)
        .await;
    tour.tour("GET", "/v1/audit", "/v1/audit", instance, None)
        .await;
    tour.tour("GET", "/metrics", "/metrics", viewer, None).await;
    tour.tour(
        "POST",
        "/v1/tokens",
        "/v1/tokens",
        admin,
        Some(r#"{"name": "x", "role": "instance"}"#),
    )
    .await;

    // What no operation documents still answers the documented error shape.
    let error = json!({ "$ref": "#/components/schemas/Error" });
    for (method, path, expected) in [("GET", "/v1/nothing", 404), ("DELETE", "/v1/audit", 405)] {
        let answer = tour.send(method, path, viewer, None, &[]).await;
        assert_eq!(answer.status, expected);
        assert!(answer.content_type.starts_with("application/json"));
        let body: Value = serde_json::from_slice(&answer.body).unwrap();
        tour.validate(path, &error, &body);
    }
    assert!(tour.checked >= 35, "{} answers checked", tour.checked);
}
