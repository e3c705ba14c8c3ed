//! `stormguard policy push | get | history | rollback | status | audit | promote | abort |
//! rules list | rules put | rules delete --center URL`: the center's API from the command
//! line.
//!
//! Every command needs the center's URL (`--center` or `STORMGUARD_CENTER_URL`) and a token
//! (`--token` or `STORMGUARD_CENTER_TOKEN`). A refusal of the center (bad token, wrong role,
//! a conflict, an invalid policy) exits with status 2 and the center's reason; an
//! unreachable center or a center error exits with status 1.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use serde_json::{Value, json};

use crate::run::Failure;

/// Where the center is, and who asks.
#[derive(Debug, Args)]
pub(crate) struct Remote {
    /// The center's URL.
    #[arg(
        long,
        env = "STORMGUARD_CENTER_URL",
        global = true,
        default_value = "http://127.0.0.1:7450"
    )]
    center: String,
    /// The bearer token.
    #[arg(
        long,
        env = "STORMGUARD_CENTER_TOKEN",
        hide_env_values = true,
        global = true
    )]
    token: Option<String>,
    /// Print the center's JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
}

impl Remote {
    /// `lint` and `diff` read local files: `--json` (the center's answer as JSON) means
    /// nothing there, and is refused rather than ignored.
    pub(crate) fn refuse_for_local_files(&self) -> Result<(), Failure> {
        if self.json {
            return Err(Failure::Usage(
                "--json: only for the center commands; lint and diff take --format json".into(),
            ));
        }
        Ok(())
    }
}

/// The policy commands that talk to a center.
#[derive(Debug, Subcommand)]
pub(crate) enum PolicyCenter {
    /// Publish a policy file (TOML or JSON, by extension) as the service's next version.
    Push {
        /// The service.
        service: String,
        /// The policy file.
        file: PathBuf,
        /// The version this change is based on, as `policy get` or `history` showed it (0
        /// for a service's first): compare-and-set, so a version published since refuses the
        /// push (409) instead of being overwritten. Required: filling in the center's latest
        /// would overwrite whatever another editor published meanwhile.
        #[arg(long)]
        base: u64,
        /// Why.
        #[arg(long, short, default_value = "")]
        message: String,
        /// Publish as a canary for this percentage of instances.
        #[arg(long, conflicts_with = "canary_labels")]
        canary_share: Option<u8>,
        /// Publish as a canary for the instances with these labels (`zone=a,tier=web`).
        #[arg(long)]
        canary_labels: Option<String>,
    },
    /// Print a version's policies (the latest by default).
    Get {
        /// The service.
        service: String,
        /// The version.
        #[arg(long)]
        version: Option<u64>,
    },
    /// List the service's versions, newest first.
    History {
        /// The service.
        service: String,
        /// At most this many.
        #[arg(long, default_value_t = 20)]
        limit: u32,
    },
    /// Publish an old version's policies again, as a new version.
    Rollback {
        /// The service.
        service: String,
        /// The version to return to.
        to: u64,
        /// The latest version, as seen (by default the center's latest: a rollback is the
        /// way back in an emergency, meant to win over whatever is there).
        #[arg(long)]
        base: Option<u64>,
        /// Why.
        #[arg(long, short, default_value = "")]
        message: String,
    },
    /// Which instance should run and runs which version.
    Status {
        /// The service.
        service: String,
    },
    /// The audit records (of one service, or all).
    Audit {
        /// The service.
        #[arg(long)]
        service: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// Make the service's canary its stable version.
    Promote {
        /// The service.
        service: String,
    },
    /// Drop the service's canary: its instances return to the stable version.
    Abort {
        /// The service.
        service: String,
    },
    /// A service's metric-driven rules: list, put (from a rule file), delete.
    #[command(subcommand)]
    Rules(RulesCommand),
}

/// `stormguard policy rules …`.
#[derive(Debug, Subcommand)]
pub(crate) enum RulesCommand {
    /// The service's rules.
    List {
        /// The service.
        service: String,
    },
    /// Store every rule of a rule file (TOML or JSON, by extension; the shape of
    /// `stormguard::rules`), each under its own service and name. The file is checked here
    /// first: a wrong field exits 2 naming it, and nothing is sent.
    Put {
        /// The rule file.
        file: PathBuf,
    },
    /// Delete one rule.
    Delete {
        /// The service.
        service: String,
        /// The rule's name.
        name: String,
    },
}

/// Runs one command against the center.
pub(crate) fn run(remote: Remote, command: PolicyCenter) -> Result<String, Failure> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::Io(format!("tokio runtime: {e}")))?;
    runtime.block_on(async move {
        let client = Client::new(&remote)?;
        let answer = execute(&client, command).await?;
        Ok(if remote.json {
            format!(
                "{}\n",
                serde_json::to_string_pretty(&answer.0).unwrap_or_default()
            )
        } else {
            answer.1
        })
    })
}

