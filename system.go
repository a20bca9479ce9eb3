package sqlstreams

import (
	"context"
	"errors"
	"fmt"
	"github.com/c1702965/sqlstreams/internal/codes"
	"time"

	"github.com/c1702965/sqlstreams/internal/store"
)

// AlertStream is the stream the system produces its alerts to.
const AlertStream = "sqlstreams.alerts"

// Alert kinds, also their routing keys.
const (
	AlertBindingWaiting  = "binding.waiting"  // a registration waits on a binding change
	AlertDeliveryStalled = "delivery.stalled" // an open transaction holds delivery back
)

// Seeded alert consumer groups and their static binding sets. A consumer of
// one of these groups declares the same set (AlertGroups[name]) and joins.
const (
	AlertGroupBindings = "sqlstreams.alerts.bindings"
	AlertGroupDelivery = "sqlstreams.alerts.delivery"
)

// AlertGroups maps each seeded alert group to its binding set.
var AlertGroups = map[string][]string{
	AlertGroupBindings: {"binding.#"},
	AlertGroupDelivery: {"delivery.#"},
}

// Alert is a message on the AlertStream.
type Alert struct {
	Kind          string   `json:"kind"`
	Stream        string   `json:"stream"`
	Group         string   `json:"group"`
	Wanted        []string `json:"wanted,omitempty"`
	Installed     []string `json:"installed,omitempty"`
	LiveInstances int      `json:"live_instances,omitempty"`
	// Since is when the condition began: the first waiting attempt of a
	// binding wait, the first claim held back by a delivery stall.
	Since  time.Time `json:"since"`
	Detail string    `json:"detail,omitempty"`
}

// SystemConfig is the system's stored config, declared at System().Register.
// It has no fields yet; nil is the only declaration.
type SystemConfig struct{}

// SystemHandle is the handle of the library's own resources.
type SystemHandle struct{ c *Client }

// System returns the handle of the library's own resources.
func (c *Client) System() *SystemHandle { return &SystemHandle{c: c} }

// Register creates the alert stream and declares the binding sets of the
// seeded alert groups. Until it has run, alerts are only logged.
func (h *SystemHandle) Register(ctx context.Context, _ *SystemConfig) error {
	alerts := Stream[Alert](h.c, AlertStream)
	if err := alerts.Register(ctx, nil); err != nil {
		return fmt.Errorf("register system: %w", err)
	}
	for _, name := range []string{AlertGroupBindings, AlertGroupDelivery} {
		if _, err := alerts.Consumer(name).Register(ctx, &ConsumerConfig{Bindings: AlertGroups[name]}); err != nil {
			return fmt.Errorf("register system: %w", err)
		}
	}
	return nil
}

// alert produces one alert if the system is registered. An alert that
// cannot be produced is logged; it never fails the caller.
func (c *Client) alert(ctx context.Context, a Alert) {
	s := Stream[Alert](c, AlertStream)
	_, err := s.Produce(ctx, a, &ProduceOptions{RoutingKey: a.Kind})
	if err != nil && !errors.Is(err, store.ErrNotFound) && ctx.Err() == nil {
		codes.AlertFailed.Log(ctx, c.cfg.Logger, "could not produce an alert", "kind", a.Kind, "group", a.Group, "error", err)
	}
}

func (c *Client) alertBindingWait(ctx context.Context, stream, group string, wanted []string, res store.BindingResult, since time.Time) {
	c.alert(ctx, Alert{Kind: AlertBindingWaiting, Stream: stream, Group: group, Wanted: wanted, Installed: res.Installed,
		LiveInstances: res.Live, Since: res.DeclaredAt,
		Detail: fmt.Sprintf("waiting since %s for %d live instance(s) holding the installed set", since.Format(time.RFC3339), res.Live)})
}

func (c *Client) alertStall(ctx context.Context, stream, group string, since time.Time, waited time.Duration, blockers []store.Blocker) {
	detail := fmt.Sprintf("committed messages have waited %s behind an open transaction", waited)
	for _, b := range blockers {
		detail += fmt.Sprintf("; pid %d (%s) open since %s, %s", b.PID, b.ApplicationName, b.XactStart.Format(time.RFC3339), b.State)
	}
	c.alert(ctx, Alert{Kind: AlertDeliveryStalled, Stream: stream, Group: group, Since: since, Detail: detail})
}
