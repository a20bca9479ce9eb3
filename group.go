package sqlstreams

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/c1702965/sqlstreams/internal/codes"
	"github.com/c1702965/sqlstreams/internal/groupconfig"
	"github.com/c1702965/sqlstreams/internal/store"
	"github.com/c1702965/sqlstreams/internal/topic"
)

// The operator's view: streams and groups listed, and a handle on one group
// whose read methods never write (each runs in a READ ONLY transaction) and
// whose action verbs say so in their names. It is what `sqlstreams` (the
// CLI) is built on, and it needs no message type: an operator does not
// import the application's code.

// MaxListed bounds Streams and Groups: at most this many rows, in name order.
const MaxListed = 10000

// StatusCountBound bounds what one Status read counts: at most this many
// log positions for the available messages, and as many for those in
// flight. Each costs an index probe (and, for a group with bindings, a
// heap row); past the bound the count is an estimate from the message ids,
// and GroupStatus.Estimated says so.
const StatusCountBound = 100000

// ErrGroupActive: an action refused because the group has live instances
// (or leases of stopped ones that have not lapsed yet). Stop its consumers
// and try again.
var ErrGroupActive = store.ErrGroupActive

// ErrSeekTarget: a seek target outside the retained log (a message id
// retention dropped, or one never produced).
var ErrSeekTarget = store.ErrSeekTarget

// ErrBindingsChange: Group.Declare was given a binding set other than the
// installed one. A set changes through Register and Consume, which wait
// for the live instances holding the old set (seed 0511).
var ErrBindingsChange = errors.New("binding set change")

// StreamInfo is a registered stream as Streams lists it.
type StreamInfo struct {
	Name      string
	Config    StreamConfig // as stored (unset fields zero)
	CreatedAt time.Time
	UpdatedAt time.Time
	// RetainedBytes is the on-disk size of the stream's log (rows, indexes,
	// TOAST), as PostgreSQL reports it.
	RetainedBytes int64
	// Groups are the names of the stream's consumer groups.
	Groups []string
	// ReadFrom says whether a replica served the listing (ReadPool).
	ReadFrom
}

// Streams lists the registered streams in name order (at most MaxListed).
// It writes nothing.
func (c *Client) Streams(ctx context.Context) ([]StreamInfo, error) {
	var rows []store.StreamInfoRow
	from, err := c.read(ctx, "list streams", func(v store.View) (err error) {
		rows, err = v.ListStreams(ctx, "", MaxListed)
		return err
	})
	if err != nil {
		return nil, err
	}
	out := make([]StreamInfo, 0, len(rows))
	for _, r := range rows {
		s := StreamInfo{Name: r.Name, CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, RetainedBytes: r.RetainedBytes, Groups: r.Groups, ReadFrom: from}
		if err := json.Unmarshal(r.Config, &s.Config); err != nil {
			return nil, fmt.Errorf("stream %q: stored config: %w", r.Name, err)
		}
		out = append(out, s)
	}
	return out, nil
}

// GroupInfo is a registered consumer group as Groups lists it.
type GroupInfo struct {
	Name      string
	Stream    string
	Start     Start // where its cursor was placed at creation
	CreatedAt time.Time
	// ReadFrom says whether a replica served the listing (ReadPool).
	ReadFrom
}

// Groups lists the consumer groups of stream (every stream's when stream
// is "") in name order, at most MaxListed. An unknown stream is
// ErrNotRegistered. It writes nothing.
func (c *Client) Groups(ctx context.Context, stream string) ([]GroupInfo, error) {
	if stream != "" {
		if err := validateName("stream", stream); err != nil {
			return nil, err
		}
	}
	var rows []store.GroupInfoRow
	from, err := c.read(ctx, "list groups", func(v store.View) error {
		if stream != "" {
			if _, err := v.LookupStream(ctx, stream); err != nil {
				return err
			}
		}
		var err error
		rows, err = v.ListGroups(ctx, stream, "", MaxListed)
		return err
	})
	if err != nil {
		return nil, err
	}
	out := make([]GroupInfo, len(rows))
	for i, r := range rows {
		out[i] = GroupInfo{Name: r.Name, Stream: r.Stream, Start: Start(r.Start), CreatedAt: r.CreatedAt, ReadFrom: from}
	}
	return out, nil
}

