package sqlstreams

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams/internal/pgtest"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// repeatedStep returns the first step an error message names twice in a
// row ("dead letter: dead letter: message 3", "seek "g" to head: seek:
// seek (dry run)"): each layer wraps with the fact it adds, and a step
// named by two layers says nothing twice.
func repeatedStep(msg string) (string, bool) {
	steps := strings.Split(msg, ": ")
	for i := 1; i < len(steps); i++ {
		a, b := steps[i-1], steps[i]
		if a == b || strings.HasPrefix(b, a+" ") || strings.HasPrefix(a, b+" ") {
			return a + ": " + b, true
		}
	}
	return "", false
}

func TestRepeatedStepFindsARepeatedPrefix(t *testing.T) {
	for _, bad := range []string{"dead letter: dead letter: message 3", `seek "g" to head: seek: seek (dry run): x`,
		"consume g: read group config: read group config: closed pool"} {
		_, found := repeatedStep(bad)
		require.True(t, found, bad)
	}
	_, found := repeatedStep(`status of "g": lag: closed pool`)
	require.False(t, found)
}

// Every error path of the API, on a live database and on a closed pool,
// names each step once (issue 60: "dead letter: dead letter: message 3",
// "seek: seek (dry run)", "read group config: read group config: closed
// pool").
func TestNoErrorRepeatsAStep(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	s := e.stream("orders")
	c, err := s.Consumer("billing").Register(ctx, nil)
	require.NoError(t, err)
	_, err = s.Produce(ctx, order{OrderID: "o-1"}, nil)
	require.NoError(t, err)
	g, err := e.client.Group(ctx, "orders", "billing")
	require.NoError(t, err)

	paths := map[string]func(*Client, *Group, *StreamHandle[order], *Consumer[order]) error{
		"Streams": func(cl *Client, _ *Group, _ *StreamHandle[order], _ *Consumer[order]) error {
			_, err := cl.Streams(ctx)
			return err
		},
		"Groups": func(cl *Client, _ *Group, _ *StreamHandle[order], _ *Consumer[order]) error {
			_, err := cl.Groups(ctx, "orders")
			return err
		},
		"Group": func(cl *Client, _ *Group, _ *StreamHandle[order], _ *Consumer[order]) error {
			_, err := cl.Group(ctx, "orders", "nope")
			return err
		},
		"Status": func(_ *Client, g *Group, _ *StreamHandle[order], _ *Consumer[order]) error {
			_, err := g.Status(ctx)
			return err
		},
		"Inspect": func(_ *Client, g *Group, _ *StreamHandle[order], _ *Consumer[order]) error {
			_, err := g.Inspect(ctx)
			return err
		},
		"Bindings": func(_ *Client, g *Group, _ *StreamHandle[order], _ *Consumer[order]) error {
			_, err := g.Bindings(ctx, 0)
			return err
		},
		"DeadLetters": func(_ *Client, g *Group, _ *StreamHandle[order], _ *Consumer[order]) error {
			_, err := g.DeadLetters(ctx, 0, 10)
			return err
		},
		"DeadLetter": func(_ *Client, g *Group, _ *StreamHandle[order], _ *Consumer[order]) error {
			_, err := g.DeadLetter(ctx, 999)
			return err
		},
		"Redrive": func(_ *Client, g *Group, _ *StreamHandle[order], _ *Consumer[order]) error {
			_, err := g.Redrive(ctx, 999)
			return err
		},
		"RedriveAll": func(_ *Client, g *Group, _ *StreamHandle[order], _ *Consumer[order]) error {
			_, err := g.RedriveAll(ctx)
			return err
		},
		"Seek dry run": func(_ *Client, g *Group, _ *StreamHandle[order], _ *Consumer[order]) error {
			_, err := g.Seek(ctx, SeekID(999), &SeekOptions{DryRun: true})
			return err
		},
		"Seek": func(_ *Client, g *Group, _ *StreamHandle[order], _ *Consumer[order]) error {
			_, err := g.Seek(ctx, SeekID(999), nil)
			return err
		},
		"Declare": func(_ *Client, g *Group, _ *StreamHandle[order], _ *Consumer[order]) error {
			_, err := g.Declare(ctx, ConsumerConfig{Bindings: []string{"eu.#"}})
			return err
		},
		"DestroyGroup dry run": func(cl *Client, _ *Group, _ *StreamHandle[order], _ *Consumer[order]) error {
			_, err := cl.DestroyGroup(ctx, "orders", "nope", &DestroyOptions{DryRun: true})
			return err
		},
		"DestroyGroup": func(cl *Client, _ *Group, _ *StreamHandle[order], _ *Consumer[order]) error {
			_, err := cl.DestroyGroup(ctx, "orders", "billing", nil)
			return err
		},
		"Produce": func(_ *Client, _ *Group, s *StreamHandle[order], _ *Consumer[order]) error {
			_, err := s.Produce(ctx, order{OrderID: "o-2"}, nil)
			return err
		},
		"Register stream": func(_ *Client, _ *Group, s *StreamHandle[order], _ *Consumer[order]) error {
			return s.Register(ctx, nil)
		},
		"Register group": func(_ *Client, _ *Group, s *StreamHandle[order], _ *Consumer[order]) error {
			_, err := s.Consumer("billing").Register(ctx, nil)
			return err
		},
		"Consume": func(_ *Client, _ *Group, _ *StreamHandle[order], c *Consumer[order]) error {
			cctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			return c.Consume(cctx, func(context.Context, *order) error { return nil }, &ConsumeOptions{DisableManager: true})
		},
	}
	check := func(where string, cl *Client, g *Group, s *StreamHandle[order], c *Consumer[order], live bool) {
		for name, call := range paths {
			if live && (name == "Produce" || name == "Register stream" || name == "Register group" || name == "Consume" ||
				name == "Streams" || name == "Groups" || name == "Status" || name == "Inspect" || name == "Bindings" ||
				name == "DeadLetters" || name == "Redrive" || name == "RedriveAll") {
				continue // these succeed on a live database
			}
			err := call(cl, g, s, c)
			if err == nil {
				t.Errorf("%s: %s: no error", where, name)
				continue
			}
			if step, found := repeatedStep(err.Error()); found {
				t.Errorf("%s: %s names a step twice (%q): %v", where, name, step, err)
			}
		}
	}
	check("live", e.client, g, s, c, true)

	// A client whose pool is closed fails every call that reaches the database.
	pool, err := pgxpool.New(ctx, pgtest.URL())
	require.NoError(t, err)
	closed, err := NewClient(ctx, pool, &ClientConfig{Schema: e.client.Schema(), DisableMigrate: true, Logger: e.client.cfg.Logger})
	require.NoError(t, err)
	cs := Stream[order](closed, "orders")
	require.NoError(t, cs.Register(ctx, nil))
	cc, err := cs.Consumer("billing").Register(ctx, nil)
	require.NoError(t, err)
	cg, err := closed.Group(ctx, "orders", "billing")
	require.NoError(t, err)
	pool.Close()
	check("closed pool", closed, cg, cs, cc, false)
	_, err = MigrationStatus(ctx, pool, e.client.Schema())
	require.Error(t, err)
	_, found := repeatedStep(err.Error())
	require.False(t, found, "MigrationStatus: %v", err)
	require.True(t, errors.Is(err, ErrPermanent) || strings.Contains(err.Error(), "closed pool"), "%v", err)
}
