//! Which database to use, as `--database-url` names it.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// Where the data lives, from `--database-url`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DatabaseUrl {
    /// An SQLite file (`sqlite:PATH` or `sqlite://PATH`); created if missing.
    Sqlite(PathBuf),
    /// A PostgreSQL server (`postgres://` or `postgresql://`).
    Postgres(String),
    /// A MariaDB or MySQL server (`mysql://` or `mariadb://`).
    MySql(String),
}

/// A `--database-url` that names no supported database.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "unsupported database URL '{0}': expected sqlite:PATH, postgres://… or mysql://… (MariaDB)"
)]
pub struct BadDatabaseUrl(pub String);

impl FromStr for DatabaseUrl {
    type Err = BadDatabaseUrl;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || BadDatabaseUrl(s.to_owned());
        if let Some(path) = s
            .strip_prefix("sqlite://")
            .or_else(|| s.strip_prefix("sqlite:"))
        {
            if path.is_empty() {
                return Err(bad());
            }
            return Ok(DatabaseUrl::Sqlite(PathBuf::from(path)));
        }
        if s.starts_with("postgres://") || s.starts_with("postgresql://") {
            return Ok(DatabaseUrl::Postgres(s.to_owned()));
        }
        if s.starts_with("mysql://") {
            return Ok(DatabaseUrl::MySql(s.to_owned()));
        }
        if let Some(rest) = s.strip_prefix("mariadb://") {
            return Ok(DatabaseUrl::MySql(format!("mysql://{rest}")));
        }
        Err(bad())
    }
}

impl fmt::Display for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DatabaseUrl::Sqlite(path) => write!(f, "sqlite:{}", path.display()),
            DatabaseUrl::Postgres(url) | DatabaseUrl::MySql(url) => f.write_str(url),
        }
    }
}

impl DatabaseUrl {
    /// A short name for tables and logs: `sqlite`, `postgres` or `mysql`.
    pub fn kind(&self) -> &'static str {
        match self {
            DatabaseUrl::Sqlite(_) => "sqlite",
            DatabaseUrl::Postgres(_) => "postgres",
            DatabaseUrl::MySql(_) => "mysql",
        }
    }
}
