package sqlstreams

import (
	"context"
	"errors"
	"fmt"

	"github.com/c1702965/sqlstreams/internal/store"
)

// ErrDestroyNotAllowed: a destroy on a client whose ClientConfig.AllowDestroy
// is not set. A dry run is allowed: it changes nothing.
var ErrDestroyNotAllowed = errors.New("destroy not allowed (ClientConfig.AllowDestroy is off)")

// DestroyOptions are a destroy call's options.
type DestroyOptions struct {
	// DryRun says what would be removed and removes nothing (a READ ONLY
	// transaction). Allowed without ClientConfig.AllowDestroy.
	DryRun bool
}

// DestroyResult is what a destroy removed, or on a dry run would remove.
type DestroyResult struct {
	Stream string
	Group  string // "" for a stream
	// Relations are the stream's tables and log partitions (a stream).
	Relations []string
	// Rows counts rows per table: the stream's messages ("log"), or the
	// group's rows of each of the stream's tables.
	Rows map[string]int64
	// Groups are the consumer groups removed with a stream.
	Groups []string
	DryRun bool
}

// DestroyStream is an action: it removes the stream with every table,
// partition and row it owns — its messages, its consumer groups with their
// config, history and instance rows, and its schedules — in one
// transaction. It needs ClientConfig.AllowDestroy (ErrDestroyNotAllowed),
// and is refused (ErrGroupActive) while an instance of any of its groups is
// live. Handles made before it fail afterwards; registering the name again
// makes a new, empty stream.
func (c *Client) DestroyStream(ctx context.Context, name string, opts *DestroyOptions) (*DestroyResult, error) {
	return c.destroy(ctx, name, "", opts)
}

// DestroyGroup is an action: it removes the consumer group — its cursor,
// ranges, exception rows and dead letters, key leases, delivery log, binding
// rows and ledger, its config with its history, and its instance rows — in
// one transaction, and leaves the stream and its other groups as they are.
// It needs ClientConfig.AllowDestroy and is refused while an instance of
// the group is live. Registering the name again makes a new group, placed
// by its Start.
func (c *Client) DestroyGroup(ctx context.Context, stream, group string, opts *DestroyOptions) (*DestroyResult, error) {
	if err := validateName("consumer group", group); err != nil {
		return nil, err
	}
	return c.destroy(ctx, stream, group, opts)
}

func (c *Client) destroy(ctx context.Context, stream, group string, opts *DestroyOptions) (*DestroyResult, error) {
	var o DestroyOptions
	if opts != nil {
		o = *opts
	}
	what := fmt.Sprintf("destroy stream %q", stream)
	if group != "" {
		what = fmt.Sprintf("destroy consumer group %q of stream %q", group, stream)
	}
	if !o.DryRun && !c.cfg.AllowDestroy {
		return nil, fmt.Errorf("%s: %w", what, ErrDestroyNotAllowed)
	}
	if err := validateName("stream", stream); err != nil {
		return nil, err
	}
	row, err := c.store.LookupStream(ctx, nil, stream)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	req := store.DestroyRequest{StreamID: row.ID, DryRun: o.DryRun, Now: c.dbNow()}
	if group != "" {
		g, err := c.Group(ctx, stream, group)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		req.GroupID = g.row.ID
	}
	d, err := c.store.Destroy(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, ownerOnly(err, "destroying"))
	}
	return &DestroyResult{Stream: stream, Group: group, Relations: d.Relations, Rows: d.Rows, Groups: d.Groups, DryRun: o.DryRun}, nil
}

// Destroy is an action: DestroyStream of this stream (see there).
func (s *StreamHandle[T]) Destroy(ctx context.Context, opts *DestroyOptions) (*DestroyResult, error) {
	if s.c == nil {
		return nil, errNilClient
	}
	res, err := s.c.DestroyStream(ctx, s.name, opts)
	if err == nil && !res.DryRun {
		s.forget()
	}
	return res, err
}

// Destroy is an action: DestroyGroup of this group (see there).
func (g *Group) Destroy(ctx context.Context, opts *DestroyOptions) (*DestroyResult, error) {
	return g.c.DestroyGroup(ctx, g.stream, g.row.Name, opts)
}

// Destroy is an action: DestroyGroup of this group (see there).
func (c *Consumer[T]) Destroy(ctx context.Context, opts *DestroyOptions) (*DestroyResult, error) {
	return c.admin().Destroy(ctx, opts)
}
