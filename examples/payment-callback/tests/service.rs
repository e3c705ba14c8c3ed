//! The service over real HTTP: signature rejections change nothing, an exhausted risk check
//! answers 500 with `X-Retry-Exhausted`, a paid order is recorded once, and /metrics counts it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use stormguard_payment_callback::broker::BrokerUrl;
use stormguard_payment_callback::callback::PaymentCallback;
use stormguard_payment_callback::policy::Policies;
use stormguard_payment_callback::risk::{RiskFaults, RiskServer};
use stormguard_payment_callback::service::{BUSINESS_DEADLINE, Service, ServiceConfig};
use stormguard_payment_callback::signature::{SIGNATURE_HEADER, Signer};
use stormguard_payment_callback::store::{DatabaseUrl, Store, StoreOptions};

const SECRET: &str = "test-secret";

struct Fixture {
    _dir: tempfile::TempDir,
    url: DatabaseUrl,
    risk: RiskServer,
    service: Service,
    http: reqwest::Client,
    signer: Signer,
}

async fn fixture(faults: RiskFaults) -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = DatabaseUrl::Sqlite(dir.path().join("pay.db"));
    let risk = RiskServer::start(Arc::new(faults)).await.expect("risk");
    let service = Service::start(ServiceConfig {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        database: url.clone(),
        risk_url: risk.url(),
        broker: BrokerUrl::Table,
        secret: SECRET.into(),
        policies: Policies::default_policies().expect("policy"),
        seed: 7,
        deadline: BUSINESS_DEADLINE,
        bind_patience: Duration::ZERO,
    })
    .await
    .expect("service");
    Fixture {
        _dir: dir,
        url,
        risk,
        service,
        http: reqwest::Client::builder()
            .no_proxy()
            .build()
            .expect("client"),
        signer: Signer::new(SECRET).expect("secret"),
    }
}

impl Fixture {
    async fn post(&self, body: &[u8], signature: Option<String>) -> (u16, Option<String>, String) {
        let mut req = self
            .http
            .post(self.service.callback_url())
            .body(body.to_vec());
        if let Some(sig) = signature {
            req = req.header(SIGNATURE_HEADER, sig);
        }
        let resp = req.send().await.expect("answered");
        let status = resp.status().as_u16();
        let exhausted = resp
            .headers()
            .get("x-retry-exhausted")
            .map(|v| v.to_str().unwrap().to_owned());
        (status, exhausted, resp.text().await.expect("body"))
    }

    async fn rows(&self, prefix: &str) -> (i64, i64) {
        let store = Store::connect(&self.url, StoreOptions::default())
            .await
            .expect("verifier");
        let c = store.counts(prefix).await.expect("counts");
        store.close().await;
        (c.orders, c.outbox)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_signatures_are_refused_without_any_effect() {
    let f = fixture(RiskFaults::new(1)).await;
    let body = PaymentCallback::paid("SIG-1", "WX-1", 100).to_json();
    let good = f.signer.sign(&body);
    let tampered = String::from_utf8(body.clone()).unwrap().replace("100", "1");
    let wrong_key = Signer::new("other").unwrap().sign(&body);
    for (body, sig) in [
        (body.clone(), None),
        (body.clone(), Some("zz".to_owned())),
        (body.clone(), Some(wrong_key)),
        (tampered.into_bytes(), Some(good.clone())),
    ] {
        let (status, _, text) = f.post(&body, sig).await;
        assert_eq!((status, text.as_str()), (401, "fail"));
    }
    // Nothing was checked with the risk service and nothing was written.
    assert_eq!(f.risk.faults().counts().requests, 0);
    assert_eq!(f.rows("SIG-").await, (0, 0));
    // A correctly signed but invalid payload is a 400, also without effect.
    let bad = br#"{"out_trade_no":"SIG-2","trade_no":"W","amount":0,"status":"SUCCESS"}"#;
    let (status, _, _) = f.post(bad, Some(f.signer.sign(bad))).await;
    assert_eq!(status, 400);
    assert_eq!(f.risk.faults().counts().requests, 0);
    // The good one goes through.
    let (status, _, text) = f.post(&body, Some(good)).await;
    assert_eq!((status, text.as_str()), (200, "success"));
    assert_eq!(f.rows("SIG-").await, (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_risk_check_is_a_marked_500_and_a_repeat_pays_once() {
    let f = fixture(RiskFaults::new(2)).await;
    f.risk.faults().set_down(true);
    let body = PaymentCallback::paid("DOWN-1", "WX-9", 990).to_json();
    let sig = f.signer.sign(&body);
    let (status, exhausted, text) = f.post(&body, Some(sig.clone())).await;
    assert_eq!(
        (status, exhausted.as_deref(), text.as_str()),
        (500, Some("true"), "fail")
    );
    // Three attempts: two retries, no more.
    let seen = f.risk.faults().counts();
    assert_eq!((seen.requests, seen.retries), (3, 2));
    assert_eq!(f.rows("DOWN-").await, (0, 0));

    // The platform redelivers after the outage: paid once, however often it is delivered.
    f.risk.faults().set_down(false);
    for _ in 0..3 {
        let (status, exhausted, text) = f.post(&body, Some(sig.clone())).await;
        assert_eq!((status, exhausted, text.as_str()), (200, None, "success"));
    }
    assert_eq!(f.rows("DOWN-").await, (1, 1));

    let metrics = f
        .http
        .get(format!("http://{}/metrics", f.service.addr()))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(
        metrics.contains("payment_retry_exhausted_total{dependency=\"risk-check\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("payment_callbacks_total{result=\"duplicate\"}"),
        "{metrics}"
    );
}
