package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// Binding declaration outcomes.
const (
	BindingInstalled = "installed" // this attempt installed (or swapped in) the set
	BindingJoined    = "joined"    // the stored set is the same: nothing written
	BindingWaiting   = "waiting"   // a live incumbent holds a different set
)

// BindingRequest is one Register attempt's declaration of a group's set.
type BindingRequest struct {
	Patterns   []string // normalized: sorted, distinct
	Regexes    []string // Patterns translated for the database, same order
	DeclaredBy string
	// DeclaredAt is when this declarer first stated the set (nil on its
	// first attempt: the database's now, returned in the result).
	DeclaredAt *time.Time
	// Instances are inserted in the same transaction when the attempt
	// installs or joins, so the instance holds a live heartbeat from the
	// moment its set is in force and no other declarer can swap in between.
	Instances []InstanceInsert
	Now       Now
}

// InstanceInsert is a worker_instance row to create.
type InstanceInsert struct {
	ID             string
	WorkerConfigID int64
	TTL            time.Duration
}

// BindingResult is what an attempt found and did.
type BindingResult struct {
	Outcome string
	// Installed is the group's set after the attempt (nil when none was
	// ever declared and the attempt waited, which cannot happen).
	Installed     []string
	DeclarationID int64 // the installed row in force
	Live          int   // live worker instances holding the installed set (two a Consume session)
	Sessions      int   // live Consume sessions holding it (their message consumers' instances)
	DeclaredAt    time.Time
}

