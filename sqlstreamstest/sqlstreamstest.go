// Package sqlstreamstest helps applications test their own code that
// produces and consumes with sqlstreams, against a real PostgreSQL (as
// sqlstreams' own tests do; a fake would not show what a transaction
// sees):
//
//   - Schema gives each test a schema of its own, dropped when the test ends;
//   - RequireProduced asserts that code under test produced a message in the
//     caller's transaction, before that transaction commits;
//   - Drain runs a consumer group's handler until the group's backlog is
//     empty, and returns: the handler's effects can then be checked.
//
// It is an API for users' tests; nothing in it is for production code.
package sqlstreamstest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams"
	"github.com/jackc/pgx/v5"
)

// Schema returns a new schema name for t (the test's name, lower-cased, and
// a random suffix) and drops that schema, with everything in it, when t
// ends, connecting to url. The schema is not created: NewClient creates and
// migrates it. Give the name to ClientConfig.Schema.
func Schema(t testing.TB, url string) string {
	t.Helper()
	var b strings.Builder
	for _, r := range strings.ToLower(t.Name()) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		case !strings.HasSuffix(b.String(), "_"):
			b.WriteByte('_')
		}
	}
	base := strings.Trim(b.String(), "_")
	if base == "" || base[0] < 'a' || base[0] > 'z' || strings.HasPrefix(base, "pg_") {
		base = "t_" + base
	}
	var rnd [5]byte
	_, _ = rand.Read(rnd[:])
	suffix := "_" + hex.EncodeToString(rnd[:])
	if len(base) > 63-len(suffix) {
		base = strings.TrimRight(base[:63-len(suffix)], "_")
	}
	name := base + suffix
	if err := sqlstreams.ValidateSchema(name); err != nil {
		t.Fatalf("sqlstreamstest: schema for %s: %v", t.Name(), err)
		return ""
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Errorf("sqlstreamstest: drop schema %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		if err := sqlstreams.DropSchema(ctx, conn, name); err != nil {
			t.Errorf("sqlstreamstest: %v", err)
		}
	})
	return name
}

// RequireProduced fails t unless tx has produced to stream a message for
// which match returns true. It looks at what the transaction sees before it
// commits: the messages it produced to the stream (at most
// sqlstreams.MaxProducedIn). match nil accepts any message.
func RequireProduced[T any](t testing.TB, tx pgx.Tx, stream *sqlstreams.StreamHandle[T], match func(T) bool) {
	t.Helper()
	msgs, err := stream.ProducedIn(context.Background(), tx)
	if err != nil {
		t.Fatalf("sqlstreamstest: read the messages produced to %q in the transaction: %v", stream.Name(), err)
		return
	}
	for _, m := range msgs {
		if match == nil || match(m) {
			return
		}
	}
	t.Fatalf("sqlstreamstest: the transaction produced %d message(s) to %q and none matched", len(msgs), stream.Name())
}

// DrainOptions are Drain's options; nil means the defaults.
type DrainOptions struct {
	// Consume are the session's options. Default: ClaimPollRate 10ms and
	// DisableManager (a test needs no retention or schedules).
	Consume *sqlstreams.ConsumeOptions
	// PollInterval is how often Drain reads the group's status. Default 10ms.
	PollInterval time.Duration
}

// Drain runs handler on consumer until the group's backlog is empty (every
// message produced before that point settled: succeeded, or dead after its
// retries), then stops the session gracefully and returns. It fails t when
// ctx ends first (naming the lag left) or when Consume fails. A handler
// that keeps failing with retries left keeps the backlog from emptying
// until its retries run out: give the test's messages short retry curves,
// or make the handler return sqlstreams.Terminal. DrainWith takes options.
func Drain[T any](ctx context.Context, t testing.TB, consumer *sqlstreams.Consumer[T], handler sqlstreams.Handler[T]) {
	t.Helper()
	DrainWith(ctx, t, consumer, handler, nil)
}

// finalStatusBound bounds the status read a failing Drain makes when its
// context ended before any read came back.
const finalStatusBound = 5 * time.Second

// DrainWith is Drain with options (nil: the defaults).
func DrainWith[T any](ctx context.Context, t testing.TB, consumer *sqlstreams.Consumer[T], handler sqlstreams.Handler[T], opts *DrainOptions) {
	t.Helper()
	var o DrainOptions
	if opts != nil {
		o = *opts
	}
	if o.PollInterval <= 0 {
		o.PollInterval = 10 * time.Millisecond
	}
	co := sqlstreams.ConsumeOptions{ClaimPollRate: 10 * time.Millisecond, DisableManager: true}
	if o.Consume != nil {
		co = *o.Consume
	}
	cctx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- consumer.Consume(cctx, handler, &co) }()
	tick := sqlstreams.RealClock().Ticker(o.PollInterval)
	defer tick.Stop()
	var last *sqlstreams.GroupStatus
	for {
		s, err := consumer.Status(ctx)
		if err == nil && s.Lag == 0 && !s.Estimated {
			break
		}
		if err == nil {
			last = s
		}
		select {
		case <-tick.C():
			continue
		case err := <-done:
			t.Fatalf("sqlstreamstest: Drain: Consume of %q returned before the backlog was empty: %v", consumer.Name(), err)
			return
		case <-ctx.Done():
		}
		if last == nil { // ended before a read came back: read one now, so the failure says how far it got
			sctx, cancel := sqlstreams.RealClock().WithTimeout(context.WithoutCancel(ctx), finalStatusBound)
			if s, err := consumer.Status(sctx); err == nil {
				last = s
			}
			cancel()
		}
		stop()
		<-done
		msg := "no status read"
		if last != nil {
			msg = fmt.Sprintf("lag %d: %d available, %d in flight, %d retrying", last.Lag, last.Available, last.InFlight, last.Retrying+last.Quarantined)
		}
		t.Fatalf("sqlstreamstest: Drain: the backlog of %q was not empty when the context ended (%s): %v", consumer.Name(), msg, ctx.Err())
		return
	}
	stop()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("sqlstreamstest: Drain: Consume of %q: %v", consumer.Name(), err)
	}
}
