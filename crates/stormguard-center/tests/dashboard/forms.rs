//! The dashboard's sign-in and forms over plain HTTP (no browser needed, so these always
//! run): what a role may do, the form token, the cookie's attributes, escaping.

use super::{center_with_web, policy};
use crate::support::TestCenter;

/// A client that shows redirects instead of following them.
fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

struct Answer {
    status: u16,
    location: String,
    cookie: String,
    body: String,
}

async fn send(request: reqwest::RequestBuilder) -> Answer {
    let response = request.send().await.unwrap();
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    let (location, cookie) = (header("location"), header("set-cookie"));
    Answer {
        status: response.status().as_u16(),
        location,
        cookie,
        body: response.text().await.unwrap(),
    }
}

async fn sign_in(center: &TestCenter, token: &str) -> Answer {
    send(
        client()
            .post(format!("{}/ui/login", center.url()))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("token={token}")),
    )
    .await
}

/// The cookie of a signed-in `token`, and the form token of its pages.
async fn session(center: &TestCenter, token: &str) -> (String, String) {
    let answer = sign_in(center, token).await;
    assert_eq!((answer.status, answer.location.as_str()), (303, "/ui"));
    let cookie = answer.cookie.split(';').next().unwrap().to_owned();
    let page = send(
        client()
            .get(format!("{}/ui/services/web/history", center.url()))
            .header("cookie", &cookie),
    )
    .await;
    assert_eq!(page.status, 200);
    let csrf = page
        .body
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap()
        .to_owned();
    (cookie, csrf)
}

async fn rollback(center: &TestCenter, cookie: &str, body: String, origin: Option<&str>) -> Answer {
    let mut request = client()
        .post(format!("{}/ui/services/web/rollback", center.url()))
        .header("cookie", cookie)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(body);
    if let Some(origin) = origin {
        request = request.header("origin", origin);
    }
    send(request).await
}

async fn latest(center: &TestCenter) -> u64 {
    let (_, versions) = center
        .api(&center.viewer)
        .get("/v1/services/web/versions")
        .await;
    versions[0]["version"].as_u64().unwrap()
}

#[tokio::test]
async fn pages_need_a_sign_in_and_the_cookie_is_locked_down() {
    let center = center_with_web().await;
    let answer = send(client().get(format!("{}/ui/services/web", center.url()))).await;
    assert_eq!(
        (answer.status, answer.location.as_str()),
        (303, "/ui/login")
    );

    let answer = sign_in(&center, "sg_nobody").await;
    assert_eq!(answer.status, 401);
    assert!(answer.body.contains("does not know this token"));
    assert!(answer.cookie.is_empty());

    let instance = center.instance_token("web").await;
    let answer = sign_in(&center, &instance).await;
    assert_eq!(answer.status, 403);
    assert!(answer.body.contains("instance token"), "{}", answer.body);

    let answer = sign_in(&center, &center.viewer).await;
    assert_eq!(answer.status, 303);
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/ui"] {
        assert!(answer.cookie.contains(attribute), "{}", answer.cookie);
    }

    // The API's own errors are still JSON; the dashboard's are pages.
    let (status, body) = center.api(&center.viewer).get("/v1/nothing").await;
    assert_eq!((status, body["status"].as_u64()), (404, Some(404)));
}

#[tokio::test]
async fn a_viewer_cannot_roll_back_even_with_a_forged_form() {
    let center = center_with_web().await;
    assert_eq!(
        center
            .api(&center.editor)
            .publish("web", 1, &policy(5))
            .await
            .0,
        201
    );
    let (cookie, csrf) = session(&center, &center.viewer).await;
    let answer = rollback(&center, &cookie, format!("csrf={csrf}&base=2&to=1"), None).await;
    assert_eq!(answer.status, 403);
    assert!(answer.body.contains("editor token"), "{}", answer.body);
    assert_eq!(latest(&center).await, 2);
}

#[tokio::test]
async fn a_form_without_its_token_or_from_another_site_changes_nothing() {
    let center = center_with_web().await;
    assert_eq!(
        center
            .api(&center.editor)
            .publish("web", 1, &policy(5))
            .await
            .0,
        201
    );
    let (cookie, csrf) = session(&center, &center.editor).await;

    let answer = rollback(&center, &cookie, "base=2&to=1".to_owned(), None).await;
    assert_eq!(answer.status, 422, "a form without its token does not read");
    let answer = rollback(&center, &cookie, "csrf=00&base=2&to=1".to_owned(), None).await;
    assert_eq!(answer.status, 403);
    let body = format!("csrf={csrf}&base=2&to=1");
    let answer = rollback(&center, &cookie, body.clone(), Some("https://evil.example")).await;
    assert_eq!(answer.status, 403);
    assert_eq!(latest(&center).await, 2);

    // With its token, from the dashboard's own origin: v1 again, as v3.
    let origin = center.url();
    let answer = rollback(&center, &cookie, body.clone(), Some(&origin)).await;
    assert_eq!(
        (answer.status, answer.location.as_str()),
        (303, "/ui/services/web?published=3")
    );
    assert_eq!(latest(&center).await, 3);
    // The same form again is based on v2, no longer the latest: refused, saying so.
    let answer = rollback(&center, &cookie, body, None).await;
    assert_eq!(answer.status, 409);
    assert!(
        answer.body.contains("latest version is 3"),
        "{}",
        answer.body
    );
}

