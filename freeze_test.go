package sqlstreams

import (
	"context"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/internal/actortest"
	"github.com/c1702965/sqlstreams/internal/codes"
	"github.com/c1702965/sqlstreams/internal/hooks"
	"github.com/stretchr/testify/require"
)

// Freezes at scale: several consumer processes of two groups on one stream
// (one under ConcurrencyOverride exclusive, one ordered), every message keyed
// with one of a few hot keys, a steady produce rate, and processes frozen
// (SIGSTOP) for 2.5 InstanceTTLs, one after the other, while they work. The
// fleet must lose nothing, drain soon after producing stops, never start a
// handler of a key another process holds, and no actor may panic.
//
// A seed picks which process freezes when, each message's key and each
// handler's time; it is printed, and SQLSTREAMS_FREEZE_SEED replays it.

// freezePlan is one schedule.
type freezePlan struct {
	procs      int
	rate       int // messages produced a second
	produceFor time.Duration
	ttl        time.Duration
	keys       int
	freezes    []time.Duration // when each freeze begins, from the first produce
	drain      time.Duration   // every message handled within this of the last produce
	groups     []freezeGroup   // each child consumes one session of each
}

// freezeLong is the schedule of `make freeze`: 3 processes, 200 msg/s for
// 60 s, InstanceTTL 3 s, 20 hot keys, freezes at 10 s, 25 s and 40 s.
// Each seed runs it once a group: exclusive, then ordered.
var freezeLong = freezePlan{procs: 3, rate: 200, produceFor: 60 * time.Second, ttl: 3 * time.Second, keys: 20,
	freezes: []time.Duration{10 * time.Second, 25 * time.Second, 40 * time.Second}, drain: 10 * time.Second}

// freezeShort is make test's: the same fleet and freezes, closer together,
// both groups at once at half the rate each, for about a minute in all.
var freezeShort = freezePlan{procs: 3, rate: 100, produceFor: 36 * time.Second, ttl: 3 * time.Second, keys: 20,
	freezes: []time.Duration{4 * time.Second, 12 * time.Second, 20 * time.Second}, drain: 10 * time.Second,
	groups: []freezeGroup{freezeExclusive, freezeOrdered}}

// freezeGroup is a group the children consume, with its override.
type freezeGroup struct {
	name string
	conc Concurrency
}

var (
	freezeExclusive = freezeGroup{"exclusive", Exclusive}
	freezeOrdered   = freezeGroup{"ordered", Ordered}
)

func TestFreezesAtScale(t *testing.T) {
	if testing.Short() {
		t.Skip("freezes processes for about a minute")
	}
	runFreeze(t, freezeShort, freezeSeed(t))
}

// TestFreezesAtScaleLong runs the long schedule for SQLSTREAMS_FREEZE_SEEDS
// seeds (make freeze SEEDS=5).
func TestFreezesAtScaleLong(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("SQLSTREAMS_FREEZE_SEEDS"))
	if n <= 0 {
		t.Skip("set SQLSTREAMS_FREEZE_SEEDS (make freeze SEEDS=5)")
	}
	for i := range n {
		seed := freezeSeed(t)
		for _, g := range []freezeGroup{freezeExclusive, freezeOrdered} {
			plan := freezeLong
			plan.groups = []freezeGroup{g}
			t.Run(fmt.Sprintf("%d-%s-seed-%d", i, g.name, seed), func(t *testing.T) { runFreeze(t, plan, seed) })
		}
	}
}

// freezeSeed returns SQLSTREAMS_FREEZE_SEED, or a random seed.
func freezeSeed(t *testing.T) uint64 {
	if s := os.Getenv("SQLSTREAMS_FREEZE_SEED"); s != "" {
		seed, err := strconv.ParseUint(s, 10, 64)
		require.NoError(t, err, "SQLSTREAMS_FREEZE_SEED")
		return seed
	}
	return rand.Uint64()
}

// freezeWork is a handler's time for a message: 20–100 ms, from the seed.
func freezeWork(seed uint64, id string) time.Duration {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d/%s", seed, id)
	return time.Duration(20+h.Sum64()%81) * time.Millisecond
}