// DeclareBindings runs one attempt of seed 0511 in one transaction that
// locks the group row (so concurrent installers serialize): same set or
// none stored → join or install; a different set while any live worker
// instance of the group exists → append a waiting row; a different set with
// none → swap the binding rows and append an installed row.
func (g Group) DeclareBindings(ctx context.Context, req BindingRequest) (BindingResult, error) {
	st := g.st
	var res BindingResult
	err := pgx.BeginFunc(ctx, st.pool, func(tx pgx.Tx) error {
		res = BindingResult{}
		if err := tx.QueryRow(ctx, st.sql(`-- store.DeclareBindings
SELECT coalesce($2, coalesce($3, now())) FROM %[1]s.consumer_group_config WHERE id = $1 FOR UPDATE`),
			g.GroupID, req.DeclaredAt, req.Now).Scan(&res.DeclaredAt); err != nil {
			return fmt.Errorf("lock group row: %w", err)
		}
		var current []string
		err := tx.QueryRow(ctx, g.sql(currentBindingsSQL), g.GroupID).Scan(&res.DeclarationID, &current)
		stored := err == nil
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("read installed set: %w", err)
		}
		switch {
		case stored && slices.Equal(current, req.Patterns):
			res.Outcome, res.Installed = BindingJoined, current
		case stored:
			if err := tx.QueryRow(ctx, st.sql(`-- store.DeclareBindings
SELECT count(*), count(*) FILTER (WHERE w.name = $3)
FROM %[1]s.worker_instance i JOIN %[1]s.worker_config w ON w.id = i.worker_config_id
WHERE w.consumer_group_id = $1 AND i.expires_at > coalesce($2, now())`), g.GroupID, req.Now, WorkerMessageConsumer).Scan(&res.Live, &res.Sessions); err != nil {
				return fmt.Errorf("count live instances: %w", err)
			}
			if res.Live > 0 {
				res.Outcome, res.Installed = BindingWaiting, current
				if _, err := tx.Exec(ctx, g.sql(appendDeclarationSQL), g.GroupID, BindingWaiting, req.Patterns,
					req.DeclaredBy, res.DeclaredAt, req.Now); err != nil {
					return fmt.Errorf("append waiting row: %w", err)
				}
				return nil
			}
			fallthrough
		default:
			res.Outcome, res.Installed = BindingInstalled, req.Patterns
			if err := tx.QueryRow(ctx, g.sql(installBindingsSQL), g.GroupID, req.Patterns,
				req.DeclaredBy, res.DeclaredAt, req.Now).Scan(&res.DeclarationID); err != nil {
				return fmt.Errorf("install set: %w", err)
			}
			if _, err := tx.Exec(ctx, g.sql(swapBindingsSQL), g.GroupID, req.Patterns, req.Regexes, res.DeclarationID); err != nil {
				return fmt.Errorf("install set: swap binding rows: %w", err)
			}
		}
		for _, in := range req.Instances {
			if _, err := tx.Exec(ctx, st.sql(`-- store.DeclareBindings
INSERT INTO %[1]s.worker_instance (id, worker_config_id, declared_by, started_at, heartbeat_at, expires_at)
VALUES ($1::uuid, $2, $3, coalesce($4, now()), coalesce($4, now()), coalesce($4, now()) + $5::interval)`),
				in.ID, in.WorkerConfigID, req.DeclaredBy, req.Now, in.TTL); err != nil {
				return fmt.Errorf("insert worker instance: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		return BindingResult{}, fmt.Errorf("declare bindings: %w", err)
	}
	return res, nil
}

// LedgerRow is one row of the binding declaration ledger.
type LedgerRow struct {
	ID         int64
	Status     string
	Patterns   []string
	DeclaredBy string
	DeclaredAt time.Time
	AttemptAt  time.Time
}

// BindingLedger returns the group's newest installed row (if any) and each
// declarer's newest waiting row after it.
func (g Group) BindingLedger(ctx context.Context) (installed *LedgerRow, waiting []LedgerRow, err error) {
	rows, err := g.st.q().Query(ctx, g.sql(ledgerSQL), g.GroupID)
	if err != nil {
		return nil, nil, fmt.Errorf("binding ledger: %w", err)
	}
	all, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (LedgerRow, error) {
		var l LedgerRow
		err := r.Scan(&l.ID, &l.Status, &l.Patterns, &l.DeclaredBy, &l.DeclaredAt, &l.AttemptAt)
		return l, err
	})
	if err != nil {
		return nil, nil, fmt.Errorf("binding ledger: %w", err)
	}
	for i := range all {
		if all[i].Status == BindingInstalled {
			installed = &all[i]
		} else {
			waiting = append(waiting, all[i])
		}
	}
	return installed, waiting, nil
}

// BindingsInForce returns the declaration a claim made now would filter by
// (0: no bindings, the whole stream) and its patterns.
func (g Group) BindingsInForce(ctx context.Context) (int64, []string, error) {
	var id int64
	var set []string
	if err := g.st.q().QueryRow(ctx, g.sql(bindingsInForceSQL), g.GroupID).Scan(&id, &set); err != nil {
		return 0, nil, fmt.Errorf("bindings in force: %w", err)
	}
	return id, set, nil
}

// LedgerRows returns every row of the group's binding declaration ledger,
// oldest first.
func (g Group) LedgerRows(ctx context.Context) ([]LedgerRow, error) {
	rows, err := g.st.pool.Query(ctx, g.sql(ledgerAllSQL), g.GroupID)
	if err != nil {
		return nil, fmt.Errorf("ledger rows: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (LedgerRow, error) {
		var l LedgerRow
		err := r.Scan(&l.ID, &l.Status, &l.Patterns, &l.DeclaredBy, &l.DeclaredAt, &l.AttemptAt)
		return l, err
	})
}

// The binding statements.

var currentBindingsSQL = perStream(`-- store.DeclareBindings
SELECT id, patterns FROM {s}.{t}_binding_declaration
WHERE group_id = $1 AND status = 'installed'
ORDER BY id DESC LIMIT 1`)

// The ledger is append-only: these two statements are the only ones
// that write it, and both only insert.
var appendDeclarationSQL = perStream(`-- store.DeclareBindings
INSERT INTO {s}.{t}_binding_declaration (group_id, status, patterns, declared_by, declared_at, attempt_at)
VALUES ($1, $2, $3, $4, $5, coalesce($6, now()))`)

var installBindingsSQL = perStream(`-- store.DeclareBindings
INSERT INTO {s}.{t}_binding_declaration (group_id, status, patterns, declared_by, declared_at, attempt_at)
VALUES ($1, 'installed', $2, $3, $4, coalesce($5, now()))
RETURNING id`)

// Swap the binding rows to the installed declaration $4, in the
// transaction that appended it. Sibling CTEs do not see each other's
// deletes, so the rows of patterns both sets share are updated in
// place, never deleted and inserted again (which collided on the
// primary key: the simulator's rolling-deploy scenario found it).
var swapBindingsSQL = perStream(`-- store.DeclareBindings
WITH gone AS (
    DELETE FROM {s}.{t}_binding WHERE group_id = $1 AND pattern <> ALL ($2::text[])
)
INSERT INTO {s}.{t}_binding AS b (group_id, pattern, regex, declaration_id)
SELECT $1, p.pattern, p.regex, $4 FROM unnest($2::text[], $3::text[]) AS p(pattern, regex)
ON CONFLICT (group_id, pattern) DO UPDATE SET regex = EXCLUDED.regex, declaration_id = EXCLUDED.declaration_id`)

// The newest installed row, and each declarer's newest waiting row
// after it.
var ledgerSQL = perStream(`-- store.BindingLedger
WITH inst AS (
    SELECT id, status, patterns, declared_by, declared_at, attempt_at
    FROM {s}.{t}_binding_declaration
    WHERE group_id = $1 AND status = 'installed'
    ORDER BY id DESC LIMIT 1
), waits AS (
    SELECT DISTINCT ON (declared_by) id, status, patterns, declared_by, declared_at, attempt_at
    FROM {s}.{t}_binding_declaration
    WHERE group_id = $1 AND status = 'waiting' AND id > coalesce((SELECT id FROM inst), 0)
    ORDER BY declared_by, id DESC
)
SELECT id, status, patterns, declared_by, declared_at, attempt_at FROM inst
UNION ALL
SELECT id, status, patterns, declared_by, declared_at, attempt_at FROM waits
ORDER BY id`)

var bindingsInForceSQL = perStream(`-- store.BindingsInForce
SELECT coalesce(max(declaration_id), 0), coalesce(array_agg(pattern ORDER BY pattern), '{}')
FROM {s}.{t}_binding WHERE group_id = $1`)

var ledgerAllSQL = perStream(`-- store.LedgerRows
SELECT id, status, patterns, declared_by, declared_at, attempt_at
FROM {s}.{t}_binding_declaration WHERE group_id = $1 ORDER BY id`)
