package hooks

import (
	"sync/atomic"
	"time"

	"github.com/c1702965/sqlstreams/internal/testsignal"
)

// Hub are a client's wake-up hub's test hooks (engine.Hub.SetHooks); a
// hub without them (every production client) checks one pointer where each
// would act.
type Hub struct {
	// Listening carries the backend pid each time the hub starts listening.
	// Inert unless the test calls Init before setting the hooks.
	Listening testsignal.Signal[uint32]
	// Deaf, while set, makes the hub drop every notification it receives
	// unheard, as a connection that died without a reset would.
	Deaf atomic.Bool
	// Check, if set, replaces engine.ListenerCheck: how often a hub that
	// heard nothing pings itself. Read when a listener starts.
	Check time.Duration
}

// NewHub returns hub hooks whose Listening signal delivers.
func NewHub() *Hub {
	h := &Hub{}
	h.Listening.Init()
	return h
}

// Listened signals Listening, if h is set.
func (h *Hub) Listened(pid uint32) {
	if h != nil {
		h.Listening.Signal(pid)
	}
}

// IsDeaf reports whether Deaf is set (false for nil).
func (h *Hub) IsDeaf() bool { return h != nil && h.Deaf.Load() }

// CheckEvery returns Check (0 when unset).
func (h *Hub) CheckEvery() time.Duration {
	if h == nil {
		return 0
	}
	return h.Check
}
