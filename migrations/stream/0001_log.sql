-- One stream's own tables. {{t}} is the stream's table prefix (stream_<id>).

-- The log. A message's position is (xid, id): xid is the producing
-- transaction's id, and claims read only xids below the snapshot's xmin, so a
-- position handed out is final (see docs/decisions/0001-claim-gate.md).
CREATE TABLE {{schema}}.{{t}}_log (
    id           bigint      GENERATED ALWAYS AS IDENTITY,
    xid          bigint      NOT NULL DEFAULT (pg_current_xact_id()::text::bigint),
    produced_at  timestamptz NOT NULL,
    version      int         NOT NULL,
    routing_key  text,
    message_key  text,
    payload      jsonb       NOT NULL,
    options      jsonb,
    PRIMARY KEY (xid, id)
) WITH (fillfactor = 100);

-- Idempotent produce: a caller key maps to the message it first produced.
CREATE TABLE {{schema}}.{{t}}_idempotency (
    key         text        PRIMARY KEY,
    message_id  bigint      NOT NULL,
    created_at  timestamptz NOT NULL
);

-- Per group: the head is the highest position handed out in a range.
CREATE TABLE {{schema}}.{{t}}_cursor (
    group_id    bigint      PRIMARY KEY,
    head_xid    bigint      NOT NULL,
    head_id     bigint      NOT NULL,
    updated_at  timestamptz NOT NULL
);

-- A leased range: positions in ((lo_xid, lo_id), (hi_xid, hi_id)]. The row
-- exists until the range is committed; token fences a lost lease.
CREATE TABLE {{schema}}.{{t}}_range (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    group_id    bigint      NOT NULL,
    lo_xid      bigint      NOT NULL,
    lo_id       bigint      NOT NULL,
    hi_xid      bigint      NOT NULL,
    hi_id       bigint      NOT NULL,
    token       uuid        NOT NULL,
    owner       uuid        NOT NULL,
    claimed_at  timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    reclaims    int         NOT NULL DEFAULT 0
);
CREATE INDEX {{t}}_range_group_idx ON {{schema}}.{{t}}_range (group_id, expires_at);
CREATE INDEX {{t}}_range_owner_idx ON {{schema}}.{{t}}_range (owner);

-- A message that needs more than its range's single pass, per group: it
-- failed, timed out, was delayed, was quarantined, or waits behind an earlier
-- message of its ordered key. Retried by the exception consumer on the
-- group's curve; 'dead' when out of budget (a dead letter). attempts counts
-- failed attempts, delays the Delay results that spent no retry. token, owner
-- and expires_at are the lease of a 'running' row. concurrency is pinned at
-- the message's first claim.
CREATE TABLE {{schema}}.{{t}}_exception (
    group_id       bigint      NOT NULL,
    message_xid    bigint      NOT NULL,
    message_id     bigint      NOT NULL,
    message_key    text,
    concurrency    text        NOT NULL,
    status         text        NOT NULL,
    attempts       int         NOT NULL,
    delays         int         NOT NULL,
    last_error     text        NOT NULL,
    can_run_after  timestamptz NOT NULL,
    token          uuid,
    owner          uuid,
    expires_at     timestamptz,
    created_at     timestamptz NOT NULL,
    updated_at     timestamptz NOT NULL,
    PRIMARY KEY (group_id, message_xid, message_id)
);
CREATE INDEX {{t}}_exception_due_idx ON {{schema}}.{{t}}_exception (group_id, can_run_after)
    WHERE status <> 'dead';
CREATE INDEX {{t}}_exception_key_idx ON {{schema}}.{{t}}_exception (group_id, message_key, message_xid, message_id)
    WHERE message_key IS NOT NULL AND status <> 'dead';
CREATE INDEX {{t}}_exception_owner_idx ON {{schema}}.{{t}}_exception (owner) WHERE owner IS NOT NULL;

-- Key leases: at most one in-flight message per key of an exclusive or
-- ordered message, across the group. A key is held while its owner's
-- worker_instance is live; released in the transaction that settles the
-- message. expires_at records the claim's lease for inspection only.
CREATE TABLE {{schema}}.{{t}}_key_lease (
    group_id     bigint      NOT NULL,
    message_key  text        NOT NULL,
    token        uuid        NOT NULL,
    owner        uuid        NOT NULL,
    expires_at   timestamptz NOT NULL,
    PRIMARY KEY (group_id, message_key)
);
CREATE INDEX {{t}}_key_lease_owner_idx ON {{schema}}.{{t}}_key_lease (owner);
-- Settling a range or an exception row deletes its keys by token.
CREATE INDEX {{t}}_key_lease_token_idx ON {{schema}}.{{t}}_key_lease (token);

-- The delivery log: one row per handled attempt (ConsumerConfig.DeliveryLog
-- decides which), written in the transaction that settles it.
CREATE TABLE {{schema}}.{{t}}_delivery (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    group_id     bigint      NOT NULL,
    message_xid  bigint      NOT NULL,
    message_id   bigint      NOT NULL,
    attempt      int         NOT NULL,
    outcome      text        NOT NULL,
    error        text        NOT NULL,
    at           timestamptz NOT NULL
);
CREATE INDEX {{t}}_delivery_message_idx ON {{schema}}.{{t}}_delivery (group_id, message_id);
CREATE INDEX {{t}}_delivery_at_idx ON {{schema}}.{{t}}_delivery (at);

-- The effective binding set of each group (seed 0511): the only place claims
-- read it. Only the install/swap transaction writes these rows. A group with
-- no rows receives the whole stream. regex is the pattern translated for
-- matching against '.' || routing_key (internal/topic).
CREATE TABLE {{schema}}.{{t}}_binding (
    group_id        bigint NOT NULL,
    pattern         text   NOT NULL,
    regex           text   NOT NULL,
    declaration_id  bigint NOT NULL,
    PRIMARY KEY (group_id, pattern)
);

-- The binding declaration ledger: one row per Register attempt that
-- installed a set or waited on a live incumbent's different set. Append-only:
-- no statement ever updates it.
CREATE TABLE {{schema}}.{{t}}_binding_declaration (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    group_id     bigint      NOT NULL,
    status       text        NOT NULL,
    patterns     text[]      NOT NULL,
    declared_by  text        NOT NULL,
    declared_at  timestamptz NOT NULL,
    attempt_at   timestamptz NOT NULL
);
CREATE INDEX {{t}}_binding_declaration_group_idx ON {{schema}}.{{t}}_binding_declaration (group_id, status, id);
