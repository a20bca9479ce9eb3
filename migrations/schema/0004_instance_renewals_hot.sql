-- Heartbeats update every live worker_instance row every InstanceTTL/3
-- (store.RenewInstances: a process's rows in one statement, decision 0039).
-- An update that changes no indexed column and finds room on its page is a
-- HOT update: no new index entries, less WAL, less for autovacuum. The
-- worker's index therefore no longer carries expires_at (the live
-- instances of one worker are a handful of rows, filtered on the heap), and
-- the table leaves half of each page free for the next versions.
DROP INDEX {{schema}}.worker_instance_config_idx;
CREATE INDEX worker_instance_config_idx ON {{schema}}.worker_instance (worker_config_id);
ALTER TABLE {{schema}}.worker_instance SET (fillfactor = 50);
