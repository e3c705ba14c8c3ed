-- Idempotency records (stormguard-idempotency). Times are epoch milliseconds chosen by the
-- application's clock, never the database's.
CREATE TABLE IF NOT EXISTS stormguard_idempotency (
    tenant           TEXT    NOT NULL,
    idem_key         TEXT    NOT NULL,
    state            INTEGER NOT NULL,          -- 0 in flight, 1 completed, 2 completed, response too large
    fingerprint      BLOB    NOT NULL,          -- SHA-256 of the request
    lease_token      INTEGER NOT NULL,          -- fencing token of the current (or last) holder
    lease_until      INTEGER NOT NULL,
    expires_at       INTEGER NOT NULL,          -- retention end
    created_at       INTEGER NOT NULL,
    status           INTEGER,
    headers          BLOB,
    body             BLOB,
    PRIMARY KEY (tenant, idem_key)
);
CREATE INDEX IF NOT EXISTS stormguard_idempotency_expires ON stormguard_idempotency (expires_at);
