-- Metric-driven rules, one row per rule of a service: the rule as the API accepted it (JSON,
-- checked by stormguard::rules before it is written).
CREATE TABLE center_rules (
    service    TEXT   NOT NULL,
    name       TEXT   NOT NULL,
    rule       TEXT   NOT NULL,
    updated_ms BIGINT NOT NULL,
    PRIMARY KEY (service, name)
);
