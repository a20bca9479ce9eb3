package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/c1702965/sqlstreams"
	"github.com/c1702965/sqlstreams/internal/pgtest"
	"github.com/stretchr/testify/require"
)

type order struct {
	ID   int    `json:"id"`
	Note string `json:"note"`
}

// opsFixture is a migrated schema with stream "orders" and group
// "billing", which has consumed every message: dead of them failed
// terminally (dead letters), the rest succeeded.
type opsFixture struct {
	schema string
	client *sqlstreams.Client
	stream *sqlstreams.StreamHandle[order]
	group  *sqlstreams.Consumer[order]
	dead   []int64 // the dead letters' message ids
	n      int
}

func newOpsFixture(t *testing.T, n, dead int) *opsFixture {
	t.Helper()
	ctx := context.Background()
	f := &opsFixture{schema: pgtest.Schema(t), n: n}
	t.Setenv("SQLSTREAMS_DATABASE_URL", pgtest.URL())
	var err error
	f.client, err = sqlstreams.NewClient(ctx, pgtest.Pool(t), &sqlstreams.ClientConfig{Schema: f.schema})
	require.NoError(t, err)
	f.stream = sqlstreams.Stream[order](f.client, "orders")
	require.NoError(t, f.stream.Register(ctx, nil))
	f.group, err = f.stream.Consumer("billing").Register(ctx, &sqlstreams.ConsumerConfig{
		Message: &sqlstreams.MessageOptions{Timeout: 10 * time.Second}, DeliveryLog: sqlstreams.DeliveryLogAll})
	require.NoError(t, err)
	items := make([]sqlstreams.BatchItem[order], n)
	for i := range items {
		note := "ok"
		if i < dead {
			note = "poison"
		}
		items[i] = sqlstreams.BatchItem[order]{Msg: order{ID: i, Note: note}, Headers: sqlstreams.Headers{"X-Tenant": "acme"}}
	}
	ps, err := f.stream.ProduceBatch(ctx, items, nil)
	require.NoError(t, err)
	for i := range dead {
		f.dead = append(f.dead, ps[i].ID)
	}
	f.consumeAll(t)
	return f
}

// consumeAll runs the group until its handler has seen every message once,
// then stops it gracefully (which commits what it settled).
func (f *opsFixture) consumeAll(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var seen atomic.Int64
	all := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- f.group.Consume(ctx, func(ctx context.Context, o *order) error {
			if seen.Add(1) == int64(f.n) {
				close(all)
			}
			if o.Note == "poison" {
				return sqlstreams.Terminal(errors.New("poison message"))
			}
			return nil
		}, &sqlstreams.ConsumeOptions{ClaimPollRate: 10 * time.Millisecond, DisableManager: true})
	}()
	limit, stop := context.WithTimeout(ctx, time.Minute)
	defer stop()
	select {
	case <-all:
	case err := <-done:
		t.Fatalf("Consume returned before handling every message: %v", err)
	case <-limit.Done():
		t.Fatal("the group did not handle every message within a minute")
	}
	cancel()
	require.NoError(t, <-done)
}

// cli runs the command line with args and -schema, returning its output.
func (f *opsFixture) cli(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	err := runCtx(context.Background(), append(args, "-schema", f.schema), &out)
	return out.String(), err
}

func (f *opsFixture) ok(t *testing.T, args ...string) string {
	t.Helper()
	out, err := f.cli(t, args...)
	require.NoError(t, err, "%q:\n%s", args, out)
	return out
}

func (f *opsFixture) describe(t *testing.T) describeRow {
	t.Helper()
	var rows []describeRow
	require.NoError(t, json.Unmarshal([]byte(f.ok(t, "groups", "describe", "orders", "billing", "-o", "json")), &rows))
	require.Len(t, rows, 1)
	return rows[0]
}

