-- The log becomes a table partitioned by xid into chunks, so retention drops
-- whole chunks instead of deleting rows (docs/decisions/0011-log-chunks.md).
-- The table the first version created becomes the DEFAULT partition: it keeps
-- the rows it holds, catches every xid no chunk covers (before the manager
-- made the first chunk, or when it fell behind), and holds the messages of
-- dead letters whose chunk was dropped. The manager's retention worker
-- creates chunks ahead of the current xid and drops them behind every
-- group's committed position once every row in them is past the TTL.
ALTER TABLE {{schema}}.{{t}}_log RENAME TO {{t}}_log_default;
ALTER INDEX {{schema}}.{{t}}_log_pkey RENAME TO {{t}}_log_default_pkey;

CREATE TABLE {{schema}}.{{t}}_log (
    id           bigint      GENERATED ALWAYS AS IDENTITY (SEQUENCE NAME {{schema}}.{{t}}_log_seq),
    xid          bigint      NOT NULL DEFAULT (pg_current_xact_id()::text::bigint),
    produced_at  timestamptz NOT NULL,
    version      int         NOT NULL,
    routing_key  text,
    message_key  text,
    payload      json        NOT NULL,
    options      jsonb,
    PRIMARY KEY (xid, id)
) PARTITION BY RANGE (xid);

-- Ids continue where the first table's identity stopped.
SELECT setval('{{schema}}.{{t}}_log_seq'::regclass, s.last_value, s.is_called)
FROM {{schema}}.{{t}}_log_id_seq s;
ALTER TABLE {{schema}}.{{t}}_log_default ALTER COLUMN id DROP IDENTITY;
-- Payloads are stored as json (validated text), not jsonb: the log only
-- stores and returns them, and jsonb's parse on insert and print on every
-- claim were the server's largest per-message costs (decision 0012). A
-- consumer gets back the exact bytes produced.
ALTER TABLE {{schema}}.{{t}}_log_default ALTER COLUMN payload TYPE json USING payload::json;
ALTER TABLE {{schema}}.{{t}}_log ATTACH PARTITION {{schema}}.{{t}}_log_default DEFAULT;

-- The chunks: one row per partition other than the default, written in the
-- transaction that attaches or drops it. Positions with lo_xid <= xid <
-- hi_xid live in table {{t}}_log_<lo_xid>.
CREATE TABLE {{schema}}.{{t}}_chunk (
    lo_xid      bigint      PRIMARY KEY,
    hi_xid      bigint      NOT NULL,
    created_at  timestamptz NOT NULL
);
