-- Every published version of every service: immutable once written.
CREATE TABLE center_versions (
    service     TEXT    NOT NULL,
    version     BIGINT  NOT NULL,
    hash        TEXT    NOT NULL,
    policy      TEXT    NOT NULL,
    author      TEXT    NOT NULL,
    message     TEXT    NOT NULL,
    diff        TEXT    NOT NULL,
    rollback_of BIGINT,
    created_ms  BIGINT  NOT NULL,
    PRIMARY KEY (service, version)
);

-- Which version each service's instances should run: the stable one, and a canary with the
-- instances it is for.
CREATE TABLE center_services (
    service  TEXT   PRIMARY KEY,
    stable   BIGINT,
    canary   BIGINT,
    selector TEXT
);

-- The instances that watched or acknowledged, and what they last said.
CREATE TABLE center_instances (
    service    TEXT   NOT NULL,
    instance   TEXT   NOT NULL,
    labels     TEXT   NOT NULL,
    version    BIGINT,
    applied    BIGINT,
    reason     TEXT,
    seen_ms    BIGINT NOT NULL,
    PRIMARY KEY (service, instance)
);

CREATE TABLE center_audit (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    at_ms    BIGINT  NOT NULL,
    actor    TEXT    NOT NULL,
    action   TEXT    NOT NULL,
    service  TEXT    NOT NULL,
    version  BIGINT,
    instance TEXT,
    detail   TEXT    NOT NULL
);
CREATE INDEX center_audit_service ON center_audit (service, id);

-- Bearer tokens, by the SHA-256 of the token (the token itself is never stored).
CREATE TABLE center_tokens (
    hash       TEXT   PRIMARY KEY,
    name       TEXT   NOT NULL,
    role       TEXT   NOT NULL,
    service    TEXT,
    created_ms BIGINT NOT NULL
);
