-- Messages of an outstanding range that already have an outcome although an
-- earlier message of the range has none yet (settled beyond its prefix): the
-- ids of the log rows, recorded with the range's progress, so a reclaimer
-- delivers only what had not settled. At most the claim's batch size
-- (BatchLimit) entries; the prefix itself moves lo_xid/lo_id instead.
ALTER TABLE {{schema}}.{{t}}_range ADD COLUMN settled bigint[] NOT NULL DEFAULT '{}';