func TestStreamsAndGroupsVerbs(t *testing.T) {
	f := newOpsFixture(t, 20, 2)
	out := f.ok(t, "streams", "ls")
	require.Regexp(t, `(?m)^STREAM\s+RETAINED\s+GROUPS\s+NAMES\s+CONFIG$`, out)
	require.Regexp(t, `(?m)^orders\s+\d+(\.\d)? [KMG]?i?B\s+1\s+billing\s+`, out)
	var streams []struct {
		Name          string   `json:"name"`
		RetainedBytes int64    `json:"retained_bytes"`
		Groups        []string `json:"groups"`
	}
	require.NoError(t, json.Unmarshal([]byte(f.ok(t, "streams", "ls", "-o", "json")), &streams))
	require.Len(t, streams, 1)
	require.Equal(t, []string{"billing"}, streams[0].Groups)
	require.Positive(t, streams[0].RetainedBytes)

	out = f.ok(t, "groups", "ls")
	require.Regexp(t, `(?m)^billing\s+orders\s+beginning\s+`, out)
	out = f.ok(t, "groups", "ls", "-stream", "orders", "-o", "json")
	require.Contains(t, out, `"name": "billing"`)

	out = f.ok(t, "groups", "describe", "orders")
	require.Regexp(t, `(?m)^GROUP\s+STREAM\s+COMMITTED\s+HEAD\s+LAG\s+AVAILABLE\s+IN-FLIGHT\s+RETRYING\s+DEAD\s+OLDEST-AGE\s+SESSIONS$`, out)
	require.Regexp(t, `(?m)^billing\s+orders\s+\d+\s+\d+\s+0\s+0\s+0\s+0\s+2\s+-\s+0$`, out)
	row := f.describe(t)
	require.Zero(t, row.Lag)
	require.EqualValues(t, 2, row.Dead)
	require.Equal(t, row.Head, row.Committed)

	// Mistyped names are errors naming them, and create nothing.
	for _, args := range [][]string{
		{"groups", "describe", "ordres", "billing"},
		{"groups", "describe", "orders", "biling"},
		{"groups", "ls", "-stream", "ordres"},
		{"inspect", "orders", "biling"},
		{"bindings", "orders", "biling"},
		{"dlq", "ls", "orders", "biling"},
		{"groups", "seek", "orders", "biling", "-to-head", "-execute"},
	} {
		_, err := f.cli(t, args...)
		require.ErrorIs(t, err, sqlstreams.ErrNotRegistered, "%q", args)
		require.Regexp(t, `"(ordres|biling)"`, err.Error())
	}
	gs, err := f.client.Groups(context.Background(), "")
	require.NoError(t, err)
	require.Len(t, gs, 1, "a mistyped name created a group")

	// A schema migrate has not set up is an error, not a new schema.
	var out2 bytes.Buffer
	missing := pgtest.Schema(t)
	err = runCtx(context.Background(), []string{"streams", "ls", "-schema", missing}, &out2)
	require.ErrorIs(t, err, sqlstreams.ErrNotMigrated)
	s, err := sqlstreams.MigrationStatus(context.Background(), pgtest.Pool(t), missing)
	require.NoError(t, err)
	require.False(t, s.Exists)
}