#[tokio::test]
async fn what_people_wrote_is_shown_as_text() {
    let center = center_with_web().await;
    let (status, _) = center
        .api(&center.editor)
        .post(
            "/v1/services/web/versions",
            serde_json::json!({ "base": 1, "policy": policy(2), "message": "<script>alert(1)</script>" }),
        )
        .await;
    assert_eq!(status, 201);
    let (cookie, _) = session(&center, &center.viewer).await;
    let page = send(
        client()
            .get(format!("{}/ui/services/web/history", center.url()))
            .header("cookie", &cookie),
    )
    .await;
    assert!(page.body.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    assert!(!page.body.contains("<script>alert"));
}

#[tokio::test]
async fn the_sign_in_page_cannot_be_framed_or_cached() {
    let center = center_with_web().await;
    let page = client()
        .get(format!("{}/ui/login", center.url()))
        .send()
        .await
        .unwrap();
    let refused = client()
        .post(format!("{}/ui/login", center.url()))
        .header("content-type", "application/x-www-form-urlencoded")
        .body("token=sg_unknown")
        .send()
        .await
        .unwrap();
    assert_eq!(
        (page.status().as_u16(), refused.status().as_u16()),
        (200, 401)
    );
    for response in [&page, &refused] {
        let header = |name: &str| response.headers().get(name).map(|v| v.to_str().unwrap());
        assert!(
            header("content-security-policy")
                .is_some_and(|csp| csp.contains("frame-ancestors 'none'")),
            "{:?}",
            response.headers()
        );
        assert_eq!(header("x-frame-options"), Some("DENY"));
        assert_eq!(header("cache-control"), Some("no-store"));
    }
}

/// A fired rule shows as active however many records came after its firing: here 201
/// `rule-failed` records of another rule (more than the page's history reads), as a rule
/// on a missing endpoint writes at every observation.
#[tokio::test]
async fn a_fired_rule_shows_active_under_any_number_of_failures() {
    use std::time::Instant;
    use stormguard::rules::{Observations, Series};

    let center = center_with_web().await;
    let editor = center.api(&center.editor);
    for (name, endpoint) in [("cdn-504", "GET /img/*"), ("broken", "GET /missing")] {
        let rule = serde_json::json!({
            "name": name, "service": "web", "endpoint": endpoint, "for": "1s", "exit_for": "20s",
            "when": { "series": "error_ratio", "code": 504, "above": 0.1, "exit_below": 0.02 },
            "actions": [{ "set": "attempts", "max_attempts": 1 }],
        });
        let path = format!("/v1/services/web/rules/{name}");
        let put = editor
            .send("PUT", &path, Some(rule.to_string().into_bytes()))
            .await;
        assert_eq!(put.0, 204, "{put:?}");
    }
    let runner = stormguard_center::RuleRunner::new(center.center.clone(), 1000);
    let mut seen = Observations::new();
    seen.set_endpoint("GET /img/*", Series::ErrorRatioCode(504), 0.4)
        .set_endpoint("GET /missing", Series::ErrorRatioCode(504), 0.4);
    let t0 = Instant::now();
    let (mut fired, mut failed) = (0, 0);
    for s in 0..1000 {
        for event in runner
            .observe("web", &seen, t0 + std::time::Duration::from_secs(2 * s))
            .await
            .unwrap()
        {
            match event.action {
                "rule-fire" => fired += 1,
                "rule-failed" => failed += 1,
                other => panic!("{other}: {event:?}"),
            }
        }
        if failed > 200 {
            break;
        }
    }
    assert_eq!((fired, failed), (1, 201));
    let (cookie, _) = session(&center, &center.viewer).await;
    let page = send(
        client()
            .get(format!("{}/ui/services/web/rules", center.url()))
            .header("cookie", &cookie),
    )
    .await;
    assert_eq!(page.status, 200);
    let card = page
        .body
        .split("data-rule=\"cdn-504\"")
        .nth(1)
        .and_then(|rest| rest.split("</h2>").next())
        .unwrap();
    assert!(card.contains(">active<"), "{card}");
}