// Group is a handle on a registered consumer group for operators and
// tools. Its read methods (Status, Inspect, Bindings, DeadLetters,
// DeadLetter) never write: each runs in a READ ONLY transaction. Its action
// methods (Redrive, RedriveAll, Seek, Declare) say what they change and
// refuse when it is unsafe. A typed Consumer's methods of the same names
// are this handle's.
type Group struct {
	c      *Client
	stream string
	row    store.GroupRow
}

// Group returns the handle of the consumer group name of stream. It
// creates nothing: an unknown stream or group is ErrNotRegistered, and a
// group of another stream is ErrGroupStream.
func (c *Client) Group(ctx context.Context, stream, name string) (*Group, error) {
	if err := validateName("stream", stream); err != nil {
		return nil, err
	}
	if err := validateName("consumer group", name); err != nil {
		return nil, err
	}
	if _, err := c.store.LookupStream(ctx, nil, stream); err != nil {
		return nil, err
	}
	row, of, err := c.store.LookupGroup(ctx, name)
	if err != nil {
		return nil, err
	}
	if of != stream {
		return nil, fmt.Errorf("consumer group %q is a group of stream %q, not %q: %w", name, of, stream, ErrGroupStream)
	}
	return &Group{c: c, stream: stream, row: row}, nil
}

// Name returns the group's name.
func (g *Group) Name() string { return g.row.Name }

// Stream returns the name of the group's stream.
func (g *Group) Stream() string { return g.stream }

func (g *Group) db() store.Group { return g.c.store.Group(g.row.StreamID, g.row.ID) }

// read runs f on the group's read-only statements in one snapshot of the
// client's read pool.
func (g *Group) read(ctx context.Context, what string, f func(store.View, store.ViewGroup) error) (ReadFrom, error) {
	return g.c.read(ctx, what, func(v store.View) error { return f(v, v.Group(g.row.StreamID, g.row.ID)) })
}

// GroupStatus is a group's progress at one snapshot: its positions, in the
// columns of Kafka's `kafka-consumer-groups --describe`, and the messages
// it has left by state, as RabbitMQ counts a queue's (ready, unacked).
type GroupStatus struct {
	Stream, Group string
	// At is the database's time of the snapshot.
	At time.Time
	// Committed is the group's committed position, as the last message at
	// or before it: every message at or below it is settled (dead letters
	// do not hold it back).
	Committed Position
	// Cursor is the last message at or before the highest position claimed
	// into a range.
	Cursor Position
	// Head is the stream's newest position (zero for an empty log).
	Head Position
	// Available counts the messages after the cursor that the group will
	// be handed (for a group with bindings, those they match); InFlight the
	// messages claimed and not settled yet (in outstanding ranges, or a
	// retry being attempted); Retrying the failed, delayed or parked
	// messages waiting for their next attempt; Quarantined those split out
	// of a range reclaimed too often and not attempted yet; Dead the dead
	// letters.
	Available, InFlight, Retrying, Quarantined, Dead int64
	// Lag is what the group has left to handle: Available + InFlight +
	// Retrying + Quarantined. Dead letters are not lag: nothing handles
	// them until a redrive, which adds them back.
	Lag int64
	// Estimated: Available or InFlight passed StatusCountBound, and is an
	// estimate from the message ids (exact below the bound).
	Estimated bool
	// OldestUnconsumed is when the first message after Committed was
	// produced (zero when there is none), and OldestAge how long ago.
	OldestUnconsumed time.Time
	OldestAge        time.Duration
	// Ranges counts outstanding range leases, ExpiredRanges those of them
	// whose lease lapsed (a reclaimer takes them).
	Ranges, ExpiredRanges int64
	// Members are the group's live Consume sessions (Kafka's group
	// members), one each however many worker rows it holds.
	Members []Member
	// ReadFrom says whether a replica served the snapshot (ReadPool), and
	// how far behind the primary it was.
	ReadFrom
}

// Status reads the group's progress in one READ ONLY snapshot.
func (g *Group) Status(ctx context.Context) (*GroupStatus, error) {
	return g.status(ctx, StatusCountBound)
}