func TestInspectAndDeclareVerbsRoundTrip(t *testing.T) {
	f := newOpsFixture(t, 3, 0)
	out := f.ok(t, "inspect", "orders", "billing")
	require.Regexp(t, `(?m)^message\.timeout\s+10s\s+declared$`, out)
	require.Regexp(t, `(?m)^delivery_log\s+all\s+declared$`, out)

	var in struct {
		Config json.RawMessage `json:"config"`
	}
	require.NoError(t, json.Unmarshal([]byte(f.ok(t, "inspect", "orders", "billing", "-o", "json")), &in))
	require.JSONEq(t, `{"message":{"timeout":"10s"},"delivery_log":"all"}`, string(in.Config))
	file := filepath.Join(t.TempDir(), "config.json")
	require.NoError(t, os.WriteFile(file, in.Config, 0o600))
	require.Contains(t, f.ok(t, "groups", "declare", "orders", "billing", "-f", file), "unchanged")

	require.NoError(t, os.WriteFile(file, []byte(`{"message":{"timeout":"20s","retry":{"max_retries":2}},"delivery_log":"all"}`), 0o600))
	out = f.ok(t, "groups", "declare", "orders", "billing", "-f", file)
	require.Contains(t, out, "declared; changed:")
	require.Contains(t, out, "message.timeout")
	require.Contains(t, out, "max_retries")
	require.Regexp(t, `(?m)^message\.timeout\s+20s\s+declared$`, f.ok(t, "inspect", "orders", "billing"))

	for doc, want := range map[string]string{
		`{"mesage":{}}`:                     `unknown field "mesage"`,
		`{"message":{"timeout":"-1s"}}`:     "Message.Timeout -1s",
		`{"bindings":["orders.eu"]}`:        "binding set change",
		`{"message":{"concurrency":"huh"}}`: `Message.Concurrency "huh"`,
	} {
		require.NoError(t, os.WriteFile(file, []byte(doc), 0o600))
		_, err := f.cli(t, "groups", "declare", "orders", "billing", "-f", file)
		require.ErrorContains(t, err, want, doc)
	}
	_, err := f.cli(t, "groups", "declare", "orders", "billing")
	require.ErrorContains(t, err, "-f FILE is required")
}

func TestBindingsVerb(t *testing.T) {
	f := newOpsFixture(t, 1, 0)
	out := f.ok(t, "bindings", "orders", "billing")
	require.Regexp(t, `(?m)^STATUS\s+PATTERNS\s+DECLARED-BY\s+SINCE\s+LAST-ATTEMPT$`, out)
	require.Contains(t, out, "the whole stream")
	var l sqlstreams.BindingListing
	require.NoError(t, json.Unmarshal([]byte(f.ok(t, "bindings", "orders", "billing", "-o", "json")), &l))
	require.Empty(t, l.Waiting)
}

