-- The exception claim takes due rows through an index of pending rows only,
-- in due order, and rows whose lease lapsed through an index of leased rows,
-- in expiry order. The index of every unresolved row they replace held both,
-- so that the planner, on the statistics of a burst of failures not yet
-- analyzed, read every due row of the group and sorted them instead of
-- reading the first few in order (10 ms a claim at 20,000 rows).
DROP INDEX {{schema}}.{{t}}_exception_due_idx;
CREATE INDEX {{t}}_exception_pending_idx ON {{schema}}.{{t}}_exception (group_id, can_run_after)
    WHERE status = 'pending';
CREATE INDEX {{t}}_exception_leased_idx ON {{schema}}.{{t}}_exception (group_id, expires_at)
    WHERE status IN ('running', 'queued');