// freezeRun is one handler run a child reported.
type freezeRun struct {
	group, id, key    string
	n                 int // the message's number, in produce order
	pid               int
	entered, finished time.Time
}

// freezeStop is one freeze: the process and when it stopped and continued.
type freezeStop struct {
	pid            int
	stopAt, contAt time.Time
}

func runFreeze(t *testing.T, plan freezePlan, seed uint64) {
	t.Logf("seed %d (SQLSTREAMS_FREEZE_SEED=%d replays it)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	e := newEnv(t, nil)
	ctx := context.Background()
	s := e.stream("orders")
	for _, g := range plan.groups {
		_, err := s.Consumer(g.name).Register(ctx, &ConsumerConfig{ConcurrencyOverride: g.conc})
		require.NoError(t, err)
	}
	var names []string
	for _, g := range plan.groups {
		names = append(names, g.name)
	}
	env := []string{"SQLSTREAMS_FREEZE_SEED=" + strconv.FormatUint(seed, 10), "SQLSTREAMS_FREEZE_TTL=" + plan.ttl.String(),
		"SQLSTREAMS_FREEZE_GROUPS=" + strings.Join(names, ",")}
	kids := make([]*child, plan.procs)
	for i := range kids {
		kids[i] = spawnWith(t, e, "freeze", env...)
	}
	for _, k := range kids {
		for range plan.groups {
			k.next(t, "INSTANCE ")
		}
	}

	// The freezes: each on another process (a permutation), each a little
	// off its nominal time.
	who := rng.Perm(plan.procs)
	type planned struct {
		kid *child
		at  time.Duration
	}
	var schedule []planned
	for i, at := range plan.freezes {
		jitter := time.Duration(rng.Int64N(int64(time.Second))) - time.Second/2
		schedule = append(schedule, planned{kid: kids[who[i%plan.procs]], at: at + jitter})
	}
	hold := plan.ttl*2 + plan.ttl/2

	total := int(plan.produceFor.Seconds()) * plan.rate
	keyOf := make([]string, total)
	for i := range keyOf {
		keyOf[i] = fmt.Sprintf("k%d", rng.IntN(plan.keys))
	}

	var (
		mu      sync.Mutex
		runs    []freezeRun
		seen    = map[string]map[string]bool{} // group → ids handled
		panics  []string
		logged  = map[string]int{}
		handled = make(chan struct{}, 1)
	)
	for _, g := range plan.groups {
		seen[g.name] = map[string]bool{}
	}
	bad := actortest.NewFailures(t)
	var readers sync.WaitGroup
	for _, k := range kids {
		readers.Add(1)
		go func() {
			defer readers.Done()
			for l := range k.lines {
				f := strings.Fields(l)
				switch {
				case len(f) == 6 && f[0] == "RAN":
					n, err1 := strconv.Atoi(strings.TrimPrefix(f[2], "m-"))
					pid, err2 := strconv.Atoi(f[3])
					in, err3 := strconv.ParseInt(f[4], 10, 64)
					out, err4 := strconv.ParseInt(f[5], 10, 64)
					if err1 != nil || err2 != nil || err3 != nil || err4 != nil || n < 0 || n >= total {
						bad.Add("a child's line does not parse: %q", l)
						continue
					}
					mu.Lock()
					runs = append(runs, freezeRun{group: f[1], id: f[2], key: keyOf[n], n: n, pid: pid,
						entered: time.Unix(0, in), finished: time.Unix(0, out)})
					seen[f[1]][f[2]] = true
					mu.Unlock()
					select {
					case handled <- struct{}{}:
					default:
					}
				case len(f) >= 2 && f[0] == "LOG":
					mu.Lock()
					logged[f[1]]++
					if f[1] == codes.ActorPanicked.ID {
						panics = append(panics, l)
					}
					mu.Unlock()
				}
			}
		}()
	}
	handledAll := func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, g := range plan.groups {
			if len(seen[g.name]) < total {
				return false
			}
		}
		return true
	}

	// Produce at the plan's rate, freezing and continuing on schedule.
	var stops []freezeStop
	type thaw struct {
		kid *child
		at  time.Time
	}
	var thaws []thaw
	start := time.Now()
	tick := time.NewTicker(time.Second / time.Duration(plan.rate))
	defer tick.Stop()
	for n := 0; n < total; {
		<-tick.C // the producer's pace (wall clock: a rate, not a wait for work)
		now := time.Now()
		for len(schedule) > 0 && now.Sub(start) >= schedule[0].at {
			k := schedule[0].kid
			schedule = schedule[1:]
			require.NoError(t, k.cmd.Process.Signal(syscall.SIGSTOP))
			stops = append(stops, freezeStop{pid: k.cmd.Process.Pid, stopAt: now})
			thaws = append(thaws, thaw{kid: k, at: now.Add(hold)})
		}
		for len(thaws) > 0 && !now.Before(thaws[0].at) {
			require.NoError(t, thaws[0].kid.cmd.Process.Signal(syscall.SIGCONT))
			for i := range stops {
				if stops[i].pid == thaws[0].kid.cmd.Process.Pid && stops[i].contAt.IsZero() {
					stops[i].contAt = now
				}
			}
			thaws = thaws[1:]
		}
		due := min(total, int(now.Sub(start).Seconds()*float64(plan.rate))+1)
		for ; n < due; n++ {
			_, err := s.Produce(ctx, order{OrderID: fmt.Sprintf("m-%d", n)}, &ProduceOptions{Key: keyOf[n]})
			require.NoError(t, err)
		}
	}
	for _, th := range thaws { // a freeze still on when producing stopped
		require.NoError(t, th.kid.cmd.Process.Signal(syscall.SIGCONT))
		for i := range stops {
			if stops[i].pid == th.kid.cmd.Process.Pid && stops[i].contAt.IsZero() {
				stops[i].contAt = time.Now()
			}
		}
	}
	producedAt := time.Now()
	t.Logf("produced %d messages in %s, %d freezes of %s", total, producedAt.Sub(start).Round(time.Millisecond), len(stops), hold)

	deadline := time.NewTimer(plan.drain)
	defer deadline.Stop()
	drained := handledAll()
	for !drained {
		select {
		case <-handled:
			drained = handledAll()
		case <-deadline.C:
			drained = true
		}
	}
	drainedIn := time.Since(producedAt)
	t.Logf("drained %s after the last produce", drainedIn.Round(time.Millisecond))
	if !handledAll() {
		// Slow or stuck? What the database holds of the first missing
		// messages, then up to a minute more to see whether they come.
		for _, g := range plan.groups {
			mu.Lock()
			var missing []string
			for n := 0; n < total && len(missing) < 10; n++ {
				if id := fmt.Sprintf("m-%d", n); !seen[g.name][id] {
					missing = append(missing, id)
				}
			}
			mu.Unlock()
			freezeDiagnose(t, e, g.name, missing)
		}
		late := time.NewTimer(time.Minute)
		for done := false; !done; {
			select {
			case <-handled:
				done = handledAll()
			case <-late.C:
				done = true
			}
		}
		late.Stop()
		t.Logf("%s after the last produce: every message handled %t", time.Since(producedAt).Round(time.Millisecond), handledAll())
	}
	for _, k := range kids {
		require.NoError(t, k.cmd.Process.Signal(syscall.SIGTERM))
	}
	for _, k := range kids {
		require.NoError(t, k.cmd.Wait(), "a child stops gracefully")
	}
	readers.Wait()
	bad.Check(t)

	mu.Lock()
	defer mu.Unlock()
	runsBy := map[string]int{}
	for _, r := range runs {
		runsBy[r.group]++
	}
	for _, g := range plan.groups {
		var missing []string
		for n := range total {
			if id := fmt.Sprintf("m-%d", n); !seen[g.name][id] {
				missing = append(missing, id)
			}
		}
		t.Logf("%s: %d runs of %d messages (%d repeats), %d missing", g.name, runsBy[g.name], total,
			runsBy[g.name]-len(seen[g.name]), len(missing))
		require.Empty(t, missing, "%s: messages never handled", g.name)
	}
	require.Less(t, drainedIn, plan.drain, "every message handled within %s of the last produce", plan.drain)
	t.Logf("logged codes: %v", logged)
	require.Empty(t, panics, "actor panics (none was injected)")

	// No handler of a key started in one process while another process ran
	// one of the key, save those running when their process froze: nothing
	// recalls them (their late outcomes settle nothing).
	inFreeze := func(r freezeRun) bool {
		for _, st := range stops {
			if r.pid == st.pid && r.entered.Before(st.contAt.Add(time.Millisecond)) && r.finished.After(st.stopAt) {
				return true
			}
		}
		return false
	}
	byKey := map[string][]freezeRun{}
	for _, r := range runs {
		byKey[r.group+"/"+r.key] = append(byKey[r.group+"/"+r.key], r)
	}
	var overlaps []string
	for key, rs := range byKey {
		slices.SortFunc(rs, func(a, b freezeRun) int { return a.entered.Compare(b.entered) })
		for i, a := range rs {
			for _, b := range rs[i+1:] {
				if !b.entered.Before(a.finished) {
					break
				}
				if a.pid != b.pid && !inFreeze(a) && !inFreeze(b) {
					overlaps = append(overlaps, fmt.Sprintf("%s: %s pid %d [%s, %s] and %s pid %d [%s, %s]", key,
						a.id, a.pid, a.entered.Format("15:04:05.000"), a.finished.Format("15:04:05.000"),
						b.id, b.pid, b.entered.Format("15:04:05.000"), b.finished.Format("15:04:05.000")))
				}
			}
		}
	}
	require.Empty(t, overlaps, "handlers of one key ran at once in two processes")

	// An ordered key's messages first ran in log order.
	for key, rs := range byKey {
		if !strings.HasPrefix(key, "ordered/") {
			continue
		}
		first := map[string]bool{}
		last := -1
		for _, r := range rs { // sorted by entry
			if first[r.id] {
				continue
			}
			first[r.id] = true
			require.Greater(t, r.n, last, "%s: %s first ran after a later message of its key", key, r.id)
			last = r.n
		}
	}
}

