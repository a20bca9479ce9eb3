package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrNoAutoFailover says pg_auto_failover's pg_autoctl is not installed.
var ErrNoAutoFailover = errors.New("pg_autoctl (pg_auto_failover) is not installed; install it with: apt-get install -y postgresql-15-auto-failover")

// Formation is a pg_auto_failover formation run from the installed
// binaries: a monitor and two data nodes, each a pg_autoctl service
// (pg_autoctl create … --run) in a directory of this formation's own. The
// monitor decides, from its health checks, when the primary is gone and
// promotes the secondary: the automated failover an orchestrator does in
// production. With two data nodes pg_auto_failover replicates synchronously
// while the secondary is healthy (replication quorum).
type Formation struct {
	dir         string
	autoctl     string // the pg_autoctl binary
	x           *executor
	monitorPort int
	nodes       []*autoNode

	stopOnce sync.Once
	stopErr  error
}

type autoNode struct {
	name string
	port int
	cmd  *exec.Cmd
	done chan struct{}
}

// The monitor's health checks, shortened from pg_auto_failover's defaults
// (a check every 5 s, a node unhealthy after 20 s) so that a test run sees
// a failover within seconds; the mechanism is the one production runs.
var monitorSettings = []string{
	"pgautofailover.health_check_period = 1000",
	"pgautofailover.health_check_timeout = 1000",
	"pgautofailover.health_check_max_retries = 1",
	"pgautofailover.health_check_retry_delay = 500",
	"pgautofailover.node_considered_unhealthy_timeout = 3000",
	// How long the monitor waits for an unreachable primary to demote
	// itself before the promoted node takes writes (default 30 s): the
	// guard against two primaries, which a dead machine cannot violate.
	"pgautofailover.primary_demote_timeout = 5000",
}

// StartFormation starts a monitor and two data nodes and returns once one
// node is primary and the other a streaming secondary.
func StartFormation(ctx context.Context) (*Formation, error) {
	binDir, err := FindBinaries()
	if err != nil {
		return nil, err
	}
	autoctl := filepath.Join(binDir, "pg_autoctl")
	if _, err := os.Stat(autoctl); err != nil {
		if autoctl, err = exec.LookPath("pg_autoctl"); err != nil { // Debian puts it in /usr/bin
			return nil, ErrNoAutoFailover
		}
	}
	x, dir, err := prepare(binDir, nil)
	if err != nil {
		return nil, err
	}
	f := &Formation{dir: dir, x: x, autoctl: autoctl}
	if err := f.start(ctx); err != nil {
		return nil, errors.Join(err, f.Stop())
	}
	return f, nil
}