func TestDeadLetterVerbs(t *testing.T) {
	f := newOpsFixture(t, 10, 3)
	out := f.ok(t, "dlq", "ls", "orders", "billing")
	require.Regexp(t, `(?m)^ID\s+ATTEMPTS\s+DIED\s+KEY\s+ROUTING-KEY\s+LAST-ERROR$`, out)
	for _, id := range f.dead {
		require.Regexp(t, fmt.Sprintf(`(?m)^%d\s+1\s+\S+\s+-\s+-\s+.*poison message`, id), out)
	}
	out = f.ok(t, "dlq", "ls", "orders", "billing", "-limit", "2")
	require.Contains(t, out, fmt.Sprintf("(more: -after %d)", f.dead[1]))
	var page struct {
		DeadLetters []sqlstreams.DeadLetter `json:"dead_letters"`
		NextAfter   *int64                  `json:"next_after"`
	}
	require.NoError(t, json.Unmarshal([]byte(f.ok(t, "dlq", "ls", "orders", "billing", "-after", strconv.FormatInt(f.dead[1], 10), "-o", "json")), &page))
	require.Len(t, page.DeadLetters, 1)
	require.Equal(t, f.dead[2], page.DeadLetters[0].MessageID)
	require.Nil(t, page.NextAfter, "the last page says so")
	require.NoError(t, json.Unmarshal([]byte(f.ok(t, "dlq", "ls", "orders", "billing", "-limit", "2", "-o", "json")), &page))
	require.Len(t, page.DeadLetters, 2)
	require.NotNil(t, page.NextAfter, "a page with more after it gives the next page's cursor (issue 60)")
	require.Equal(t, f.dead[1], *page.NextAfter)
	out = f.ok(t, "dlq", "ls", "orders", "billing", "-limit", "3")
	require.NotContains(t, out, "(more:", "three dead letters in a page of three: no more")

	id := strconv.FormatInt(f.dead[0], 10)
	out = f.ok(t, "dlq", "show", "orders", "billing", id)
	require.Contains(t, out, `{"id":0,"note":"poison"}`)
	require.Regexp(t, `(?m)^1\s+dead\s+`, out, "the delivery history")
	var d struct {
		MessageID  int64                 `json:"message_id"`
		Headers    sqlstreams.Headers    `json:"headers"`
		Payload    json.RawMessage       `json:"payload"`
		Deliveries []sqlstreams.Delivery `json:"deliveries"`
	}
	require.Regexp(t, `(?m)^header X-Tenant\s+acme$`, out, "its headers (issue 60: omitted)")
	require.NoError(t, json.Unmarshal([]byte(f.ok(t, "dlq", "show", "orders", "billing", id, "-o", "json")), &d))
	require.Equal(t, f.dead[0], d.MessageID)
	require.Equal(t, sqlstreams.Headers{"X-Tenant": "acme"}, d.Headers)
	require.JSONEq(t, `{"id":0,"note":"poison"}`, string(d.Payload))
	require.Len(t, d.Deliveries, 1)
	_, err := f.cli(t, "dlq", "show", "orders", "billing", "999999")
	require.ErrorIs(t, err, sqlstreams.ErrNotRegistered)
	_, err = f.cli(t, "dlq", "show", "orders", "billing", "x")
	require.ErrorContains(t, err, "want a positive integer")

	// Redrive: a dry run changes nothing; then one, then the rest.
	require.Contains(t, f.ok(t, "dlq", "redrive", "orders", "billing", id, "-dry-run"), "would redrive 1 dead letter(s)")
	require.EqualValues(t, 3, f.describe(t).Dead)
	out = f.ok(t, "dlq", "redrive", "orders", "billing", id, "999999")
	require.Contains(t, out, "redrove 1 dead letter(s)")
	require.Contains(t, out, "not dead letters of billing (skipped): 999999")
	row := f.describe(t)
	require.EqualValues(t, 2, row.Dead)
	require.EqualValues(t, 1, row.Retrying)
	require.Contains(t, f.ok(t, "dlq", "redrive", "orders", "billing", "-all", "-dry-run"), "would redrive 2")
	require.Contains(t, f.ok(t, "dlq", "redrive", "orders", "billing", "-all"), "redrove 2 dead letter(s)")
	require.Zero(t, f.describe(t).Dead)
	_, err = f.cli(t, "dlq", "redrive", "orders", "billing")
	require.ErrorContains(t, err, "give message ids or -all")
}

