//! The tables, the one part of the store written per database (types, keys, engine).

pub(super) const SQLITE_TABLES: &str = "
CREATE TABLE IF NOT EXISTS payment_orders (
    out_trade_no TEXT    NOT NULL PRIMARY KEY,
    trade_no     TEXT    NOT NULL,
    amount       INTEGER NOT NULL,
    status       TEXT    NOT NULL,
    paid_at      INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS payment_notifications (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id     TEXT    NOT NULL,
    out_trade_no TEXT    NOT NULL,
    applied_at   INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS payment_broker (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id     TEXT    NOT NULL,
    topic        TEXT    NOT NULL,
    payload      BLOB    NOT NULL,
    published_at INTEGER NOT NULL,
    acked_at     INTEGER
);
CREATE INDEX IF NOT EXISTS payment_broker_unacked ON payment_broker (acked_at, id);";

pub(super) const POSTGRES_TABLES: &str = "
CREATE TABLE IF NOT EXISTS payment_orders (
    out_trade_no VARCHAR(64)  NOT NULL PRIMARY KEY,
    trade_no     VARCHAR(64)  NOT NULL,
    amount       BIGINT       NOT NULL,
    status       VARCHAR(16)  NOT NULL,
    paid_at      BIGINT       NOT NULL
);
CREATE TABLE IF NOT EXISTS payment_notifications (
    id           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id     VARCHAR(255) NOT NULL,
    out_trade_no VARCHAR(64)  NOT NULL,
    applied_at   BIGINT       NOT NULL
);
CREATE TABLE IF NOT EXISTS payment_broker (
    id           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id     VARCHAR(255) NOT NULL,
    topic        VARCHAR(255) NOT NULL,
    payload      BYTEA        NOT NULL,
    published_at BIGINT       NOT NULL,
    acked_at     BIGINT
);
CREATE INDEX IF NOT EXISTS payment_broker_unacked ON payment_broker (id) WHERE acked_at IS NULL;";

// Order numbers compare byte for byte (ascii_bin): under a case-insensitive collation
// "A-1" and "a-1" would be one primary key.
pub(super) const MYSQL_TABLES: &str = "
CREATE TABLE IF NOT EXISTS payment_orders (
    out_trade_no VARCHAR(64)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    trade_no     VARCHAR(64)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    amount       BIGINT       NOT NULL,
    status       VARCHAR(16)  NOT NULL,
    paid_at      BIGINT       NOT NULL
) ENGINE = InnoDB;
CREATE TABLE IF NOT EXISTS payment_notifications (
    id           BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    event_id     VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    out_trade_no VARCHAR(64)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    applied_at   BIGINT       NOT NULL,
    KEY payment_notifications_event (event_id)
) ENGINE = InnoDB;
CREATE TABLE IF NOT EXISTS payment_broker (
    id           BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    event_id     VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    topic        VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    payload      LONGBLOB     NOT NULL,
    published_at BIGINT       NOT NULL,
    acked_at     BIGINT,
    KEY payment_broker_unacked (acked_at, id)
) ENGINE = InnoDB;";
