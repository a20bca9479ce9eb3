// Package sim is the deterministic simulator: fleets of instances of one
// consumer group, their actors driven through their step functions (the
// registrar, heartbeats, refresher, range and exception claimers) against a
// real PostgreSQL schema, one clock.Mock whose time reaches every statement,
// and one seeded PRNG that decides which actor steps next, when instances
// start, stop and crash, when heartbeats are late, when producers produce,
// how handlers end, when a claim's key acquisition comes back (the serve
// loop runs it beside the claimer: a third of random claims leave it
// pending for a later acquire step), when a range claimer's flush and
// reconcile ticks run (a flush looks whether its key gate is wanted,
// decision 0051) and how far the clock moves. A third of the seeds start
// with one instance, the fleet in which a range claimer takes the key
// gate. Nothing runs on another goroutine, so a seed replays exactly: the
// trace of a run is a function of its seed.
//
// Runs come two ways: scripts (testdata/*.sim, a small command language,
// see World.Exec), whose traces are committed as golden files, and random
// runs (World.RunRandom). Either way every invariant (invariants.go) is
// checked after every step, and each has a broken variant — a test-only
// fault switch in the engine (claimer.Broken) or the driver — that the
// tests show it catches.
//
// What the simulator does not model: concurrent handlers inside one
// instance (jobs run one at a time, in an order the PRNG picks), database
// outages (the chaos run covers those), and wall-clock effects such as slow
// statements.
//
// It is a test tool, not an API for users.
package sim