func TestSeekVerb(t *testing.T) {
	f := newOpsFixture(t, 5, 0)
	before := f.describe(t)
	require.Zero(t, before.Lag)

	out := f.ok(t, "groups", "seek", "orders", "billing", "-to-beginning")
	require.Contains(t, out, "would move (dry run; -execute applies it) to beginning")
	require.Regexp(t, `(?m)^before\s+\d+\s+\d+$`, out)
	require.Regexp(t, `(?m)^after\s+0\s+0$`, out)
	require.Equal(t, before.Cursor, f.describe(t).Cursor, "a dry run moves nothing")

	out = f.ok(t, "groups", "seek", "orders", "billing", "-to-beginning", "-execute")
	require.Contains(t, out, "moved to beginning")
	require.EqualValues(t, 5, f.describe(t).Lag, "every message is the group's again")
	f.consumeAll(t)
	require.Zero(t, f.describe(t).Lag)

	var res map[string]any
	require.NoError(t, json.Unmarshal([]byte(f.ok(t, "groups", "seek", "orders", "billing", "-to-id", strconv.FormatInt(before.Head.ID, 10), "-execute", "-o", "json")), &res))
	require.Equal(t, false, res["dry_run"])
	require.EqualValues(t, 1, f.describe(t).Lag)
	f.ok(t, "groups", "seek", "orders", "billing", "-to-time", time.Now().Add(time.Hour).UTC().Format(time.RFC3339), "-execute")
	require.Zero(t, f.describe(t).Lag)

	for args, want := range map[string]string{
		"-to-head -to-beginning": "exactly one of",
		"":                       "exactly one of",
		"-to-time yesterday":     "want RFC3339",
		"-to-id 999999":          "has not been produced",
	} {
		_, err := f.cli(t, append([]string{"groups", "seek", "orders", "billing"}, strings.Fields(args)...)...)
		require.ErrorContains(t, err, want, args)
	}

	// To the head: the head, not message 0 (issue 60: "after 0 0").
	f.ok(t, "groups", "seek", "orders", "billing", "-to-beginning", "-execute")
	head := strconv.FormatInt(before.Head.ID, 10)
	out = f.ok(t, "groups", "seek", "orders", "billing", "-to-head", "-execute")
	require.Regexp(t, `(?m)^after\s+`+head+`\s+`+head+`$`, out)
	row := f.describe(t)
	require.Equal(t, before.Head.ID, row.Committed.ID)
	require.Zero(t, row.Lag)

	// Refused while an instance is live; the instance counts as one session.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := sqlstreams.NewReadiness()
	done := make(chan error, 1)
	go func() {
		done <- f.group.Consume(ctx, func(context.Context, *order) error { return nil },
			&sqlstreams.ConsumeOptions{Readiness: ready, DisableManager: true})
	}()
	require.NoError(t, ready.Wait(ctx))
	require.Regexp(t, `(?m)^billing\s+orders\s+`+head+`\s+`+head+`\s+0\s+0\s+0\s+0\s+0\s+-\s+1$`, f.ok(t, "groups", "describe", "orders"),
		"one session, though it holds a row per worker")
	require.Equal(t, 1, f.describe(t).Sessions)
	for _, exec := range []string{"", "-execute"} {
		args := []string{"groups", "seek", "orders", "billing", "-to-beginning"}
		if exec != "" {
			args = append(args, exec)
		}
		_, err := f.cli(t, args...)
		require.ErrorIs(t, err, sqlstreams.ErrGroupActive)
		require.ErrorContains(t, err, "live instance")
	}
	cancel()
	require.NoError(t, <-done)
}

func TestMigrateVerbs(t *testing.T) {
	schema := pgtest.Schema(t)
	t.Setenv("SQLSTREAMS_DATABASE_URL", pgtest.URL())
	run := func(args ...string) string {
		var out bytes.Buffer
		require.NoError(t, runCtx(context.Background(), append(args, "-schema", schema), &out), "%q", args)
		return out.String()
	}
	require.Contains(t, run("migrate", "status"), "not migrated")
	sql := run("migrate", "sql")
	require.Contains(t, sql, "CREATE TABLE")
	require.Contains(t, sql, "creates them when a stream is first registered", "it says which DDL stays at run time")
	_, err := pgtest.Pool(t).Exec(context.Background(), sql)
	require.NoError(t, err)
	require.Regexp(t, `version (\d+) of (\d+), up to date`, run("migrate", "status"))
	require.Contains(t, run("migrate", "up"), "is up to date")
	var st map[string]any
	require.NoError(t, json.Unmarshal([]byte(run("migrate", "status", "-o", "json")), &st))
	require.Equal(t, true, st["exists"])
	require.Equal(t, st["latest"], st["applied"])
}