// childFreeze is TestChildConsumer's "freeze" mode: a session of each group
// the parent names, hot keys, a short TTL, each handler reporting its run.
func childFreeze(ctx context.Context, client *Client, hooks *hooks.Hooks) error {
	seed, err := strconv.ParseUint(os.Getenv("SQLSTREAMS_FREEZE_SEED"), 10, 64)
	if err != nil {
		return fmt.Errorf("SQLSTREAMS_FREEZE_SEED: %w", err)
	}
	ttl, err := time.ParseDuration(os.Getenv("SQLSTREAMS_FREEZE_TTL"))
	if err != nil {
		return fmt.Errorf("SQLSTREAMS_FREEZE_TTL: %w", err)
	}
	var groups []freezeGroup
	for _, name := range strings.Split(os.Getenv("SQLSTREAMS_FREEZE_GROUPS"), ",") {
		switch name {
		case freezeExclusive.name:
			groups = append(groups, freezeExclusive)
		case freezeOrdered.name:
			groups = append(groups, freezeOrdered)
		default:
			return fmt.Errorf("SQLSTREAMS_FREEZE_GROUPS: unknown group %q", name)
		}
	}
	pid := os.Getpid()
	say := func(format string, args ...any) { childSay(fmt.Sprintf(format, args...)) }
	errs := make(chan error, len(groups))
	for _, g := range groups {
		c, err := Stream[order](client, "orders").Consumer(g.name).Register(ctx, &ConsumerConfig{ConcurrencyOverride: g.conc})
		if err != nil {
			return err
		}
		go func() {
			errs <- c.Consume(ctx, func(ctx context.Context, o *order) error {
				entered := time.Now()
				work := time.NewTimer(freezeWork(seed, o.OrderID)) // the handler's work
				defer work.Stop()
				select {
				case <-work.C:
				case <-ctx.Done():
					return ctx.Err()
				}
				say("RAN %s %s %d %d %d", g.name, o.OrderID, pid, entered.UnixNano(), time.Now().UnixNano())
				return nil
			}, &ConsumeOptions{InstanceTTL: ttl, test: hooks})
		}()
	}
	var first error
	for range groups {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// childOut serializes a child's lines on stdout (a line longer than a
// pipe's atomic write would interleave with another's).
var childOut sync.Mutex

// childSay prints one line on stdout for the parent test to read.
func childSay(line string) {
	childOut.Lock()
	defer childOut.Unlock()
	fmt.Println(line)
}

// lineLogger prints every WARN and ERROR record as "LOG code message
// attrs" on stdout, for a parent test to read.
type lineLogger struct{}

func (l lineLogger) Enabled(_ context.Context, lv slog.Level) bool { return lv >= slog.LevelWarn }
func (l lineLogger) WithAttrs([]slog.Attr) slog.Handler            { return l }
func (l lineLogger) WithGroup(string) slog.Handler                 { return l }
func (l lineLogger) Handle(_ context.Context, r slog.Record) error {
	code := "-"
	var b strings.Builder
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "code" {
			code = a.Value.String()
		} else {
			fmt.Fprintf(&b, " %s=%q", a.Key, a.Value.String())
		}
		return true
	})
	childSay(fmt.Sprintf("LOG %s %q%s", code, r.Message, strings.ReplaceAll(b.String(), "\n", `\n`)))
	return nil
}