/// The center's JSON, and its text rendering.
type Answer = (Value, String);

async fn execute(client: &Client, command: PolicyCenter) -> Result<Answer, Failure> {
    match command {
        PolicyCenter::Rules(command) => rules(client, command).await,
        PolicyCenter::Push {
            service,
            file,
            base,
            message,
            canary_share,
            canary_labels,
        } => {
            let policy = std::fs::read_to_string(&file)
                .map_err(|e| Failure::Usage(format!("{}: {e}", file.display())))?;
            let format = if file.extension().is_some_and(|e| e == "json") {
                "json"
            } else {
                "toml"
            };
            let canary = match (canary_share, canary_labels) {
                (Some(share), _) => json!({ "share": share }),
                (None, Some(labels)) => json!({ "labels": parse_labels(&labels)? }),
                (None, None) => Value::Null,
            };
            let body = json!({ "base": base, "policy": policy, "format": format,
                               "message": message, "canary": canary });
            let v = client
                .send(
                    "POST",
                    &format!("/v1/services/{service}/versions"),
                    Some(body),
                )
                .await?;
            let text = format!(
                "published {service} version {} ({})\n{}",
                v["version"],
                short(&v["hash"]),
                diff(&v["diff"])
            );
            Ok((v, text))
        }
        PolicyCenter::Get { service, version } => {
            let v = match version {
                Some(n) => {
                    client
                        .send("GET", &format!("/v1/services/{service}/versions/{n}"), None)
                        .await?
                }
                None => {
                    let list = client
                        .send(
                            "GET",
                            &format!("/v1/services/{service}/versions?limit=1"),
                            None,
                        )
                        .await?;
                    list.get(0).cloned().ok_or_else(|| {
                        Failure::Usage(format!("{service} has no published version"))
                    })?
                }
            };
            let text = v["policy"].as_str().unwrap_or_default().to_owned();
            Ok((v, text))
        }
        PolicyCenter::History { service, limit } => {
            let list = client
                .send(
                    "GET",
                    &format!("/v1/services/{service}/versions?limit={limit}"),
                    None,
                )
                .await?;
            let text = list
                .as_array()
                .into_iter()
                .flatten()
                .map(|v| {
                    let rollback = v["rollback_of"]
                        .as_u64()
                        .map(|n| format!(" (rollback to {n})"))
                        .unwrap_or_default();
                    format!(
                        "{:>5}  {}  {:<12} {}{rollback}\n",
                        v["version"],
                        short(&v["hash"]),
                        v["author"].as_str().unwrap_or(""),
                        v["message"].as_str().unwrap_or("")
                    )
                })
                .collect();
            Ok((list, text))
        }
        PolicyCenter::Rollback {
            service,
            to,
            base,
            message,
        } => {
            let base = match base {
                Some(base) => base,
                None => client.latest(&service).await?,
            };
            let body = json!({ "base": base, "to": to, "message": message });
            let v = client
                .send(
                    "POST",
                    &format!("/v1/services/{service}/rollback"),
                    Some(body),
                )
                .await?;
            let text = format!(
                "published {service} version {} = version {to}\n{}",
                v["version"],
                diff(&v["diff"])
            );
            Ok((v, text))
        }
        PolicyCenter::Status { service } => {
            let s = client
                .send("GET", &format!("/v1/services/{service}/status"), None)
                .await?;
            let mut text = format!("{service}: stable {}", s["stable"]);
            if !s["canary"].is_null() {
                text.push_str(&format!(
                    ", canary {} for {}",
                    s["canary"][0], s["canary"][1]
                ));
            }
            text.push('\n');
            for i in s["instances"].as_array().into_iter().flatten() {
                let state = match i["applied"].as_bool() {
                    Some(true) => format!("runs {}", i["version"]),
                    Some(false) => format!(
                        "NACK {}: {}",
                        i["version"],
                        i["reason"].as_str().unwrap_or("")
                    ),
                    None => "no ACK yet".to_owned(),
                };
                text.push_str(&format!(
                    "  {:<24} target {:<5} {state}\n",
                    i["instance"].as_str().unwrap_or(""),
                    i["target"]
                ));
            }
            Ok((s, text))
        }
        PolicyCenter::Audit { service, limit } => {
            let query = match &service {
                Some(s) => format!("/v1/audit?service={s}&limit={limit}"),
                None => format!("/v1/audit?limit={limit}"),
            };
            let list = client.send("GET", &query, None).await?;
            let text = list
                .as_array()
                .into_iter()
                .flatten()
                .map(|r| {
                    format!(
                        "{:>6} {} {:<14} {:<12} {} v{} {} {}\n",
                        r["id"],
                        r["at_ms"],
                        r["action"].as_str().unwrap_or(""),
                        r["actor"].as_str().unwrap_or(""),
                        r["service"].as_str().unwrap_or(""),
                        r["version"],
                        r["instance"].as_str().unwrap_or(""),
                        r["detail"].as_str().unwrap_or("")
                    )
                })
                .collect();
            Ok((list, text))
        }
        PolicyCenter::Promote { service } => {
            client
                .send(
                    "POST",
                    &format!("/v1/services/{service}/canary/promote"),
                    Some(json!({})),
                )
                .await?;
            Ok((Value::Null, format!("{service}: canary promoted\n")))
        }
        PolicyCenter::Abort { service } => {
            client
                .send(
                    "POST",
                    &format!("/v1/services/{service}/canary/abort"),
                    Some(json!({})),
                )
                .await?;
            Ok((Value::Null, format!("{service}: canary aborted\n")))
        }
    }
}

