package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Streaming replication, as the failover tests need it: a primary started
// with Options.Replication, a standby copied from it with pg_basebackup and
// following it (optionally synchronously), the primary killed, the standby
// promoted the way an orchestrator (Patroni, pg_auto_failover) would.
//
// Every wait here is on an external process, so it uses real time, and
// every statement and every tool runs under a deadline: a query against a
// server in the middle of a failover can otherwise wait forever (a commit
// on a primary whose synchronous standby is gone never returns).

const (
	// replicationWait bounds each whole operation (copying and starting a
	// standby, waiting for it to stream, promoting it), whatever deadline
	// the caller's context has or lacks.
	replicationWait = 2 * time.Minute
	// queryWait bounds each connection and statement of those operations.
	queryWait = 10 * time.Second
	// pollEvery is how often a wait re-reads the server's state.
	pollEvery = 50 * time.Millisecond
	// defaultStandby is the standby's application_name when none is given.
	defaultStandby = "standby"
)

// standbyName is what a standby's name may be: it is both its
// application_name and its replication slot's name, and it is written
// unquoted into postgresql.conf values, so it is kept to a slot name's
// alphabet.
var standbyName = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)

// configureReplication makes a fresh data directory a primary streaming
// standbys can follow. PostgreSQL 15's defaults would already do, but the
// standby's copy must not depend on which defaults a version ships.
func configureReplication(data string) error {
	conf := []string{
		"",
		"# Replication, added by sqlstreams pgcluster.",
		"wal_level = replica",
		"max_wal_senders = 10",
		"max_replication_slots = 10",
		"hot_standby = on",
	}
	if err := appendFile(filepath.Join(data, "postgresql.conf"), strings.Join(conf, "\n")+"\n"); err != nil {
		return fmt.Errorf("configure replication: %w", err)
	}
	// pg_basebackup and the standby's walreceiver connect with the
	// replication pseudo-database, which "all" in pg_hba.conf does not match.
	hba := []string{
		"",
		"# Replication, added by sqlstreams pgcluster: loopback only, like the server.",
		"local replication " + superuser + " trust",
		"host replication " + superuser + " 127.0.0.1/32 trust",
	}
	if err := appendFile(filepath.Join(data, "pg_hba.conf"), strings.Join(hba, "\n")+"\n"); err != nil {
		return fmt.Errorf("configure replication hba: %w", err)
	}
	return nil
}

// StandbyOptions tunes a streaming standby.
type StandbyOptions struct {
	// Name is the standby's application_name, under which the primary's
	// pg_stat_replication and synchronous_standby_names know it, and its
	// replication slot's name: lower-case letters, digits and underscores.
	// Empty means "standby".
	Name string
	// Synchronous makes the primary wait, before any commit returns, until
	// this standby has flushed the commit's WAL (synchronous_standby_names
	// names it, synchronous_commit is on), so an acknowledged commit
	// survives the loss of the primary. Without it the standby is
	// asynchronous, and a failover can lose acknowledged commits.
	Synchronous bool
}

// StartStandby copies c, a running primary started with
// Options.Replication, into a new cluster of its own directory and port
// with pg_basebackup -R, starts it as a hot standby streaming from c, and
// returns once c reports it streaming (and, when synchronous, its
// synchronous standby). The standby is a Cluster like any other: Stop stops
// it and removes its directory.
func (c *Cluster) StartStandby(ctx context.Context, opts StandbyOptions) (*Cluster, error) {
	if !c.replication {
		return nil, errors.New("pgcluster: StartStandby: the primary was not started with Options.Replication")
	}
	name := opts.Name
	if name == "" {
		name = defaultStandby
	}
	if !standbyName.MatchString(name) {
		return nil, fmt.Errorf("pgcluster: standby name %q: want 1-63 of a-z, 0-9 and _", name)
	}
	ctx, cancel := context.WithTimeout(ctx, replicationWait)
	defer cancel()

	dir, err := os.MkdirTemp(filepath.Dir(c.dir), dirPattern)
	if err != nil {
		return nil, fmt.Errorf("create standby dir: %w", err)
	}
	s := &Cluster{dir: dir, x: c.x, durable: c.durable, replication: true}
	if err := s.startStandby(ctx, c, name); err != nil {
		return nil, errors.Join(fmt.Errorf("standby %s: %w", name, err), s.Stop())
	}
	if opts.Synchronous {
		// Set on the primary only now, not before the copy: a standby that
		// inherited synchronous_standby_names would, once promoted, wait
		// for a standby of its own that does not exist.
		if err := c.exec(ctx, "ALTER SYSTEM SET synchronous_standby_names = '\""+name+"\"'",
			"ALTER SYSTEM SET synchronous_commit = 'on'", "SELECT pg_reload_conf()"); err != nil {
			return nil, errors.Join(fmt.Errorf("make standby %s synchronous: %w", name, err), s.Stop())
		}
	}
	if err := c.WaitStreaming(ctx, name, opts.Synchronous); err != nil {
		err = errors.Join(err, s.Stop())
		if opts.Synchronous {
			// Every commit on the primary would wait for the standby that
			// failed; give the primary back as it was, under a deadline of
			// its own since ctx may be the one that ended.
			rctx, cancel := context.WithTimeout(context.Background(), queryWait)
			defer cancel()
			if rerr := c.exec(rctx, "ALTER SYSTEM RESET synchronous_standby_names", "ALTER SYSTEM RESET synchronous_commit",
				"SELECT pg_reload_conf()"); rerr != nil {
				err = errors.Join(err, fmt.Errorf("reset the primary's synchronous_standby_names: %w", rerr))
			}
		}
		return nil, err
	}
	return s, nil
}

