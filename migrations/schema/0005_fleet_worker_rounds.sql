-- When a fleet worker's last round began (any holder's, the database's
-- clock). A worker's interval is the fleet's cadence, not each holder's: a
-- process that takes a slot over (a restart, a rolling deploy, a takeover
-- after a crash) starts its first round when the last one is an interval
-- old, instead of at once (store.BeginRound). NULL: no round yet.
ALTER TABLE {{schema}}.worker_config ADD COLUMN last_round_at timestamptz;
