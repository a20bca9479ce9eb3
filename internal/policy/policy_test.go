package policy

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestResolveLayersAndClamps(t *testing.T) {
	lib := Effective{Timeout: DefaultTimeout, MaxRetries: DefaultMaxRetries, MaxDelays: DefaultMaxDelays,
		BaseDelay: DefaultBaseDelay, MaxDelay: DefaultMaxDelay, Exponent: DefaultExponent, Concurrency: Parallel}
	with := func(f func(*Effective)) Effective { e := lib; f(&e); return e }
	for _, tc := range []struct {
		name string
		msg  Options
		g    Group
		want Effective
	}{
		{"library defaults", Options{}, Group{}, lib},
		{"group defaults fill the unset", Options{}, Group{Message: Options{Timeout: 10 * time.Second, MaxRetries: 3}},
			with(func(e *Effective) { e.Timeout, e.MaxRetries = 10*time.Second, 3 })},
		{"the message's own beat the group's", Options{Timeout: 2 * time.Second, Exponent: 1},
			Group{Message: Options{Timeout: 10 * time.Second, Exponent: 3}},
			with(func(e *Effective) { e.Timeout, e.Exponent = 2*time.Second, 1 })},
		{"None means zero, not unset", Options{MaxRetries: None}, Group{Message: Options{MaxRetries: 7}},
			with(func(e *Effective) { e.MaxRetries = 0 })},
		{"max clamps what the message asks", Options{Timeout: time.Hour, MaxRetries: 50}, Group{Max: Options{Timeout: time.Minute, MaxRetries: 10}},
			with(func(e *Effective) { e.Timeout, e.MaxRetries = time.Minute, 10 })},
		{"max clamps defaults too", Options{}, Group{Max: Options{Timeout: 5 * time.Second, MaxDelay: time.Minute}},
			with(func(e *Effective) { e.Timeout, e.MaxDelay = 5*time.Second, time.Minute })},
		{"min raises", Options{Timeout: time.Millisecond, MaxRetries: None}, Group{Min: Options{Timeout: time.Second, MaxRetries: 2}},
			with(func(e *Effective) { e.Timeout, e.MaxRetries = time.Second, 2 })},
		{"a None ceiling means zero", Options{MaxRetries: 4}, Group{Max: Options{MaxRetries: None}},
			with(func(e *Effective) { e.MaxRetries = 0 })},
		{"base, max delay and exponent clamp", Options{BaseDelay: time.Millisecond, MaxDelay: 48 * time.Hour, Exponent: 9},
			Group{Min: Options{BaseDelay: 100 * time.Millisecond}, Max: Options{MaxDelay: 24 * time.Hour, Exponent: 4}},
			with(func(e *Effective) { e.BaseDelay, e.MaxDelay, e.Exponent = 100*time.Millisecond, 24*time.Hour, 4 })},
		{"max delays", Options{MaxDelays: 100}, Group{Max: Options{MaxDelays: 20}}, with(func(e *Effective) { e.MaxDelays = 20 })},
		{"concurrency from the message", Options{Concurrency: Ordered}, Group{Message: Options{Concurrency: Exclusive}},
			with(func(e *Effective) { e.Concurrency = Ordered })},
		{"concurrency from the group", Options{}, Group{Message: Options{Concurrency: Exclusive}},
			with(func(e *Effective) { e.Concurrency = Exclusive })},
		{"override beats everything", Options{Concurrency: Ordered}, Group{Message: Options{Concurrency: Ordered}, Override: Parallel},
			with(func(e *Effective) { e.Concurrency = Parallel })},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, Resolve(tc.msg, tc.g))
		})
	}
}

func TestRetryCurve(t *testing.T) {
	e := Effective{BaseDelay: time.Second, MaxDelay: time.Minute, Exponent: 2}
	initial := 5 * time.Second
	var got []time.Duration
	for n := 1; n <= 10; n++ {
		got = append(got, e.RetryDelay(n, initial))
	}
	require.Equal(t, []time.Duration{5 * time.Second, time.Second, 4 * time.Second, 9 * time.Second, 16 * time.Second,
		25 * time.Second, 36 * time.Second, 49 * time.Second, time.Minute, time.Minute}, got)
	huge := Effective{BaseDelay: time.Hour, MaxDelay: time.Hour, Exponent: 500}
	require.Equal(t, time.Hour, huge.RetryDelay(1000, 0), "no overflow past MaxDelay")
}

func TestDecide(t *testing.T) {
	e := Effective{MaxRetries: 2, MaxDelays: 1, BaseDelay: time.Second, MaxDelay: time.Hour, Exponent: 2}
	initial := 3 * time.Second
	fail := errors.New("boom")
	require.Equal(t, Next{Delete: true}, Decide(e, initial, 0, 0, nil))
	require.Equal(t, Next{Status: StatusPending, Attempts: 1, After: 3 * time.Second}, Decide(e, initial, 0, 0, fail))
	require.Equal(t, Next{Status: StatusPending, Attempts: 2, After: time.Second}, Decide(e, initial, 1, 0, fail))
	require.Equal(t, Next{Status: StatusDead, Attempts: 3}, Decide(e, initial, 2, 0, fail), "MaxRetries retries, then dead")
	require.Equal(t, Next{Status: StatusDead, Attempts: 1}, Decide(e, initial, 0, 0, &TerminalError{Err: fail}))
	require.Equal(t, Next{Status: StatusDead, Attempts: 2}, Decide(e, initial, 1, 0, fmt.Errorf("wrapped: %w", &TerminalError{Err: fail})))
	require.Equal(t, Next{Status: StatusPending, Attempts: 1, Delays: 1, After: time.Minute}, Decide(e, initial, 1, 0, &DelayError{D: time.Minute}), "a delay spends no retry")
	require.Equal(t, Next{Status: StatusPending, Attempts: 2, Delays: 1, After: time.Second}, Decide(e, initial, 1, 1, &DelayError{D: time.Minute}), "past MaxDelays a delay is a failure")
	none := e
	none.MaxRetries = 0
	require.Equal(t, Next{Status: StatusDead, Attempts: 1}, Decide(none, initial, 0, 0, fail))
}

func TestOptionsDocumentIsSparse(t *testing.T) {
	b, err := json.Marshal(Options{})
	require.NoError(t, err)
	require.JSONEq(t, `{}`, string(b))
	o := Options{Timeout: 10 * time.Second, MaxRetries: 5, BaseDelay: 2 * time.Second, Concurrency: Exclusive}
	b, err = json.Marshal(o)
	require.NoError(t, err)
	require.JSONEq(t, `{"timeout":"10s","retry":{"max_retries":5,"base_delay":"2s"},"concurrency":"exclusive"}`, string(b))
	back, err := Parse(b)
	require.NoError(t, err)
	require.Equal(t, o, back)
	_, err = Parse([]byte(`{"timeout":"soon"}`))
	require.Error(t, err)
}

func TestValidate(t *testing.T) {
	require.NoError(t, Options{MaxRetries: None, Concurrency: Ordered}.Validate("x"))
	for _, o := range []Options{{Timeout: -1}, {MaxRetries: -2}, {Exponent: -1}, {Concurrency: "random"}} {
		require.Error(t, o.Validate("x"))
	}
}