func (s *Cluster) startStandby(ctx context.Context, primary *Cluster, name string) error {
	if err := os.WriteFile(filepath.Join(s.dir, ownerFile), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", ownerFile, err)
	}
	if err := s.x.chownTree(s.dir); err != nil {
		return err
	}
	data := filepath.Join(s.dir, dataSubdir)
	// application_name in the connection string is what -R writes into
	// primary_conninfo, so the primary knows the standby by name; the slot
	// (-C -S) keeps the WAL the standby has not received yet.
	conninfo := fmt.Sprintf("host=127.0.0.1 port=%d user=%s application_name=%s", primary.port, superuser, name)
	args := []string{"-D", data, "-d", conninfo, "-R", "-X", "stream", "-c", "fast", "-C", "-S", name}
	if !s.durable {
		args = append(args, "--no-sync")
	}
	if out, err := s.x.run(ctx, s.dir, "pg_basebackup", args...); err != nil {
		return fmt.Errorf("pg_basebackup: %w\n%s", err, tail(out))
	}
	// The copy's postgresql.conf is the primary's; its socket must live in
	// the standby's own directory (later lines win).
	conf := "\n# Standby, added by sqlstreams pgcluster.\nunix_socket_directories = " + confString(s.dir) + "\n"
	if err := appendFile(filepath.Join(data, "postgresql.conf"), conf); err != nil {
		return fmt.Errorf("configure standby: %w", err)
	}
	return s.launch(ctx)
}

// WaitStreaming waits until c, a primary, reports the standby named name
// streaming in pg_stat_replication, and, when synchronous, as its
// synchronous standby (sync_state 'sync': from then on commits wait for it).
func (c *Cluster) WaitStreaming(ctx context.Context, name string, synchronous bool) error {
	ctx, cancel := context.WithTimeout(ctx, replicationWait)
	defer cancel()
	want := "async"
	if synchronous {
		want = "sync"
	}
	var state, syncState string
	err := poll(ctx, func(ctx context.Context) (bool, error) {
		state, syncState = "", ""
		err := c.queryRow(ctx, "-- pgcluster.WaitStreaming\nSELECT state, sync_state FROM pg_catalog.pg_stat_replication WHERE application_name = $1",
			[]any{name}, &state, &syncState)
		if errors.Is(err, pgx.ErrNoRows) {
			return false, nil
		}
		return err == nil && state == "streaming" && syncState == want, err
	})
	if err != nil {
		return fmt.Errorf("wait for standby %s to stream (%s): last seen state %q, sync_state %q: %w", name, want, state, syncState, err)
	}
	return nil
}

// Kill crashes the server (pg_ctl stop -m immediate): no checkpoint, no
// goodbye to its clients or standbys, as when a primary's machine dies. Its
// data stays until Stop; a failover test does not start it again, as an
// old primary is not reused unless it is re-seeded.
func (c *Cluster) Kill(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, replicationWait)
	defer cancel()
	return c.StopServer(ctx, "immediate")
}

