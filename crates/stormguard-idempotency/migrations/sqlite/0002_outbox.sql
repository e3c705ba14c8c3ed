-- Transactional outbox and consumer inbox (stormguard-idempotency exactly-once helpers).
CREATE TABLE IF NOT EXISTS stormguard_outbox (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id     TEXT    NOT NULL UNIQUE,
    topic        TEXT    NOT NULL,
    payload      BLOB    NOT NULL,
    created_at   INTEGER NOT NULL,
    published_at INTEGER,
    attempts     INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS stormguard_outbox_pending ON stormguard_outbox (published_at, id);
CREATE TABLE IF NOT EXISTS stormguard_inbox (
    consumer     TEXT    NOT NULL,
    event_id     TEXT    NOT NULL,
    processed_at INTEGER NOT NULL,
    PRIMARY KEY (consumer, event_id)
);
