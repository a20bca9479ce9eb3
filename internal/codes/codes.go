// Package codes is the registry of the stable codes every WARN and ERROR the
// library logs carries (`code=SQLnnnn`), with what each means and what to do
// about it. docs/codes.md and `sqlstreams explain CODE` are generated from
// it, so an operator who sees a code in a log finds its page.
//
// Nothing in the library calls a logger's Warn or Error directly: it logs
// through a Code, which sets the level and the code attribute, and a test
// fails on any other WARN or ERROR call site. A code keeps its number for
// good; a retired number is never given to another meaning.
//
// It is part of the engine's inside, not an API for users.
package codes

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
)

// Code is one registered code.
type Code struct {
	// ID is the stable code, "SQL" and four digits.
	ID string
	// Level is the level every line with this code is logged at.
	Level slog.Level
	// Title is a one-line summary.
	Title string
	// Meaning says what happened and what the library did about it.
	Meaning string
	// Remedy says what an operator should do, if anything.
	Remedy string
}

// Log logs msg at the code's level with the code attribute first.
func (c Code) Log(ctx context.Context, logger *slog.Logger, msg string, args ...any) {
	if logger == nil {
		return
	}
	logger.Log(ctx, c.Level, msg, append([]any{"code", c.ID}, args...)...)
}

func (c Code) String() string { return c.ID }

var registry []Code

func register(id string, level slog.Level, title, meaning, remedy string) Code {
	c := Code{ID: id, Level: level, Title: title, Meaning: meaning, Remedy: remedy}
	registry = append(registry, c)
	return c
}

