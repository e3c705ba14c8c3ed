-- Transactional outbox and consumer inbox (stormguard-idempotency exactly-once helpers).
CREATE TABLE IF NOT EXISTS stormguard_outbox (
    id           BIGINT         NOT NULL AUTO_INCREMENT PRIMARY KEY,
    event_id     VARBINARY(255) NOT NULL,
    topic        VARBINARY(255) NOT NULL,
    payload      LONGBLOB       NOT NULL,
    created_at   BIGINT         NOT NULL,
    published_at BIGINT,
    attempts     BIGINT         NOT NULL DEFAULT 0,
    UNIQUE KEY stormguard_outbox_event (event_id),
    KEY stormguard_outbox_pending (published_at, id)
) ENGINE = InnoDB;
CREATE TABLE IF NOT EXISTS stormguard_inbox (
    consumer     VARBINARY(255) NOT NULL,
    event_id     VARBINARY(255) NOT NULL,
    processed_at BIGINT         NOT NULL,
    PRIMARY KEY (consumer, event_id)
) ENGINE = InnoDB;
