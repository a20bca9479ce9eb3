-- Schedules: a cron expression that produces its payload to a stream at
-- each due time. The scheduler worker (a manager worker) produces every due
-- run exactly once across the fleet: it locks due rows with SKIP LOCKED and
-- produces idempotently, keyed by the schedule and the due time, in the
-- transaction that moves next_due.
CREATE TABLE {{schema}}.schedule (
    name         text        PRIMARY KEY,
    stream_id    bigint      NOT NULL REFERENCES {{schema}}.stream_config (id) ON DELETE CASCADE,
    expression   text        NOT NULL,
    zone         text        NOT NULL,
    missed       text        NOT NULL,
    version      int         NOT NULL,
    payload      jsonb       NOT NULL,
    suspended    boolean     NOT NULL DEFAULT false,
    next_due     timestamptz NOT NULL,
    last_due     timestamptz,
    created_at   timestamptz NOT NULL,
    updated_at   timestamptz NOT NULL
);
CREATE INDEX schedule_due_idx ON {{schema}}.schedule (next_due) WHERE NOT suspended;