// Every read verb succeeds on a connection whose every transaction is READ
// ONLY: they write nothing.
func TestReadVerbsRunOnAReadOnlyConnection(t *testing.T) {
	f := newOpsFixture(t, 4, 1)
	sep := "?"
	if strings.Contains(pgtest.URL(), "?") {
		sep = "&"
	}
	t.Setenv("SQLSTREAMS_DATABASE_URL", pgtest.URL()+sep+"default_transaction_read_only=on")
	id := strconv.FormatInt(f.dead[0], 10)
	for _, args := range [][]string{
		{"streams", "ls"}, {"groups", "ls"}, {"groups", "describe", "orders"}, {"groups", "describe", "orders", "billing"},
		{"inspect", "orders", "billing"}, {"bindings", "orders", "billing"}, {"dlq", "ls", "orders", "billing"},
		{"dlq", "show", "orders", "billing", id}, {"dlq", "redrive", "orders", "billing", id, "-dry-run"},
		{"dlq", "redrive", "orders", "billing", "-all", "-dry-run"}, {"groups", "seek", "orders", "billing", "-to-beginning"},
		{"migrate", "status"},
	} {
		for _, format := range []string{"table", "json"} {
			f.ok(t, append(args, "-o", format)...)
		}
	}
	// The connection really is read-only: an action fails on it.
	_, err := f.cli(t, "dlq", "redrive", "orders", "billing", id)
	require.ErrorContains(t, err, "read-only transaction")
}

// The operator verbs' arguments are checked before anything connects.
func TestOperatorVerbsCheckTheirArguments(t *testing.T) {
	t.Setenv("SQLSTREAMS_DATABASE_URL", unreachableURL)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"streams"}, "streams: missing arguments"},
		{[]string{"streams", "drop"}, `streams: unknown subcommand "drop"`},
		{[]string{"streams", "rm"}, "streams rm: missing arguments"},
		{[]string{"groups", "rm", "s"}, "groups rm: missing arguments"},
		{[]string{"streams", "ls", "typo"}, `streams: unexpected argument "typo"`},
		{[]string{"groups"}, "groups: missing subcommand"},
		{[]string{"groups", "delete"}, `groups: unknown subcommand "delete"`},
		{[]string{"groups", "describe"}, "groups describe: missing arguments"},
		{[]string{"groups", "describe", "s", "g", "typo"}, `groups describe: unexpected argument "typo"`},
		{[]string{"groups", "ls", "typo"}, `groups ls: unexpected argument "typo"`},
		{[]string{"inspect", "s"}, "inspect: missing arguments"},
		{[]string{"bindings", "s", "g", "-stale-after", "0s"}, "-stale-after 0s must be positive"},
		{[]string{"dlq"}, "dlq: missing subcommand"},
		{[]string{"dlq", "ls", "s", "g", "-limit", "0"}, "-limit 0 outside 1..1000"},
		{[]string{"groups", "describe", "s", "-o", "yaml"}, `-o "yaml": want table or json`},
		{[]string{"groups", "describe", "s", "-schema", "Bad"}, "-schema: "},
		{[]string{"migrate", "down"}, `migrate: unknown subcommand "down"`},
		{[]string{"migrate", "up", "typo"}, `migrate: unexpected argument "typo"`},
	} {
		var out bytes.Buffer
		err := runCtx(context.Background(), c.args, &out)
		require.ErrorContains(t, err, c.want, "%q", c.args)
		require.NotContains(t, err.Error(), "connect", "%q tried to connect", c.args)
	}
	for _, args := range [][]string{{"groups", "ls", "-h"}, {"groups", "describe", "-h"}, {"groups", "seek", "-h"}, {"groups", "declare", "-h"},
		{"dlq", "ls", "-h"}, {"dlq", "show", "-h"}, {"dlq", "redrive", "-h"}, {"migrate", "status", "-h"}} {
		var out bytes.Buffer
		require.NoError(t, runCtx(context.Background(), args, &out), "%q", args)
		require.Contains(t, out.String(), "usage: sqlstreams "+args[0], "%q", args)
	}
}

