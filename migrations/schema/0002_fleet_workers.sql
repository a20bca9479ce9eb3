-- Fleet workers that belong to no consumer group (the manager's: retention,
-- pruning): one worker_config row per name. Its metadata document holds the
-- worker's knobs, including how many instances the fleet should run.
CREATE UNIQUE INDEX worker_config_fleet_name_idx ON {{schema}}.worker_config (name)
    WHERE consumer_group_id IS NULL;
