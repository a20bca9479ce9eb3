package sqlstreams

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/c1702965/sqlstreams/internal/alert"
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
// one of these groups declares the same set (AlertBindings(name)) and joins.
const (
	AlertGroupBindings = "sqlstreams.alerts.bindings"
	AlertGroupDelivery = "sqlstreams.alerts.delivery"
)

// AlertBindings returns the binding set of a seeded alert group (nil for
// any other name): a consumer of the group declares this set and joins.
func AlertBindings(group string) []string {
	switch group {
	case AlertGroupBindings:
		return []string{"binding.#"}
	case AlertGroupDelivery:
		return []string{"delivery.#"}
	}
	return nil
}

// Alert is a message on the AlertStream.
type Alert struct {
	Kind      string   `json:"kind"`
	Stream    string   `json:"stream"`
	Group     string   `json:"group"`
	Wanted    []string `json:"wanted,omitempty"`
	Installed []string `json:"installed,omitempty"`
	// LiveSessions counts the live Consume sessions holding the installed
	// set (a binding wait); LiveInstances their worker rows, two a session
	// (kept for readers of earlier alerts).
	LiveSessions  int `json:"live_sessions,omitempty"`
	LiveInstances int `json:"live_instances,omitempty"`
	// Since is when the condition began: the first waiting attempt of a
	// binding wait, the first claim held back by a delivery stall.
	Since  time.Time `json:"since"`
	Detail string    `json:"detail,omitempty"`
}

// SystemHandle is the handle of the library's own resources.
type SystemHandle struct{ c *Client }

// System returns the handle of the library's own resources.
func (c *Client) System() *SystemHandle { return &SystemHandle{c: c} }

// Register creates the alert stream and declares the binding sets of the
// seeded alert groups. Until it has run, alerts are only logged. An alert
// group's config is declared only while none is stored: a config an
// operator gave the group (its retries, say) is kept as a whole document,
// run after run.
func (h *SystemHandle) Register(ctx context.Context) error {
	alerts := Stream[Alert](h.c, AlertStream)
	if err := alerts.Register(ctx, nil); err != nil {
		return fmt.Errorf("register system: %w", err)
	}
	for _, name := range []string{AlertGroupBindings, AlertGroupDelivery} {
		if _, err := alerts.Consumer(name).register(ctx, &ConsumerConfig{Bindings: AlertBindings(name)}, declareSeed); err != nil {
			return fmt.Errorf("register system: %w", err)
		}
	}
	return nil
}

// publishAlerts returns the function a session's alerts actor publishes its
// events with: each becomes an Alert on the AlertStream, when the system is
// registered (until then alerts are only logged, by the actors that notice
// the conditions).
func (c *Client) publishAlerts(stream, group string, wanted []string) alert.Publish {
	return func(ctx context.Context, e alert.Event) error {
		var a Alert
		switch e.Kind {
		case alert.BindingWaiting:
			res := e.Binding
			a = Alert{Kind: AlertBindingWaiting, Stream: stream, Group: group, Wanted: wanted, Installed: res.Installed,
				LiveSessions: res.Sessions, LiveInstances: res.Live, Since: res.DeclaredAt,
				Detail: fmt.Sprintf("waiting since %s for %d live session(s) holding the installed set", e.Since.Format(time.RFC3339), res.Sessions)}
		case alert.DeliveryStalled:
			detail := fmt.Sprintf("committed messages have waited %s behind an open transaction", e.Waited)
			for _, b := range e.Blockers {
				detail += fmt.Sprintf("; pid %d (%s) open since %s, %s", b.PID, b.ApplicationName, b.XactStart.Format(time.RFC3339), b.State)
			}
			a = Alert{Kind: AlertDeliveryStalled, Stream: stream, Group: group, Since: e.Since, Detail: detail}
		default:
			return fmt.Errorf("unknown alert event %d", e.Kind)
		}
		_, err := Stream[Alert](c, AlertStream).Produce(ctx, a, &ProduceOptions{RoutingKey: a.Kind})
		if errors.Is(err, store.ErrNotFound) {
			return nil // the system is not registered: no alert stream
		}
		return err
	}
}
