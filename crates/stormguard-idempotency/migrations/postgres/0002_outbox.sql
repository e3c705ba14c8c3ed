-- Transactional outbox and consumer inbox (stormguard-idempotency exactly-once helpers).
CREATE TABLE IF NOT EXISTS stormguard_outbox (
    id           BIGINT  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id     TEXT    NOT NULL UNIQUE,
    topic        TEXT    NOT NULL,
    payload      BYTEA   NOT NULL,
    created_at   BIGINT  NOT NULL,
    published_at BIGINT,
    attempts     BIGINT  NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS stormguard_outbox_pending ON stormguard_outbox (id) WHERE published_at IS NULL;
CREATE TABLE IF NOT EXISTS stormguard_inbox (
    consumer     TEXT    NOT NULL,
    event_id     TEXT    NOT NULL,
    processed_at BIGINT  NOT NULL,
    PRIMARY KEY (consumer, event_id)
);