// status is Status with the count bound (tests lower it).
func (g *Group) status(ctx context.Context, bound int64) (*GroupStatus, error) {
	var s store.StatusRow
	from, err := g.read(ctx, fmt.Sprintf("status of %q", g.row.Name), func(_ store.View, v store.ViewGroup) (err error) {
		s, err = v.Status(ctx, bound, g.c.dbNow())
		return err
	})
	if err != nil {
		return nil, err
	}
	out := &GroupStatus{Stream: g.stream, Group: g.row.Name, At: s.Now, Committed: Position(s.Committed), Cursor: Position(s.Cursor),
		Head: Position(s.Head), Available: s.Available, InFlight: s.InFlight, Retrying: s.Retrying, Quarantined: s.Quarantined,
		Dead: s.Dead, Lag: s.Available + s.InFlight + s.Retrying + s.Quarantined, Estimated: s.Estimated,
		OldestUnconsumed: s.Oldest, Ranges: s.Ranges, ExpiredRanges: s.ExpiredRanges, Members: members(s.Instances), ReadFrom: from}
	if !s.Oldest.IsZero() {
		out.OldestAge = max(0, s.Now.Sub(s.Oldest))
	}
	return out, nil
}

// DeadLetterDetail is one dead letter with its headers, its payload (as
// stored, JSON) and its delivery history (what the group's DeliveryLog mode
// recorded).
type DeadLetterDetail struct {
	DeadLetter
	Headers    Headers
	Payload    json.RawMessage
	Deliveries []Delivery
}

// Delivery is one recorded attempt.
type Delivery struct {
	Attempt int       `json:"attempt"`
	Outcome string    `json:"outcome"`
	Error   string    `json:"error"`
	At      time.Time `json:"at"`
}

// MaxDeliveriesShown bounds the delivery history DeadLetter returns.
const MaxDeliveriesShown = 1000

// DeadLetter reads one dead letter with its headers, payload and delivery history
// (at most MaxDeliveriesShown attempts, oldest first). A message that is
// not a dead letter of the group is ErrNotRegistered.
func (g *Group) DeadLetter(ctx context.Context, messageID int64) (*DeadLetterDetail, error) {
	var d store.DeadLetterRow
	from, err := g.read(ctx, fmt.Sprintf("dead letter of %q", g.row.Name), func(_ store.View, v store.ViewGroup) (err error) {
		d, err = v.DeadLetter(ctx, messageID, MaxDeliveriesShown)
		return err
	})
	if err != nil {
		return nil, err
	}
	out := &DeadLetterDetail{DeadLetter: deadLetter(d.DeadLetter, from), Headers: decodeHeaders(d.Headers), Payload: json.RawMessage(d.Payload)}
	for _, l := range d.Deliveries {
		out.Deliveries = append(out.Deliveries, Delivery(l))
	}
	return out, nil
}

// DeadLetters lists the group's dead letters in message id order, after
// afterID (0 for the first page), at most limit (1..1000).
func (g *Group) DeadLetters(ctx context.Context, afterID int64, limit int) ([]DeadLetter, error) {
	if limit < 1 || limit > 1000 {
		return nil, fmt.Errorf("%w: DeadLetters limit %d outside 1..1000", ErrInvalidConfig, limit)
	}
	var rows []store.DeadLetter
	from, err := g.read(ctx, fmt.Sprintf("dead letters of %q", g.row.Name), func(_ store.View, v store.ViewGroup) (err error) {
		rows, err = v.ListDead(ctx, afterID, limit)
		return err
	})
	if err != nil {
		return nil, err
	}
	out := make([]DeadLetter, len(rows))
	for i, r := range rows {
		out[i] = deadLetter(r, from)
	}
	return out, nil
}

// Redrive is an action: it puts one dead letter back on the retry curve
// from attempt zero, due now. It reports whether the message was dead.
func (g *Group) Redrive(ctx context.Context, messageID int64) (bool, error) {
	n, err := g.db().Redrive(ctx, &messageID, g.c.dbNow())
	if err != nil {
		return false, fmt.Errorf("redrive message %d of %q: %w", messageID, g.row.Name, err)
	}
	g.redriven(ctx, n)
	return n > 0, nil
}

// MaxRedriveIDs bounds one RedriveIDs call.
const MaxRedriveIDs = 1000