// Built as a binary, the command prints tables, exits 0, and on an error
// prints one line on stderr and exits 1.
func TestTheBuiltBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the command")
	}
	f := newOpsFixture(t, 3, 1)
	bin := filepath.Join(t.TempDir(), "sqlstreams")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Stderr = os.Stderr
	require.NoError(t, build.Run())
	cmd := func(args ...string) (string, string, error) {
		c := exec.Command(bin, append(args, "-schema", f.schema)...)
		c.Env = append(os.Environ(), "SQLSTREAMS_DATABASE_URL="+pgtest.URL())
		var stdout, stderr bytes.Buffer
		c.Stdout, c.Stderr = &stdout, &stderr
		err := c.Run()
		return stdout.String(), stderr.String(), err
	}
	out, errOut, err := cmd("groups", "describe", "orders", "billing")
	require.NoError(t, err, errOut)
	require.Regexp(t, `(?m)^billing\s+orders\s+\d+\s+\d+\s+0\s+0\s+0\s+0\s+1\s+-\s+0$`, out)
	out, _, err = cmd("dlq", "ls", "orders", "billing", "-o", "json")
	require.NoError(t, err)
	require.Contains(t, out, `"last_error"`)
	out, errOut, err = cmd("groups", "describe", "orders", "biling")
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit)
	require.Equal(t, 1, exit.ExitCode())
	require.Empty(t, out)
	require.Equal(t, 1, strings.Count(errOut, "\n"), "one line: %q", errOut)
	require.Contains(t, errOut, `"biling"`)
	_, _, err = cmd("groups", "-h")
	require.NoError(t, err, "-h exits 0")

	// Every verb, once, as the binary.
	id := strconv.FormatInt(f.dead[0], 10)
	file := filepath.Join(t.TempDir(), "config.json")
	require.NoError(t, os.WriteFile(file, []byte(`{"message":{"timeout":"10s"},"delivery_log":"all"}`), 0o600))
	for _, args := range [][]string{
		{"streams", "ls"}, {"groups", "ls"}, {"groups", "describe", "orders"}, {"inspect", "orders", "billing"},
		{"bindings", "orders", "billing"}, {"dlq", "ls", "orders", "billing"}, {"dlq", "show", "orders", "billing", id},
		{"dlq", "redrive", "orders", "billing", id, "-dry-run"}, {"dlq", "redrive", "orders", "billing", id},
		{"groups", "seek", "orders", "billing", "-to-head"}, {"groups", "seek", "orders", "billing", "-to-head", "-execute"},
		{"groups", "declare", "orders", "billing", "-f", file}, {"migrate", "status"}, {"migrate", "sql"}, {"migrate", "up"},
	} {
		out, errOut, err := cmd(args...)
		require.NoError(t, err, "%q: %s", args, errOut)
		require.NotEmpty(t, out, "%q", args)
	}
	explain, err := exec.Command(bin, "explain", "SQL0059").Output()
	require.NoError(t, err)
	require.Contains(t, string(explain), "SQL0059")
	demo := exec.Command(bin, demoArgs...)
	demo.Env = append(os.Environ(), "SQLSTREAMS_DATABASE_URL="+pgtest.URL())
	demoOut, err := demo.CombinedOutput()
	require.NoError(t, err, "%s", demoOut)
	require.Contains(t, string(demoOut), "sqlstreams groups describe orders.placed -schema sqlstreams_demo_")
	manager := exec.Command(bin, "manager", "-schema", f.schema)
	manager.Env = append(os.Environ(), "SQLSTREAMS_DATABASE_URL="+pgtest.URL())
	stdout, err := manager.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, manager.Start())
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err)
	require.Contains(t, line, "manager running on schema "+f.schema)
	require.NoError(t, manager.Process.Signal(os.Interrupt))
	require.NoError(t, manager.Wait(), "SIGINT stops the manager cleanly")
}

