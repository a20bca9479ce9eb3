package engine

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/c1702965/sqlstreams/internal/clocks"
	"github.com/c1702965/sqlstreams/internal/codes"
	"github.com/c1702965/sqlstreams/internal/hooks"
	"github.com/c1702965/sqlstreams/internal/observe"
	"github.com/c1702965/sqlstreams/internal/store"
	"github.com/c1702965/sqlstreams/internal/topic"
)

// Hub shares one LISTEN connection among every Consume session of a
// client: each produce transaction notifies once at commit, and the hub
// wakes the sessions of that stream, so an idle consumer claims at once
// instead of at its next poll. Polling stays the fallback: if the listening
// connection drops, the hub logs once and reconnects while sessions keep
// polling.
//
// The hub's goroutine is started by the first subscription and stopped, and
// waited for, by the last unsubscribe.
type Hub struct {
	store    *store.Store
	clock    clocks.Clock
	logger   *slog.Logger
	observer observe.Observer // counts reconnects
	retry    time.Duration

	// up: the listening connection is established (Listening).
	up atomic.Bool
	// hooks are a test's (SetHooks); nil in production, checked once
	// where each would act.
	hooks atomic.Pointer[hooks.Hub]

	mu     sync.Mutex
	subs   map[int64]map[chan struct{}]*sub // per stream: each subscriber (its range claimer's channel)
	refs   int
	cancel context.CancelFunc
	done   chan struct{}
}

// SetHooks gives the hub a test's hooks (internal/hooks.Hub), before the
// first Subscribe.
func (h *Hub) SetHooks(hk *hooks.Hub) { h.hooks.Store(hk) }

// NewHub returns a hub; nothing runs until Subscribe.
func NewHub(st *store.Store, clk clocks.Clock, logger *slog.Logger, obs observe.Observer) *Hub {
	return &Hub{store: st, clock: clk, logger: logger, observer: observe.Or(obs), retry: time.Second, subs: map[int64]map[chan struct{}]*sub{}}
}

// sub is one session's subscription: its group, its bindings, and the
// exception claimer's channel.
type sub struct {
	groupID    int64
	patterns   []string
	exceptions chan struct{}
}

// Wakes are a session's wake-up channels: Ranges receives a value when the
// stream is produced to (or the group's range claimers are named: a seek),
// Exceptions when the group's exception claimers are (a redrive).
type Wakes struct {
	Ranges, Exceptions <-chan struct{}
}

// Subscribe returns the wake-ups of group groupID of stream streamID, and
// the function that ends the subscription. With patterns (the group's
// bindings), only a produce with a matching routing key wakes its range
// claimer: the messages that match nothing it passes over at its next
// poll, so a group bound to a small slice of a busy stream costs about what
// an idle group does.
func (h *Hub) Subscribe(streamID, groupID int64, patterns []string) (Wakes, func()) {
	ch, exc := make(chan struct{}, 1), make(chan struct{}, 1)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.subs[streamID] == nil {
		h.subs[streamID] = map[chan struct{}]*sub{}
	}
	h.subs[streamID][ch] = &sub{groupID: groupID, patterns: patterns, exceptions: exc}
	if h.refs == 0 {
		ctx, cancel := context.WithCancel(context.Background())
		h.cancel, h.done = cancel, make(chan struct{})
		go h.run(ctx, h.done)
	}
	h.refs++
	var once sync.Once
	return Wakes{Ranges: ch, Exceptions: exc}, func() {
		once.Do(func() {
			h.mu.Lock()
			delete(h.subs[streamID], ch)
			h.refs--
			var cancel context.CancelFunc
			var done chan struct{}
			if h.refs == 0 {
				cancel, done = h.cancel, h.done
			}
			h.mu.Unlock()
			if cancel != nil { // the last one out stops the listener and waits for it
				cancel()
				<-done
			}
		})
	}
}

// Listening reports whether the hub's LISTEN connection is up: while it is,
// every produce wakes its sessions, and idle claimers skip their poll ticks
// (decision 0038). Each time it comes up, the first time included, it wakes
// every session (notifications may have been missed before it).
func (h *Hub) Listening() bool { return h.up.Load() }

func (h *Hub) wake(w store.Wake) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch, s := range h.subs[w.StreamID] {
		for _, g := range w.Groups {
			switch {
			case g.GroupID != s.groupID:
			case g.Exceptions:
				nudge(s.exceptions)
			default:
				nudge(ch)
			}
		}
		if len(w.Groups) > 0 && len(w.Keys) == 0 {
			continue // a group's wake alone: no produce's
		}
		if len(s.patterns) > 0 && w.Known && !slices.ContainsFunc(w.Keys, func(k string) bool { return topic.MatchAny(s.patterns, k) }) {
			continue
		}
		nudge(ch)
	}
}