// Promote turns c, a standby, into a primary as an orchestrator would:
// pg_ctl promote, then wait until it leaves recovery, then clear
// synchronous_standby_names (as Patroni does on the node it promotes), since
// a promoted node that still names a synchronous standby it does not have
// blocks every commit.
func (c *Cluster) Promote(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, replicationWait)
	defer cancel()
	data := filepath.Join(c.dir, dataSubdir)
	if out, err := c.x.run(ctx, c.dir, "pg_ctl", "promote", "-D", data, "-w", "-t", "60"); err != nil {
		return fmt.Errorf("pg_ctl promote: %w\n%s", err, tail(out))
	}
	err := poll(ctx, func(ctx context.Context) (bool, error) {
		var inRecovery bool
		err := c.queryRow(ctx, "-- pgcluster.Promote\nSELECT pg_catalog.pg_is_in_recovery()", nil, &inRecovery)
		return err == nil && !inRecovery, err
	})
	if err != nil {
		return fmt.Errorf("wait for the promoted node to leave recovery: %w", err)
	}
	if err := c.exec(ctx, "ALTER SYSTEM SET synchronous_standby_names = ''", "SELECT pg_reload_conf()"); err != nil {
		return fmt.Errorf("clear synchronous_standby_names on the promoted node: %w", err)
	}
	// pg_reload_conf only signals; a new session sees the setting once the
	// postmaster has read it.
	err = poll(ctx, func(ctx context.Context) (bool, error) {
		var names string
		err := c.queryRow(ctx, "-- pgcluster.Promote\nSELECT pg_catalog.current_setting('synchronous_standby_names')", nil, &names)
		return err == nil && names == "", err
	})
	if err != nil {
		return fmt.Errorf("wait for synchronous_standby_names to clear on the promoted node: %w", err)
	}
	return nil
}

// MultiHostURL returns a URL naming every node, for a client that must
// follow a failover: libpq and pgx try the hosts in order and, with
// target_session_attrs=read-write, keep the first that accepts writes, so a
// reconnect after a promotion finds the new primary.
func MultiHostURL(dbname string, nodes ...*Cluster) string {
	if dbname == "" {
		dbname = superuser
	}
	hosts := make([]string, len(nodes))
	for i, n := range nodes {
		hosts[i] = net.JoinHostPort("127.0.0.1", strconv.Itoa(n.port))
	}
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User(superuser),
		Host:     strings.Join(hosts, ","),
		Path:     "/" + dbname,
		RawQuery: "sslmode=disable&target_session_attrs=read-write",
	}
	return u.String()
}

// queryRow runs one statement on a connection of its own, bounded by
// queryWait, and scans its single row into dest.
func (c *Cluster) queryRow(ctx context.Context, sql string, args []any, dest ...any) error {
	return c.withConn(ctx, func(ctx context.Context, conn *pgx.Conn) error {
		if err := conn.QueryRow(ctx, sql, args...).Scan(dest...); err != nil {
			return fmt.Errorf("query on port %d: %w", c.port, err)
		}
		return nil
	})
}

// exec runs statements in order on a connection of its own, bounded by
// queryWait. ALTER SYSTEM cannot run in a transaction block, so each runs
// on its own.
func (c *Cluster) exec(ctx context.Context, sqls ...string) error {
	return c.withConn(ctx, func(ctx context.Context, conn *pgx.Conn) error {
		for _, sql := range sqls {
			if _, err := conn.Exec(ctx, "-- pgcluster\n"+sql); err != nil {
				return fmt.Errorf("%s on port %d: %w", sql, c.port, err)
			}
		}
		return nil
	})
}

// withConn runs f on a connection of its own to the node, the whole
// bounded by queryWait: a node in the middle of a failover may never
// answer.
func (c *Cluster) withConn(ctx context.Context, f func(context.Context, *pgx.Conn) error) error {
	ctx, cancel := context.WithTimeout(ctx, queryWait)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.URL(""))
	if err != nil {
		return fmt.Errorf("connect to port %d: %w", c.port, err)
	}
	defer conn.Close(ctx)
	return f(ctx, conn)
}

// poll calls check until it reports done or ctx ends; the last error check
// returned is kept for the report, since a wait that times out is explained
// by what the server last said.
func poll(ctx context.Context, check func(context.Context) (bool, error)) error {
	t := wall.Ticker(pollEvery)
	defer t.Stop()
	var last error
	for {
		done, err := check(ctx)
		if done {
			return nil
		}
		if err != nil {
			last = err
		}
		select {
		case <-ctx.Done():
			if last != nil {
				return fmt.Errorf("%w (last error: %v)", ctx.Err(), last)
			}
			return ctx.Err()
		case <-t.C():
		}
	}
}