// RedriveIDs is an action: it redrives the dead letters among ids (at most
// MaxRedriveIDs) and returns how many were dead.
func (g *Group) RedriveIDs(ctx context.Context, ids []int64) (int64, error) {
	if len(ids) > MaxRedriveIDs {
		return 0, fmt.Errorf("%w: RedriveIDs takes at most %d ids, got %d", ErrInvalidConfig, MaxRedriveIDs, len(ids))
	}
	n, err := g.db().RedriveIDs(ctx, ids, g.c.dbNow())
	if err != nil {
		return 0, fmt.Errorf("redrive %d messages of %q: %w", len(ids), g.row.Name, err)
	}
	g.redriven(ctx, n)
	return n, nil
}

// RedriveAll is an action: it puts every dead letter of the group back on
// the curve and returns how many.
func (g *Group) RedriveAll(ctx context.Context) (int64, error) {
	n, err := g.db().Redrive(ctx, nil, g.c.dbNow())
	if err != nil {
		return 0, fmt.Errorf("redrive dead letters of %q: %w", g.row.Name, err)
	}
	g.redriven(ctx, n)
	return n, nil
}

// redriven counts redriven dead letters for the observer, and wakes the
// group's exception claimers in every process: the rows are due now, and a
// quiet claimer (decision 0038) would otherwise find them at its backstop
// sweep, minutes later.
func (g *Group) redriven(ctx context.Context, n int64) {
	if n > 0 {
		g.wake(ctx, store.GroupWake{GroupID: g.row.ID, Exceptions: true})
		g.c.observer().Count(g.stream, g.row.Name, EventRedriven, int(n))
	}
}

// wake wakes the group's claimers named in every process; a failed
// notification is logged (SQL0103): what it announces is committed, and a
// claimer finds it at its next sweep.
func (g *Group) wake(ctx context.Context, w store.GroupWake) {
	if err := g.c.store.WakeGroup(ctx, g.row.StreamID, w); err != nil {
		codes.WakeFailed.Log(ctx, g.c.cfg.Logger, "the action committed, but its wake-up notification failed; the group's claimers see it at their next sweep",
			"group", g.row.Name, "error", err)
	}
}

// SeekTo names where Seek moves a group's cursor. Make one with
// SeekBeginning, SeekHead, SeekTime or SeekID.
type SeekTo struct {
	to   string
	time time.Time
	id   int64
}

// SeekBeginning is the start of the retained log: the group receives every
// message retention has kept.
func SeekBeginning() SeekTo { return SeekTo{to: store.SeekBeginning} }

// SeekHead skips every message final now (Start's head rule: messages of
// transactions still open are delivered when they commit).
func SeekHead() SeekTo { return SeekTo{to: store.SeekHead} }

// SeekTime is the first position, in log order, of a message produced at or
// after t (the head when there is none).
func SeekTime(t time.Time) SeekTo { return SeekTo{to: store.SeekTime, time: t} }

// SeekID is the position of message id, which must be in the retained log.
func SeekID(id int64) SeekTo { return SeekTo{to: store.SeekID, id: id} }

// String names the target.
func (s SeekTo) String() string {
	switch s.to {
	case store.SeekTime:
		return "time " + s.time.UTC().Format(time.RFC3339Nano)
	case store.SeekID:
		return fmt.Sprintf("message %d", s.id)
	}
	return s.to
}

// SeekOptions are a Seek call's options.
type SeekOptions struct {
	// DryRun computes the new position and what would be dropped, and
	// changes nothing (a READ ONLY transaction).
	DryRun bool
}

// SeekResult is what a seek did (or, on a dry run, would do).
type SeekResult struct {
	// BeforeCursor and BeforeCommitted are the group's cursor and committed
	// position before the seek; After is its cursor (and committed
	// position) after: the next message delivered is the first after it.
	BeforeCursor, BeforeCommitted, After Position
	// Ranges and KeyLeases count the lapsed leases dropped; Retrying and
	// Dead the exception rows after After that were dropped (their
	// messages are delivered again from attempt zero).
	Ranges, KeyLeases, Retrying, Dead int64
	DryRun                            bool
}