// All returns every registered code, in code order.
func All() []Code {
	out := slices.Clone(registry)
	slices.SortFunc(out, func(a, b Code) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// Lookup returns the code with id (case-insensitive; "59", "0059" and
// "SQL0059" all find SQL0059).
func Lookup(id string) (Code, bool) {
	id = strings.ToUpper(strings.TrimSpace(id))
	id = strings.TrimPrefix(id, "SQL")
	if len(id) > 0 && len(id) < 4 {
		id = strings.Repeat("0", 4-len(id)) + id
	}
	for _, c := range registry {
		if c.ID == "SQL"+id {
			return c, true
		}
	}
	return Code{}, false
}

// Markdown renders the registry as docs/codes.md.
func Markdown() string {
	var b strings.Builder
	b.WriteString("# Log codes\n\n")
	b.WriteString("Every WARN and ERROR line sqlstreams logs carries one of these codes as its `code` attribute.\n")
	b.WriteString("This page is generated from `internal/codes` (`go test ./internal/codes -update`); ")
	b.WriteString("`sqlstreams explain CODE` prints the same text.\n\n")
	b.WriteString("| code | level | summary |\n| --- | --- | --- |\n")
	for _, c := range All() {
		fmt.Fprintf(&b, "| [%s](#%s) | %s | %s |\n", c.ID, strings.ToLower(c.ID), c.Level, c.Title)
	}
	for _, c := range All() {
		fmt.Fprintf(&b, "\n## %s\n\n**%s** — %s\n\n%s\n\n**What to do:** %s\n", c.ID, c.Level, c.Title, c.Meaning, c.Remedy)
	}
	return b.String()
}

// Configuration and declarations.
var (
	ConfigRedeclared = register("SQL0059", slog.LevelWarn,
		"a stream's or consumer group's stored config was redeclared with different values",
		"Register stores the whole declared document and the newest declaration wins. The line names every "+
			"changed field (old → new) and who declared it. Running instances follow within one ConfigRefreshInterval.",
		"None if the change was meant. The same line on every restart means two services declare the same group "+
			"differently and overwrite each other: make one service the group's only declarer.")
	StartIgnored = register("SQL0060", slog.LevelWarn,
		"a consumer group's declared Start differs from the one its cursor was created with",
		"Start is read once, when the group's cursor is created; a later declaration's Start changes nothing.",
		"None, unless the group should start over: register a group under a new name (or seek it, when that verb exists).")
	BadWorkerKnobs = register("SQL0061", slog.LevelWarn,
		"a maintenance worker's declared knobs could not be read; their defaults apply",
		"The worker_config metadata document of a manager worker holds a field that does not parse. The worker keeps "+
			"running with the library defaults for the unreadable fields.",
		"Redeclare the worker's knobs with Manager().Declare.")
)

// The database.
var (
	StoreOutage = register("SQL0101", slog.LevelWarn,
		"a store call failed with a transient error; retrying with backoff",
		"A statement failed for a reason that usually passes by itself: the connection was lost (SQLSTATE class 08 "+
			"or a network error), the server is shutting down, restarting or not yet accepting connections "+
			"(57P01-57P03), too many connections (53300), a serialization failure or deadlock (40001, 40P01), or a "+
			"read-only transaction as right after a failover (25006). The actors keep their state and retry with "+
			"ClientConfig.Retry's backoff. A Consume session logs two lines an outage: one when its first actor fails "+
			"to reach the database, naming it and the error, and one when an actor reaches it again, with the "+
			"outage's length. "+
			"A session that has not reached its database for its InstanceTTL (a call failed, none succeeded since) is not ready.",
		"Check the database's availability. If it stays down for longer than InstanceTTL, other instances take over "+
			"this instance's leases once it lapses; nothing is lost.")
	StorePermanent = register("SQL0105", slog.LevelWarn,
		"a maintenance store call failed with an error retrying cannot fix",
		"A store call of a part that runs beside consuming (the manager's retention, pruning or scheduler "+
			"workers) failed with a missing schema, table or privilege. Consuming goes on; the part retries with "+
			"backoff and logs this once per outage. (A Consume session that meets such an error returns it instead.)",
		"Read the error: grant the privilege it names (README, Privileges), or run `sqlstreams migrate`. Run the "+
			"manager as the schema's owner if the application role may not create and drop log chunks.")
	ListenerLost = register("SQL0102", slog.LevelWarn,
		"the notification listener lost its connection; consumers poll until it is back",
		"Consumers are woken by LISTEN/NOTIFY when a stream is produced to. Without the listener they find new "+
			"messages at their next ClaimPollRate tick. The listener reconnects by itself.",
		"None; check the database if it repeats.")
	WakeFailed = register("SQL0103", slog.LevelWarn,
		"a produce or an operator's action committed but its wake-up notification failed",
		"The messages are written and safe (or the redrive, the seek is done). Consumers that were idle see them at their "+
			"next poll or sweep instead of at once.",
		"None; check the database if it repeats.")
	AlertFailed = register("SQL0104", slog.LevelWarn,
		"an alert could not be produced to the sqlstreams.alerts stream",
		"The condition the alert reports (a binding wait, a delivery stall) is also logged under its own code.",
		"Check the database; run System().Register if the alert stream should exist.")
)

// Delivery.
var (
	DeliveryStalled = register("SQL0201", slog.LevelWarn,
		"delivery stalled: committed messages wait behind an open transaction",
		"A claim hands out only positions whose producing transaction has ended, so a transaction left open holds "+
			"back every message produced after it started. The line names the blocking sessions (pid, application, "+
			"since when). Nothing is skipped or lost; delivery resumes when the transaction ends.",
		"Find the session by its pid in pg_stat_activity and end its transaction (commit, roll back, or "+
			"pg_terminate_backend). Set idle_in_transaction_session_timeout to bound such stalls.")
	RangeLeaseLost = register("SQL0202", slog.LevelWarn,
		"a range's lease was taken over by another instance before it was committed",
		"This instance's lease on a range of the log lapsed (its heartbeat stopped renewing for longer than "+
			"InstanceTTL) and another instance reclaimed the range. Nothing of this instance's work on it is written; "+
			"the reclaimer delivers the range again (at-least-once).",
		"Look for long pauses of this process (GC, CPU starvation, a frozen container) or database outages; raise "+
			"InstanceTTL if pauses are expected.")
	RangeQuarantined = register("SQL0203", slog.LevelWarn,
		"a range was quarantined: its messages are retried one by one",
		"A range was reclaimed more than MaxRangeReclaims times: its holders keep dying on it. Each of its messages "+
			"became its own exception row, so a poison message dies on its own retries and the others flow.",
		"Look at the dead letters and crash logs of the instances for the message that kills its process.")
	UnknownLeasesReleased = register("SQL0204", slog.LevelWarn,
		"let go of leases this instance held without knowing",
		"A claim's reply was lost to a cut connection after the claim committed. The lease would have been kept "+
			"alive by the heartbeat forever; it is handed back and another claim delivers its messages.",
		"None; it follows connection cuts.")
	ShutdownTimeout = register("SQL0205", slog.LevelWarn,
		"the shutdown timeout was reached with handlers still running; their work is handed back",
		"A graceful stop gives in-flight handlers ShutdownTimeout to finish. Those that did not are cancelled and "+
			"their messages handed back, to be delivered again by another instance.",
		"Raise ShutdownTimeout (or MessageMax.Timeout, or without a ceiling Message.Timeout, which it derives from) if handlers need longer.")
	HandBackFailed = register("SQL0206", slog.LevelWarn,
		"work in flight could not be handed back at shutdown",
		"The hand-back writes failed within the shutdown plan: a database out of reach (refused or cut connections) "+
			"is tried for a second after the handlers end, a busy or slow one until the plan's deadline. The line counts "+
			"what is left: ranges, their messages settled and not yet recorded, those without an outcome (or exception "+
			"rows and their unwritten results). The next Consume "+
			"session of the same consumer in this process writes what they settled and releases the rest when it "+
			"reaches the database; if there is none (the process exits), the leases lapse after InstanceTTL, as "+
			"after a crash, and another instance delivers their messages again. Nothing is lost.",
		"None; check the database.")
	HandlersLeftBehind = register("SQL0207", slog.LevelError,
		"handlers that ignore their context are still running after shutdown and are left behind",
		"Go cannot stop a goroutine. A handler that ignores its context's cancellation outlives its session; its "+
			"message is delivered again elsewhere and its late result settles nothing.",
		"Make the handler return when its ctx is done (pass ctx to every call that blocks).")
	StopOverran = register("SQL0208", slog.LevelError,
		"a session did not finish stopping within ShutdownTimeout plus the shutdown grace",
		"Consume returns at ShutdownTimeout plus a fixed grace whatever the database does; a part of the session "+
			"that had not stopped by then is left to finish on its own.",
		"Report it: every store call of a stopping session is bounded, so this should not happen.")
)

// The fleet.
var (
	BindingWaiting = register("SQL0301", slog.LevelWarn,
		"WAITING: a consumer group's binding set differs from the installed one while live instances hold it",
		"A changed binding set is installed only when no live instance of the group holds the old one (seed 0511). "+
			"The session waits, re-attempting every BindingRetryInterval, forever: it claims nothing, holds no "+
			"instance row and is not ready.",
		"Expected during a rolling deploy until the old instances stop. If two different applications declare the "+
			"same group with different bindings, give one of them another group name.")
	InstanceLost = register("SQL0302", slog.LevelWarn,
		"an instance's worker_instance row was gone at renewal",
		"Another process declared this instance dead (its heartbeat had lapsed) and its ranges may have been "+
			"reclaimed. The heartbeat registers the row again; writes of the earlier leases are fenced.",
		"Look for long pauses of this process or database outages longer than InstanceTTL.")
	IncarnationLost = register("SQL0306", slog.LevelWarn,
		"an instance's incarnation was lost; the session registers again under new instance ids",
		"A heartbeat found the instance's row lapsed or gone: the process did not renew it for longer than "+
			"InstanceTTL (a long pause, a frozen container, a partition from the database), and other instances "+
			"may hold its leases by now. The session stopped that incarnation's actors at once (they had started "+
			"nothing since their lease became doubtful), dropped what they held in memory, and registers again, "+
			"binding check included, as if it had just started. A handler already running when the pause began "+
			"cannot be recalled; its result settles nothing.",
		"Look for what paused the process (GC, CPU starvation, container freezes, network partitions); raise "+
			"InstanceTTL if such pauses are expected.")
	InstanceGiveBackFailed = register("SQL0303", slog.LevelWarn,
		"a stopping instance could not give its worker_instance row back",
		"The row lapses at its InstanceTTL instead; until then the group counts the instance as live (a changed "+
			"binding set waits that long).",
		"None; check the database.")
	ManagerSlotLost = register("SQL0304", slog.LevelWarn,
		"a manager lost its maintenance worker slot (its heartbeat lapsed)",
		"Another process may run the worker now; this one stops running it until it takes a slot again.",
		"Look for long pauses of this process or database outages.")
	ManagerGiveBackFailed = register("SQL0305", slog.LevelWarn,
		"a stopping manager could not give its worker slots back",
		"The slots lapse after the manager's InstanceTTL and another manager takes them over.",
		"None; check the database.")
)

// The actors' supervision.
var (
	ActorPanicked = register("SQL0401", slog.LevelError,
		"an actor panicked and is being restarted",
		"The supervisor recovered the panic and restarts the actor with its state rebuilt from the database; "+
			"leases it held are handed back first.",
		"Report it with the panic text and stack from this line.")
	ActorFailed = register("SQL0402", slog.LevelWarn,
		"an actor returned an error and is being restarted",
		"An actor's loop ended with an unexpected error; the supervisor restarts it.",
		"Report it if it repeats.")
	ActorsBackingOff = register("SQL0403", slog.LevelWarn,
		"actors are failing too often; the supervisor backs off before restarting them",
		"More than the supervisor's failure threshold of restarts happened in a short time.",
		"Look at the SQL0401 and SQL0402 lines before it.")
	ActorStopTimeout = register("SQL0404", slog.LevelError,
		"an actor did not stop in time",
		"The supervisor gave up waiting for an actor to stop; its goroutine is left to finish on its own.",
		"Report it: actors stop when their context ends.")
)
