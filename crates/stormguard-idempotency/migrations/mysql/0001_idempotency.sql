-- Idempotency records (stormguard-idempotency). Times are epoch milliseconds chosen by the
-- application's clock, never the database's. Keys and tenants compare byte for byte.
CREATE TABLE IF NOT EXISTS stormguard_idempotency (
    tenant           VARBINARY(255) NOT NULL,
    idem_key         VARBINARY(255) NOT NULL,
    state            BIGINT         NOT NULL,   -- 0 in flight, 1 completed, 2 completed, response too large
    fingerprint      BINARY(32)     NOT NULL,
    lease_token      BIGINT         NOT NULL,
    lease_until      BIGINT         NOT NULL,
    expires_at       BIGINT         NOT NULL,
    created_at       BIGINT         NOT NULL,
    status           BIGINT,
    headers          BLOB,
    body             LONGBLOB,
    PRIMARY KEY (tenant, idem_key),
    KEY stormguard_idempotency_expires (expires_at)
) ENGINE = InnoDB;
