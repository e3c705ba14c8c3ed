//! Who may do what: bearer tokens with one role each, denied unless a rule allows.
//!
//! A token is 32 random bytes in hex behind `sg_`; the center keeps only its SHA-256, so a
//! copy of the database does not hold usable tokens (a token is long and random, so a plain
//! hash without salt or stretching is enough: there is nothing to guess). Every request but
//! `/healthz` needs one; a missing or unknown token is 401, a known token whose role does not
//! allow the request is 403. What each role may do is told at [`Role`].

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use rand::RngCore as _;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::ApiError;
use crate::metric_names::AUTH_FAILURES;
use crate::server::Center;
use crate::version::hex;

/// What a token may do:
///
/// | role       | may                                                                 |
/// |------------|---------------------------------------------------------------------|
/// | `viewer`   | read versions, status, audit and metrics of every service           |
/// | `editor`   | what a viewer may, and publish, roll back, promote or abort a canary |
/// | `admin`    | everything, including making tokens                                 |
/// | `instance` | for its one service only: read its policy, watch it, ACK or NACK it  |
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Reads everything, changes nothing.
    Viewer,
    /// Reads everything, publishes and rolls back.
    Editor,
    /// Everything, tokens included.
    Admin,
    /// One service's instances: read, watch and acknowledge that service only.
    Instance,
}

impl Role {
    /// The role's name, as tokens store it.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Editor => "editor",
            Role::Admin => "admin",
            Role::Instance => "instance",
        }
    }

    fn parse(name: &str) -> Option<Role> {
        [Role::Viewer, Role::Editor, Role::Admin, Role::Instance]
            .into_iter()
            .find(|role| role.as_str() == name)
    }
}

/// A new random token (`sg_` and 64 hex digits).
pub fn new_token() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!("sg_{}", hex(&bytes))
}

/// The SHA-256 of a token, in hex: what the store keeps.
pub(crate) fn token_hash(token: &str) -> String {
    hex(&Sha256::digest(token.as_bytes()))
}

/// The authenticated caller of one request.
#[derive(Clone, Debug)]
pub struct Caller {
    /// The token's name: the author of what it publishes, the actor of its audit records.
    pub name: String,
    /// The token's role.
    pub role: Role,
    /// The one service an `instance` token is for.
    pub service: Option<String>,
}

impl Caller {
    /// May read `service`'s versions and status.
    pub(crate) fn may_read(&self, service: &str) -> Result<(), ApiError> {
        match self.role {
            Role::Viewer | Role::Editor | Role::Admin => Ok(()),
            Role::Instance => self.own(service),
        }
    }

    /// May read what is not one service's (the audit log of every service, metrics).
    pub(crate) fn may_read_all(&self) -> Result<(), ApiError> {
        match self.role {
            Role::Viewer | Role::Editor | Role::Admin => Ok(()),
            Role::Instance => Err(forbidden("an instance token reads its own service only")),
        }
    }

    /// May publish, roll back, promote or abort.
    pub(crate) fn may_edit(&self) -> Result<(), ApiError> {
        match self.role {
            Role::Editor | Role::Admin => Ok(()),
            Role::Viewer | Role::Instance => Err(forbidden("publishing needs an editor token")),
        }
    }

    /// May make tokens.
    pub(crate) fn may_admin(&self) -> Result<(), ApiError> {
        match self.role {
            Role::Admin => Ok(()),
            _ => Err(forbidden("this needs an admin token")),
        }
    }

    /// May watch `service` and acknowledge its versions.
    pub(crate) fn may_watch(&self, service: &str) -> Result<(), ApiError> {
        match self.role {
            Role::Admin => Ok(()),
            Role::Instance => self.own(service),
            Role::Viewer | Role::Editor => Err(forbidden(
                "watching and acknowledging need an instance token",
            )),
        }
    }

    fn own(&self, service: &str) -> Result<(), ApiError> {
        if self.service.as_deref() == Some(service) {
            Ok(())
        } else {
            Err(forbidden("this instance token is for another service"))
        }
    }
}

fn forbidden(why: &'static str) -> ApiError {
    metrics::counter!(AUTH_FAILURES, "reason" => "forbidden").increment(1);
    ApiError::Forbidden(why)
}

fn unauthorized(reason: &'static str, why: &'static str) -> ApiError {
    metrics::counter!(AUTH_FAILURES, "reason" => reason).increment(1);
    ApiError::Unauthorized(why)
}

/// The token of an `Authorization` value `Bearer <token>`. The scheme's name is
/// case-insensitive (RFC 9110 §11.1: `bearer`, `BEARER` are the same scheme); the token is
/// 1 to 256 characters with no space inside.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    let good = scheme.eq_ignore_ascii_case("bearer")
        && !token.is_empty()
        && token.len() <= 256
        && !token.contains(char::is_whitespace);
    good.then_some(token)
}

impl FromRequestParts<Center> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, center: &Center) -> Result<Self, ApiError> {
        let header = parts
            .headers
            .get(axum::http::header::AUTHORIZATION)
            .ok_or_else(|| unauthorized("missing", "no Authorization: Bearer token"))?;
        let token = header.to_str().ok().and_then(bearer_token).ok_or_else(|| {
            unauthorized(
                "malformed",
                "the Authorization header is not Bearer <token>",
            )
        })?;
        Caller::of_token(center, token).await
    }
}

impl Caller {
    /// The caller whose token this is: 401 when the center knows no such token. The API
    /// reads the token from `Authorization`, the dashboard from its sign-in cookie.
    pub(crate) async fn of_token(center: &Center, token: &str) -> Result<Caller, ApiError> {
        let row = center
            .store()
            .token(&token_hash(token))
            .await?
            .ok_or_else(|| unauthorized("unknown", "unknown token"))?;
        let role =
            Role::parse(&row.role).ok_or_else(|| unauthorized("unknown", "unknown token"))?;
        Ok(Caller {
            name: row.name,
            role,
            service: row.service,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bearer_scheme_is_matched_without_regard_to_case() {
        for value in [
            "Bearer sg_1",
            "bearer sg_1",
            "BEARER  sg_1 ",
            " BeArEr sg_1",
        ] {
            assert_eq!(bearer_token(value), Some("sg_1"), "{value:?}");
        }
        for value in [
            "Basic sg_1",
            "Bearer",
            "Bearer ",
            "Bearersg_1",
            "Bearer a b",
            "sg_1",
        ] {
            assert_eq!(bearer_token(value), None, "{value:?}");
        }
        assert_eq!(bearer_token(&format!("Bearer {}", "x".repeat(257))), None);
    }
}