func (f *Formation) start(ctx context.Context) error {
	if err := os.WriteFile(filepath.Join(f.dir, ownerFile), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		return err
	}
	for _, d := range []string{"home", "config", "share"} {
		if err := os.MkdirAll(filepath.Join(f.dir, d), 0o755); err != nil {
			return err
		}
	}
	if err := f.x.chownTree(f.dir); err != nil {
		return err
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	f.monitorPort = port
	monitor := &autoNode{name: "monitor", port: port}
	if err := f.launch(monitor, "create", "monitor", "--pgdata", filepath.Join(f.dir, "monitor"), "--pgport", strconv.Itoa(port),
		"--hostname", "127.0.0.1", "--auth", "trust", "--no-ssl", "--pgctl", filepath.Join(f.x.binDir, "pg_ctl"), "--run"); err != nil {
		return err
	}
	f.nodes = append(f.nodes, monitor)
	if err := poll(ctx, func(ctx context.Context) (bool, error) {
		var one int
		err := f.monitorRow(ctx, "SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'pgautofailover'", nil, &one)
		return err == nil, nil
	}); err != nil {
		return fmt.Errorf("wait for the monitor: %w\n%s", err, f.logTail("monitor"))
	}
	for _, s := range monitorSettings {
		if err := f.monitorExec(ctx, "ALTER SYSTEM SET "+s); err != nil {
			return fmt.Errorf("monitor setting %s: %w", s, err)
		}
	}
	if err := f.monitorExec(ctx, "SELECT pg_catalog.pg_reload_conf()"); err != nil {
		return err
	}
	for i := 1; i <= 2; i++ {
		port, err := freePort()
		if err != nil {
			return err
		}
		n := &autoNode{name: fmt.Sprintf("node%d", i), port: port}
		if err := f.launch(n, "create", "postgres", "--pgdata", filepath.Join(f.dir, n.name), "--pgport", strconv.Itoa(port),
			"--hostname", "127.0.0.1", "--name", n.name, "--auth", "trust", "--no-ssl", "--pgctl", filepath.Join(f.x.binDir, "pg_ctl"),
			"--monitor", f.MonitorURL(), "--run"); err != nil {
			return err
		}
		f.nodes = append(f.nodes, n)
		want := "single"
		if i == 2 {
			want = "secondary"
		}
		if err := f.waitState(ctx, n.name, want); err != nil {
			return err
		}
	}
	return f.waitState(ctx, "node1", "primary")
}

// launch starts a pg_autoctl service for n, as the postgres OS user when we
// are root, with its configuration under the formation's directory.
func (f *Formation) launch(n *autoNode, args ...string) error {
	cmd := exec.Command(f.autoctl, args...)
	logf, err := os.Create(filepath.Join(f.dir, n.name+".log"))
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = f.dir
	cmd.Env = append(toolEnv(), "HOME="+filepath.Join(f.dir, "home"), "XDG_CONFIG_HOME="+filepath.Join(f.dir, "config"),
		"XDG_DATA_HOME="+filepath.Join(f.dir, "share"), "PATH="+f.x.binDir+":"+os.Getenv("PATH"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if f.x.cred != nil {
		cmd.SysProcAttr.Credential = f.x.cred
	}
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return fmt.Errorf("pg_autoctl %s: %w", strings.Join(args[:2], " "), err)
	}
	n.cmd, n.done = cmd, make(chan struct{})
	go func() { // reaped here; Stop waits for it
		_ = cmd.Wait()
		_ = logf.Close()
		close(n.done)
	}()
	return nil
}

// MonitorURL is the monitor's connection URL, as the data nodes' keepers use it.
func (f *Formation) MonitorURL() string {
	u := url.URL{Scheme: "postgres", User: url.User("autoctl_node"), Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(f.monitorPort)),
		Path: "/pg_auto_failover", RawQuery: "sslmode=disable"}
	return u.String()
}

// URL is the formation's multi-host URL for dbname with
// target_session_attrs=read-write, what `pg_autoctl show uri` gives an
// application: whichever data node is primary.
func (f *Formation) URL(dbname string) string {
	if dbname == "" {
		dbname = superuser
	}
	var hosts []string
	for _, n := range f.nodes[1:] {
		hosts = append(hosts, net.JoinHostPort("127.0.0.1", strconv.Itoa(n.port)))
	}
	u := url.URL{Scheme: "postgres", User: url.User(superuser), Host: strings.Join(hosts, ","), Path: "/" + dbname,
		RawQuery: "sslmode=disable&target_session_attrs=read-write"}
	return u.String()
}

// States returns each data node's state as the monitor last saw it reported.
func (f *Formation) States(ctx context.Context) (map[string]string, error) {
	out := map[string]string{}
	err := f.withMonitor(ctx, func(ctx context.Context, conn *pgx.Conn) error {
		rows, err := conn.Query(ctx, "-- pgcluster.Formation.States\nSELECT nodename, reportedstate::text FROM pgautofailover.node")
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var name, state string
			if err := rows.Scan(&name, &state); err != nil {
				return err
			}
			out[name] = state
		}
		return rows.Err()
	})
	return out, err
}

// Primary returns the name of the node the monitor holds as primary.
func (f *Formation) Primary(ctx context.Context) (string, error) {
	states, err := f.States(ctx)
	if err != nil {
		return "", err
	}
	for name, s := range states {
		if s == "primary" || s == "wait_primary" || s == "single" {
			return name, nil
		}
	}
	return "", fmt.Errorf("no primary among %v", states)
}

// KillNode crashes a data node as a dead machine would: its pg_autoctl
// service is killed (SIGKILL, no goodbye to the monitor) and its server
// stopped with pg_ctl stop -m immediate. The monitor finds out from its
// health checks.
func (f *Formation) KillNode(ctx context.Context, name string) error {
	for _, n := range f.nodes {
		if n.name != name {
			continue
		}
		// The service and the server it started share a process group:
		// SIGKILL to the group is the machine dying under them.
		if n.cmd != nil && n.cmd.Process != nil {
			_ = syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL)
			<-n.done
		}
		if pid, ok := livePostmaster(filepath.Join(f.dir, name)); ok { // it left the group: kill it too
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		return nil
	}
	return fmt.Errorf("no node %q", name)
}

