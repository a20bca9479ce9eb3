-- Shared tables of one sqlstreams schema: the stream and group registries and
-- the worker fleet. Per-stream tables come from the stream/ templates.

CREATE TABLE {{schema}}.stream_config (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name        text        NOT NULL UNIQUE,
    config      jsonb       NOT NULL DEFAULT '{}',
    created_at  timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL
);

CREATE TABLE {{schema}}.stream_config_log (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    stream_id    bigint      NOT NULL REFERENCES {{schema}}.stream_config (id) ON DELETE CASCADE,
    config       jsonb       NOT NULL,
    declared_by  text        NOT NULL,
    declared_at  timestamptz NOT NULL
);

-- Which template versions a stream's tables have; Stream.Register applies
-- the missing ones.
CREATE TABLE {{schema}}.stream_migration (
    stream_id   bigint      NOT NULL REFERENCES {{schema}}.stream_config (id) ON DELETE CASCADE,
    version     int         NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (stream_id, version)
);

CREATE TABLE {{schema}}.consumer_group_config (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    stream_id   bigint      NOT NULL REFERENCES {{schema}}.stream_config (id) ON DELETE CASCADE,
    name        text        NOT NULL UNIQUE,
    start       text        NOT NULL,
    created_at  timestamptz NOT NULL
);

-- One row per kind of job a group needs done; metadata is the declared config.
CREATE TABLE {{schema}}.worker_config (
    id                 bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer_group_id  bigint      REFERENCES {{schema}}.consumer_group_config (id) ON DELETE CASCADE,
    name               text        NOT NULL,
    metadata           jsonb       NOT NULL DEFAULT '{}',
    updated_at         timestamptz NOT NULL,
    UNIQUE (consumer_group_id, name)
);

CREATE TABLE {{schema}}.worker_config_log (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    worker_config_id  bigint      NOT NULL REFERENCES {{schema}}.worker_config (id) ON DELETE CASCADE,
    metadata          jsonb       NOT NULL,
    declared_by       text        NOT NULL,
    declared_at       timestamptz NOT NULL
);

-- A running process doing one worker's job. expires_at is its heartbeat: a
-- row past it belongs to a dead or partitioned process.
CREATE TABLE {{schema}}.worker_instance (
    id                uuid        PRIMARY KEY,
    worker_config_id  bigint      NOT NULL REFERENCES {{schema}}.worker_config (id) ON DELETE CASCADE,
    declared_by       text        NOT NULL,
    started_at        timestamptz NOT NULL,
    heartbeat_at      timestamptz NOT NULL,
    expires_at        timestamptz NOT NULL
);
CREATE INDEX worker_instance_config_idx ON {{schema}}.worker_instance (worker_config_id, expires_at);