// Seek is an action: it moves the group's cursor to the target, so that
// the next message delivered is the first after it (Kafka's
// --reset-offsets). It is refused (ErrGroupActive) while any instance of
// the group is live or any of its leases has not lapsed, and a target
// outside the retained log is ErrSeekTarget. Exception rows after the new
// position are dropped (their messages come again from the log, from
// attempt zero); those at or below it stay: a retrying message keeps
// retrying, a dead letter stays one. Decision 0024.
func (g *Group) Seek(ctx context.Context, to SeekTo, opts *SeekOptions) (*SeekResult, error) {
	if to.to == "" {
		return nil, fmt.Errorf("%w: Seek needs a target (SeekBeginning, SeekHead, SeekTime or SeekID)", ErrInvalidConfig)
	}
	if to.to == store.SeekID && to.id < 1 {
		return nil, fmt.Errorf("%w: SeekID %d: message ids start at 1", ErrInvalidConfig, to.id)
	}
	var o SeekOptions
	if opts != nil {
		o = *opts
	}
	r, err := g.db().Seek(ctx, store.SeekRequest{To: to.to, Time: to.time, ID: to.id, DryRun: o.DryRun, Now: g.c.dbNow()})
	if err != nil {
		return nil, fmt.Errorf("seek %q to %s: %w", g.row.Name, to, err)
	}
	if !o.DryRun { // a session starting now claims from the new position at once
		g.wake(ctx, store.GroupWake{GroupID: g.row.ID})
	}
	return &SeekResult{BeforeCursor: Position(r.BeforeCursor), BeforeCommitted: Position(r.BeforeCommitted), After: Position(r.After),
		Ranges: r.Ranges, KeyLeases: r.KeyLeases, Retrying: r.Retrying, Dead: r.Dead, DryRun: o.DryRun}, nil
}

// Declared is what a Declare call changed.
type Declared struct {
	// Changes lists every field that differs from the stored config
	// (old → new), as SQL0059 logs it; empty when nothing changed.
	Changes []string
}

// Declare is an action: it stores cfg as the group's whole config
// document, as Register does (newest wins; running instances pick it up at
// their next refresh), and logs SQL0059 naming the fields it changed. It
// does not change the binding set: cfg.Bindings must be nil or the set
// installed now (ErrBindingsChange otherwise), because a set changes only
// through Register and Consume, which wait for the instances holding the
// old one. Start is stored but changes nothing (it is read when a group is
// created).
func (g *Group) Declare(ctx context.Context, cfg ConsumerConfig) (*Declared, error) {
	if err := cfg.withDefaults().validate(); err != nil {
		return nil, err
	}
	if cfg.Bindings != nil {
		_, installed, err := g.db().BindingsInForce(ctx)
		if err != nil {
			return nil, fmt.Errorf("declare %q: %w", g.row.Name, err)
		}
		if !topic.SameSet(topic.NormalizeSet(cfg.Bindings), installed) {
			return nil, fmt.Errorf("%w: declare %q: Bindings %q differ from the installed set %q; change the set in the code that consumes (ConsumerConfig.Bindings at Register), or leave Bindings out",
				ErrBindingsChange, g.row.Name, cfg.Bindings, installed)
		}
	}
	docs, err := cfg.declared().Docs()
	if err != nil {
		return nil, fmt.Errorf("declare %q: %w", g.row.Name, err)
	}
	old, changed, err := g.c.store.DeclareGroupConfig(ctx, store.GroupConfigParams{GroupID: g.row.ID, Docs: docs, DeclaredBy: declaredBy(), Now: g.c.dbNow()})
	if err != nil {
		return nil, fmt.Errorf("declare %q: %w", g.row.Name, err)
	}
	out := &Declared{}
	if changed {
		changes, err := groupconfig.Diff(old, docs)
		if err != nil {
			return nil, fmt.Errorf("declare %q: %w", g.row.Name, err)
		}
		for _, c := range changes {
			out.Changes = append(out.Changes, c.String())
		}
		g.c.redeclared(ctx, "consumer group", g.row.Name, changes)
	}
	return out, nil
}

// Status reads the group's progress (see Group.Status).
func (c *Consumer[T]) Status(ctx context.Context) (*GroupStatus, error) { return c.admin().Status(ctx) }