// NodeURL is one data node's own URL.
func (f *Formation) NodeURL(name, dbname string) string {
	for _, n := range f.nodes {
		if n.name == name {
			u := url.URL{Scheme: "postgres", User: url.User(superuser), Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(n.port)),
				Path: "/" + dbname, RawQuery: "sslmode=disable"}
			return u.String()
		}
	}
	return ""
}

func (f *Formation) waitState(ctx context.Context, name, want string) error {
	var last map[string]string
	err := poll(ctx, func(ctx context.Context) (bool, error) {
		states, err := f.States(ctx)
		if err != nil {
			return false, nil
		}
		last = states
		return states[name] == want, nil
	})
	if err != nil {
		return fmt.Errorf("wait for %s to be %s (states %v): %w\n%s", name, want, last, err, f.logTail(name))
	}
	return nil
}

func (f *Formation) logTail(name string) string {
	b, _ := os.ReadFile(filepath.Join(f.dir, name+".log"))
	return tail(b)
}

func (f *Formation) withMonitor(ctx context.Context, do func(context.Context, *pgx.Conn) error) error {
	ctx, cancel := context.WithTimeout(ctx, queryWait)
	defer cancel()
	u := url.URL{Scheme: "postgres", User: url.User(superuser), Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(f.monitorPort)),
		Path: "/pg_auto_failover", RawQuery: "sslmode=disable"}
	conn, err := pgx.Connect(ctx, u.String())
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return do(ctx, conn)
}

func (f *Formation) monitorRow(ctx context.Context, sql string, args []any, dest ...any) error {
	return f.withMonitor(ctx, func(ctx context.Context, conn *pgx.Conn) error {
		return conn.QueryRow(ctx, "-- pgcluster.Formation\n"+sql, args...).Scan(dest...)
	})
}

func (f *Formation) monitorExec(ctx context.Context, sql string) error {
	return f.withMonitor(ctx, func(ctx context.Context, conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, "-- pgcluster.Formation\n"+sql)
		return err
	})
}

// Stop stops every pg_autoctl service (SIGTERM: each stops its server),
// makes sure no server is left, and removes the formation's directory. It
// is safe to call more than once.
func (f *Formation) Stop() error {
	f.stopOnce.Do(func() { f.stopErr = f.stop() })
	return f.stopErr
}

func (f *Formation) stop() error {
	var errs []error
	for i := len(f.nodes) - 1; i >= 0; i-- {
		n := f.nodes[i]
		if n.cmd == nil || n.cmd.Process == nil {
			continue
		}
		_ = syscall.Kill(-n.cmd.Process.Pid, syscall.SIGTERM)
		t := time.NewTimer(30 * time.Second)
		select {
		case <-n.done:
		case <-t.C:
			_ = syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL)
			<-n.done
		}
		t.Stop()
		if pid, ok := livePostmaster(filepath.Join(f.dir, n.name)); ok {
			_ = syscall.Kill(pid, syscall.SIGQUIT) // immediate shutdown
			if !waitGone(pid, 30*time.Second) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
				if !waitGone(pid, 10*time.Second) {
					errs = append(errs, fmt.Errorf("stop %s: postmaster %d does not exit", n.name, pid))
				}
			}
		}
	}
	if err := os.RemoveAll(f.dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// livePostmaster returns the pid in data's postmaster.pid when that process
// is alive.
func livePostmaster(data string) (int, bool) {
	b, err := os.ReadFile(filepath.Join(data, "postmaster.pid"))
	if err != nil {
		return 0, false
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || pid <= 0 {
		return 0, false
	}
	return pid, syscall.Kill(pid, 0) == nil
}

// waitGone waits up to bound for pid to exit.
func waitGone(pid int, bound time.Duration) bool {
	deadline := time.Now().Add(bound)
	for syscall.Kill(pid, 0) == nil {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond) // another process's exit: nothing to wait on but its pid
	}
	return true
}