// nudge sends a wake-up unless one is pending already.
func nudge(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// wakeAll is sent each time the listener comes up: notifications may have
// been missed.
func (h *Hub) wakeAll() {
	h.mu.Lock()
	ids := make([]int64, 0, len(h.subs))
	for id := range h.subs {
		ids = append(ids, id)
	}
	h.mu.Unlock()
	for _, id := range ids {
		h.wake(store.Wake{StreamID: id})
		h.mu.Lock()
		for _, s := range h.subs[id] { // a redrive's wake may have been missed too
			nudge(s.exceptions)
		}
		h.mu.Unlock()
	}
}

func (h *Hub) run(ctx context.Context, done chan struct{}) {
	defer close(done)
	lost := false
	for ctx.Err() == nil {
		l, err := h.store.Listen(ctx)
		if err == nil {
			if lost {
				h.logger.Info("notification listener reconnected")
				h.observer.Count("", "", observe.ListenerReconnect, 1)
				lost = false
			}
			h.up.Store(true)
			// Every session subscribed by now may have missed a
			// notification: while the listener was down, or, the first
			// time, between its probe of the stream and the LISTEN. A quiet
			// one would otherwise leave that produce for its backstop.
			h.wakeAll()
			h.hooks.Load().Listened(l.PID())
			err = h.listenWatched(ctx, l)
			h.up.Store(false)
			_ = l.Close(context.WithoutCancel(ctx))
		}
		if ctx.Err() != nil {
			return
		}
		if !lost {
			lost = true
			codes.ListenerLost.Log(ctx, h.logger, "notification listener lost its connection; consumers poll until it is back", "error", err)
		}
		t := h.clock.Timer(h.retry)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
	}
}

// checkEvery is ListenerCheck, unless the hooks set another.
func (h *Hub) checkEvery() time.Duration {
	if d := h.hooks.Load().CheckEvery(); d > 0 {
		return d
	}
	return ListenerCheck
}

// ListenerCheck is how often a hub that has heard nothing pings itself
// (store.Ping: a NOTIFY on its own channel through the pool). A ping still
// unheard two ListenerChecks later, in the database's time, means
// notifications no longer reach the listener (a connection that died
// without a reset reaching the client): it is closed and opened again, and
// every session woken. Quiet claimers rely on the listener (decision 0038),
// so a dead one must not go unnoticed until their backstop sweep.
const ListenerCheck = 10 * time.Second

// errPingUnheard ends a listener whose ping went unheard.
var errPingUnheard = errors.New("the listener did not hear its own ping: notifications no longer reach it")

// listenWatched listens on l while a watchdog pings it whenever nothing
// was heard for a ListenerCheck; both stop before it returns.
func (h *Hub) listenWatched(ctx context.Context, l *store.Listener) error {
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var heard atomic.Uint64 // notifications heard, pings included
	var dead atomic.Bool
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		if h.watch(lctx, &heard) {
			dead.Store(true)
			cancel()
		}
	}()
	err := h.listen(lctx, l, &heard)
	cancel()
	<-stopped
	if dead.Load() && ctx.Err() == nil {
		return errPingUnheard
	}
	return err
}

// watch pings while nothing is heard and reports true when a ping went
// unheard for two ListenerChecks of the database's time. It measures in the
// database's time, not the clock's: an injected clock that jumps ahead does
// not make a ping late.
func (h *Hub) watch(ctx context.Context, heard *atomic.Uint64) (dead bool) {
	every := h.checkEvery()
	t := h.clock.Ticker(every)
	defer t.Stop()
	last := heard.Load()
	var unheardSince *time.Time // the database's time of the first ping not heard
	for {
		select {
		case <-ctx.Done():
			return false
		case <-t.C():
		}
		if n := heard.Load(); n != last {
			last, unheardSince = n, nil
			continue
		}
		at, err := h.store.Ping(ctx)
		if err != nil {
			continue // the database is out of reach: the listener fails on its own
		}
		if unheardSince == nil {
			unheardSince = &at
			continue
		}
		if at.Sub(*unheardSince) >= 2*every {
			return true
		}
	}
}

func (h *Hub) listen(ctx context.Context, l *store.Listener, heard *atomic.Uint64) error {
	for {
		w, err := l.Wait(ctx)
		if err != nil {
			return err
		}
		if h.hooks.Load().IsDeaf() {
			continue
		}
		heard.Add(1)
		if !w.Ping {
			h.wake(w)
		}
	}
}
