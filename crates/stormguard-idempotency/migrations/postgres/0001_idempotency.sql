-- Idempotency records (stormguard-idempotency). Times are epoch milliseconds chosen by the
-- application's clock, never the database's.
CREATE TABLE IF NOT EXISTS stormguard_idempotency (
    tenant           TEXT    NOT NULL,
    idem_key         TEXT    NOT NULL,
    state            BIGINT  NOT NULL,          -- 0 in flight, 1 completed, 2 completed, response too large
    fingerprint      BYTEA   NOT NULL,
    lease_token      BIGINT  NOT NULL,
    lease_until      BIGINT  NOT NULL,
    expires_at       BIGINT  NOT NULL,
    created_at       BIGINT  NOT NULL,
    status           BIGINT,
    headers          BYTEA,
    body             BYTEA,
    PRIMARY KEY (tenant, idem_key)
);
CREATE INDEX IF NOT EXISTS stormguard_idempotency_expires ON stormguard_idempotency (expires_at);
