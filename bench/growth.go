package main

// Growth: does a stream that retains millions of already-consumed rows burn
// down a fresh backlog as fast as a small one? And what dead tuples does the
// whole run leave behind?

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/c1702965/sqlstreams"
)

// fillRetained writes rows messages of the benchmark payload straight into
// a stream's log, server-side, in statements of at most a million rows: the
// retained history that the growth workload's group starts after. The
// harness may do this (the library never writes its tables from outside
// internal/store); it only stands in for rows produced long ago.
func (b *bench) fillRetained(ctx context.Context, stream string, rows int) error {
	var id int64
	if err := b.pool.QueryRow(ctx, "SELECT id FROM sqlstreams_bench.stream_config WHERE name = $1", stream).Scan(&id); err != nil {
		return fmt.Errorf("stream id of %q: %w", stream, err)
	}
	const chunk = 1_000_000
	start := wall.Now()
	for done := 0; done < rows; done += chunk {
		n := min(chunk, rows-done)
		if _, err := b.pool.Exec(ctx, fmt.Sprintf(`INSERT INTO sqlstreams_bench.stream_%d_log (produced_at, version, payload)
SELECT now(), 1, $1::json FROM generate_series(1, $2)`, id), string(payloadJSON), n); err != nil {
			return fmt.Errorf("fill retained rows: %w", err)
		}
	}
	if _, err := b.pool.Exec(ctx, fmt.Sprintf("VACUUM ANALYZE sqlstreams_bench.stream_%d_log", id)); err != nil {
		return fmt.Errorf("vacuum retained rows: %w", err)
	}
	fmt.Printf("  %-34s %d rows in %s (not timed)\n", fmt.Sprintf("retained rows for %s", stream), rows, wall.Since(start).Round(time.Second))
	return nil
}

// growth measures, for each retained size, a 4-instance burn-down of a fresh
// n-message backlog by a group that starts at the head of a stream already
// holding that many rows.
func (b *bench) growth(ctx context.Context, newStream func(string) (*sqlstreams.StreamHandle[Order], error), sizes []int) error {
	res := make([]*throughputResult, len(sizes))
	for i, size := range sizes {
		res[i] = b.rep.throughput(fmt.Sprintf("growth_%d", size),
			fmt.Sprintf("growth: burn-down of %d new messages, 4 instances, stream retaining %d rows", b.c.growthN, size), "msg/s")
	}
	for i, size := range sizes {
		name := fmt.Sprintf("bench.growth.%d", size)
		s, err := newStream(name)
		if err != nil {
			return err
		}
		if err := b.fillRetained(ctx, name, size); err != nil {
			return err
		}
		for r := 1; r <= b.c.runs; r++ {
			group := fmt.Sprintf("growth%d-run%d", size, r)
			// The group starts at the head, after everything produced so far.
			cons, err := s.Consumer(group).Register(ctx, &sqlstreams.ConsumerConfig{Start: sqlstreams.StartHead})
			if err != nil {
				return err
			}
			if _, err := produceBatch(ctx, s, b.c.growthN, fmt.Sprintf("growth backlog %d/%d (not timed)", r, b.c.runs)); err != nil {
				return err
			}
			b.checkpoint(ctx)
			label := fmt.Sprintf("growth %d retained run %d/%d", size, r, b.c.runs)
			rate, err := runBurn(ctx, cons, 4, b.c.growthN, label)
			if err != nil {
				return err
			}
			res[i].add(label, rate)
		}
	}
	return nil
}

// deadTuples reports the dead tuples the whole run left in the sqlstreams
// tables (the claim path updates cursors and inserts and deletes range
// rows; the log itself is insert-only).
func (b *bench) deadTuples(ctx context.Context) error {
	if _, err := b.pool.Exec(ctx, "SELECT pg_stat_force_next_flush()"); err != nil {
		return err
	}
	rows, err := b.pool.Query(ctx, `SELECT relname, n_live_tup, n_dead_tup, coalesce(last_autovacuum::text, 'never')
FROM pg_stat_user_tables WHERE schemaname = 'sqlstreams_bench' AND n_dead_tup > 0
ORDER BY n_dead_tup DESC LIMIT 10`)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var d deadTuples
		if err := rows.Scan(&d.Table, &d.Live, &d.Dead, &d.LastAutovacuum); err != nil {
			return err
		}
		b.rep.DeadTuples = append(b.rep.DeadTuples, d)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	var parts []string
	for _, d := range b.rep.DeadTuples {
		parts = append(parts, fmt.Sprintf("%s %d dead / %d live", d.Table, d.Dead, d.Live))
	}
	fmt.Printf("dead tuples at the end of the run: %s\n", strings.Join(parts, "; "))
	return nil
}

// deadTuples is one table's dead tuples at the end of a run.
type deadTuples struct {
	Table          string `json:"table"`
	Live           int64  `json:"live"`
	Dead           int64  `json:"dead"`
	LastAutovacuum string `json:"last_autovacuum"`
}

// autovacuums returns each table's autovacuum and autoanalyze counts, for
// the keys runs' diagnostic line: which tables the server vacuumed or
// analyzed on its own while a run was timed.
func (b *bench) autovacuums(ctx context.Context) map[string]int64 {
	out := map[string]int64{}
	rows, err := b.pool.Query(ctx, `SELECT schemaname || '.' || relname, autovacuum_count + autoanalyze_count
FROM pg_stat_all_tables WHERE autovacuum_count + autoanalyze_count > 0`)
	if err != nil {
		return out
	}
	defer rows.Close()
	for rows.Next() {
		var t string
		var n int64
		if rows.Scan(&t, &n) == nil {
			out[t] = n
		}
	}
	return out
}

// autovacuumed names the tables whose counts grew from before to after.
func autovacuumed(before, after map[string]int64) []string {
	var names []string
	for t, n := range after {
		if n > before[t] {
			names = append(names, t)
		}
	}
	sort.Strings(names)
	return names
}