fn parse_labels(text: &str) -> Result<Value, Failure> {
    let mut labels = serde_json::Map::new();
    for pair in text.split(',').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').ok_or_else(|| {
            Failure::Usage(format!("--canary-labels {pair:?}: expected key=value"))
        })?;
        labels.insert(k.to_owned(), Value::String(v.to_owned()));
    }
    Ok(Value::Object(labels))
}

fn short(hash: &Value) -> String {
    hash.as_str().unwrap_or_default().chars().take(12).collect()
}

fn diff(changes: &Value) -> String {
    changes
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            let show = |v: &Value| {
                if v.is_null() {
                    "-".to_owned()
                } else {
                    v.to_string()
                }
            };
            format!(
                "  {}: {} -> {}\n",
                c["path"].as_str().unwrap_or(""),
                show(&c["old"]),
                show(&c["new"])
            )
        })
        .collect()
}

async fn rules(client: &Client, command: RulesCommand) -> Result<Answer, Failure> {
    match command {
        RulesCommand::List { service } => {
            let list = client
                .send("GET", &format!("/v1/services/{service}/rules"), None)
                .await?;
            let text = list
                .as_array()
                .into_iter()
                .flatten()
                .map(|r| {
                    let dry = if r["rule"]["dry_run"].as_bool() == Some(true) {
                        " (dry run)"
                    } else {
                        ""
                    };
                    format!(
                        "{:<24} {}{dry}\n",
                        r["name"].as_str().unwrap_or(""),
                        r["rule"]["endpoint"].as_str().unwrap_or("")
                    )
                })
                .collect();
            Ok((list, text))
        }
        RulesCommand::Put { file } => {
            let text = std::fs::read_to_string(&file)
                .map_err(|e| Failure::Usage(format!("{}: {e}", file.display())))?;
            let set = if file.extension().is_some_and(|e| e == "json") {
                stormguard::rules::RuleSet::from_json(&text)
            } else {
                stormguard::rules::RuleSet::from_toml(&text)
            }
            .map_err(|e| Failure::Usage(format!("{}: {e}", file.display())))?;
            let mut stored = Vec::new();
            let mut out = String::new();
            for rule in &set.rules {
                let body: Value = serde_json::from_str(&rule.to_json()).unwrap_or(Value::Null);
                client
                    .send(
                        "PUT",
                        &format!("/v1/services/{}/rules/{}", rule.service, rule.name),
                        Some(body),
                    )
                    .await?;
                out.push_str(&format!("stored rule {} of {}\n", rule.name, rule.service));
                stored.push(json!({ "service": rule.service, "name": rule.name }));
            }
            Ok((Value::Array(stored), out))
        }
        RulesCommand::Delete { service, name } => {
            client
                .send(
                    "DELETE",
                    &format!("/v1/services/{service}/rules/{name}"),
                    None,
                )
                .await?;
            Ok((
                json!({ "service": service, "name": name, "deleted": true }),
                format!("deleted rule {name} of {service}\n"),
            ))
        }
    }
}

