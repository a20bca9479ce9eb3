// Package sim will hold the deterministic simulator: many instances' actors
// driven through their step functions against a real PostgreSQL, one mock
// clock and a seeded PRNG, with invariants checked after every step.
//
// Nothing lives here yet. The actors already expose step functions
// (claimer.Claim, claimer.Outcome, heartbeat.Step) and take an injected clock
// whose time reaches the database, which is what the simulator will drive.
package sim