// freezeDiagnose logs what the database holds of group's missing messages:
// the range, exception row and key lease of each.
func freezeDiagnose(t *testing.T, e *env, group string, ids []string) {
	ctx := context.Background()
	g, err := e.client.Group(ctx, "orders", group)
	if err != nil {
		t.Logf("diagnose: %v", err)
		return
	}
	st, err := g.Status(ctx)
	if err == nil {
		t.Logf("%s: status %+v", group, *st)
	}
	schema, sid, gid := e.client.Schema(), g.row.StreamID, g.row.ID
	rows, err := e.pool.Query(ctx, fmt.Sprintf(`SELECT m.payload->>'order_id', m.id, coalesce(m.message_key, ''),
  (SELECT string_agg(format('range %%s owner=%%s live=%%s exp=%%s', r.id, r.owner,
      EXISTS (SELECT 1 FROM %[1]s.worker_instance w WHERE w.id = r.owner AND w.expires_at > now()), r.expires_at - now()), '; ')
   FROM %[1]s.stream_%[2]d_range r WHERE r.group_id = %[3]d AND (m.xid, m.id) > (r.lo_xid, r.lo_id) AND (m.xid, m.id) <= (r.hi_xid, r.hi_id)),
  (SELECT format('exception status=%%s attempts=%%s owner=%%s live=%%s exp=%%s due=%%s error=%%s', x.status, x.attempts, x.owner,
      EXISTS (SELECT 1 FROM %[1]s.worker_instance w WHERE w.id = x.owner AND w.expires_at > now()), x.expires_at - now(), x.can_run_after - now(), x.last_error)
   FROM %[1]s.stream_%[2]d_exception x WHERE x.group_id = %[3]d AND x.message_id = m.id),
  (SELECT string_agg(format('keylease token=%%s owner=%%s live=%%s', k.token, k.owner,
      EXISTS (SELECT 1 FROM %[1]s.worker_instance w WHERE w.id = k.owner AND w.expires_at > now())), '; ')
   FROM %[1]s.stream_%[2]d_key_lease k WHERE k.group_id = %[3]d AND k.message_key IN (m.message_key, ''))
FROM %[1]s.stream_%[2]d_log m WHERE m.payload->>'order_id' = ANY($1) ORDER BY m.xid, m.id`, schema, sid, gid), ids)
	if err != nil {
		t.Logf("diagnose: %v", err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var id, key string
		var mid int64
		var rng, exc, kl *string
		if err := rows.Scan(&id, &mid, &key, &rng, &exc, &kl); err != nil {
			t.Logf("diagnose: %v", err)
			return
		}
		str := func(p *string) string {
			if p == nil {
				return "-"
			}
			return *p
		}
		t.Logf("%s: missing %s (message %d, key %s) | %s | %s | %s", group, id, mid, key, str(rng), str(exc), str(kl))
	}
}
