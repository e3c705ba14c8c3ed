-- A rule's standing is its newest rule-fire, rule-revert or rule-handoff record
-- (Store::last_rule_change: by service and actor `rule:<name>`, newest id first), read for
-- every rule at every restore and by the dashboard: without this index it scans all of the
-- service's records, ACKs included.
CREATE INDEX center_audit_actor ON center_audit (service, actor, id);
