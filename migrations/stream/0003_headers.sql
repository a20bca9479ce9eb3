-- Message headers (trace context and the like): a sparse JSON object of
-- string values, set by the producer, read by consumers through Meta.
-- Added to the partitioned log, so every chunk has it too.
ALTER TABLE {{schema}}.{{t}}_log ADD COLUMN headers jsonb;