func TestRmVerbs(t *testing.T) {
	f := newOpsFixture(t, 3, 1)
	ctx := context.Background()
	_, err := f.stream.Consumer("audit").Register(ctx, nil)
	require.NoError(t, err)

	out := f.ok(t, "groups", "rm", "orders", "billing")
	require.Contains(t, out, "dry run: would remove group billing of stream orders")
	require.Regexp(t, `(?m)^exception\s+1$`, out)
	f.describe(t) // still there
	out = f.ok(t, "groups", "rm", "orders", "billing", "-execute")
	require.Contains(t, out, "removed group billing of stream orders")
	_, err = f.cli(t, "groups", "describe", "orders", "billing")
	require.ErrorIs(t, err, sqlstreams.ErrNotRegistered)
	require.Contains(t, f.ok(t, "groups", "ls"), "audit")

	out = f.ok(t, "streams", "rm", "orders")
	require.Contains(t, out, "dry run: would remove stream orders")
	require.Contains(t, out, "3 message(s)")
	require.Contains(t, out, "1 consumer group(s): audit")
	require.Contains(t, f.ok(t, "streams", "ls"), "orders")
	require.Contains(t, f.ok(t, "streams", "rm", "orders", "-execute", "-o", "json"), `"dry_run": false`)
	require.NotContains(t, f.ok(t, "streams", "ls"), "orders")
	_, err = f.cli(t, "streams", "rm", "orders", "-execute")
	require.ErrorIs(t, err, sqlstreams.ErrNotRegistered)
}

// The console verb serves on loopback only, read-only unless told.
func TestConsoleVerb(t *testing.T) {
	f := newOpsFixture(t, 2, 1)
	_, err := f.cli(t, "console", "-http", "0.0.0.0:0")
	require.ErrorContains(t, err, "only a loopback address")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := runCtx(ctx, []string{"console", "-http", "127.0.0.1:0", "-schema", f.schema}, pw)
		_ = pw.Close()
		done <- err
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	require.NoError(t, err)
	m := regexp.MustCompile(`console on (http://127\.0\.0\.1:\d+) `).FindStringSubmatch(line)
	require.NotNil(t, m, line)
	res, err := http.Get(m[1] + "/streams/orders/groups/billing")
	require.NoError(t, err)
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, string(body), `id="dead">1<`)
	require.NotContains(t, string(body), "redrive-all", "read-only without -allow-actions")
	cancel()
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	require.NoError(t, <-done)
}

// Every verb's error names each step once (issue 60: "seek: seek (dry
// run)", "dead letter: dead letter: message 3"): on the database, and on
// one that cannot be reached.
func TestNoVerbErrorRepeatsAStep(t *testing.T) {
	f := newOpsFixture(t, 2, 1)
	file := filepath.Join(t.TempDir(), "config.json")
	require.NoError(t, os.WriteFile(file, []byte(`{"bindings":["orders.eu"]}`), 0o600))
	failing := [][]string{
		{"groups", "describe", "orders", "biling"}, {"groups", "ls", "-stream", "ordres"}, {"inspect", "orders", "biling"},
		{"bindings", "orders", "biling"}, {"dlq", "ls", "orders", "biling"}, {"dlq", "show", "orders", "billing", "999999"},
		{"groups", "seek", "orders", "billing", "-to-id", "999999"}, {"groups", "seek", "orders", "billing", "-to-id", "999999", "-execute"},
		{"groups", "declare", "orders", "billing", "-f", file}, {"groups", "rm", "orders", "biling"}, {"streams", "rm", "ordres"},
	}
	check := func(where string) {
		for _, args := range failing {
			_, err := f.cli(t, args...)
			if err == nil {
				t.Errorf("%s: %q: no error", where, args)
				continue
			}
			if step, found := repeatedStep(err.Error()); found {
				t.Errorf("%s: %q names a step twice (%q): %v", where, args, step, err)
			}
		}
	}
	check("live")
	t.Setenv("SQLSTREAMS_DATABASE_URL", unreachableURL)
	check("unreachable")
}

// repeatedStep returns the first step an error message names twice in a
// row (the root package's test has its twin).
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