pub(crate) struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl Client {
    fn new(remote: &Remote) -> Result<Client, Failure> {
        let token = remote.token.as_deref().ok_or_else(|| {
            Failure::Usage("a token is needed: --token or STORMGUARD_CENTER_TOKEN".to_owned())
        })?;
        Client::with_token(&remote.center, token)
    }

    /// A client of the center at `base` (`http://127.0.0.1:7450`) calling with `token`.
    pub(crate) fn with_token(base: &str, token: &str) -> Result<Client, Failure> {
        let http = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(30))
            .build()
            .map_err(|e| Failure::Failed(format!("http client: {e}")))?;
        Ok(Client {
            http,
            base: base.trim_end_matches('/').to_owned(),
            token: token.to_owned(),
        })
    }

    /// The service's latest version number (0 when it has none).
    async fn latest(&self, service: &str) -> Result<u64, Failure> {
        let list = self
            .send(
                "GET",
                &format!("/v1/services/{service}/versions?limit=1"),
                None,
            )
            .await?;
        Ok(list.get(0).and_then(|v| v["version"].as_u64()).unwrap_or(0))
    }

    /// `method path` with the JSON `body`: the JSON answer (null when it is not JSON), or
    /// the center's refusal (a usage error for a 4xx) naming its reason.
    pub(crate) async fn send(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, Failure> {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap_or(reqwest::Method::GET);
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.token);
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body.to_string());
        }
        let response = request
            .send()
            .await
            .map_err(|e| Failure::Failed(format!("{}: {e}", self.base)))?;
        let status = response.status();
        let bytes = response
            .bytes()
            .await
            .map_err(|e| Failure::Failed(format!("{}: {e}", self.base)))?;
        let value: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        if status.is_success() {
            return Ok(value);
        }
        let reason = value["error"]
            .as_str()
            .map_or_else(|| status.to_string(), str::to_owned);
        if status.is_client_error() {
            Err(Failure::Usage(format!(
                "the center refused ({}): {reason}",
                status.as_u16()
            )))
        } else {
            Err(Failure::Failed(format!(
                "the center failed ({}): {reason}",
                status.as_u16()
            )))
        }
    }
}
