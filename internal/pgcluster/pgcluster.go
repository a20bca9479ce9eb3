// Package pgcluster runs a private, throwaway PostgreSQL cluster from the
// locally installed server binaries.
//
// Tests and demos must never depend on (or damage) a shared server such as
// the one a developer may have on port 5432, so every cluster lives in its
// own temporary directory, listens on a port nobody else chose, and is
// deleted again by Stop. Clusters left behind by a process that died before
// it could call Stop are removed by the next Start.
//
// It is a tool of the tests, the demo and the benchmarks, not an API for users.
package pgcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/c1702965/sqlstreams/internal/clocks"
)

// ErrNoBinaries is wrapped by FindBinaries so callers can tell "PostgreSQL is
// not installed here" (skip or explain) from a cluster that failed to start
// (a real bug).
var ErrNoBinaries = errors.New("PostgreSQL server binaries (initdb, pg_ctl) not found")

// wall is the clock for the few waits a process supervisor cannot avoid; it
// is injected like every other clock in the project.
var wall clocks.Clock = clocks.Real()

// libGlob is where Debian and Ubuntu install the server binaries, which they
// deliberately keep off PATH. It is a variable only so tests can point it at
// an empty place.
var libGlob = "/usr/lib/postgresql/*/bin"

const (
	dirPattern  = "sqlstreams-pg-*"
	ownerFile   = "owner.pid"
	logFile     = "server.log"
	dataSubdir  = "data"
	superuser   = "postgres"
	osUser      = "postgres"
	portRetries = 5

	// ownerlessGrace protects a directory that another process has just
	// created but not yet stamped with owner.pid from being swept.
	ownerlessGrace = time.Minute
)

// FindBinaries returns the directory holding initdb, pg_ctl and postgres.
// PATH wins so that a developer can choose a version; otherwise the newest
// Debian-style installation is used.
func FindBinaries() (binDir string, err error) {
	return findBinaries(libGlob)
}

func findBinaries(glob string) (string, error) {
	if initdb, err := exec.LookPath("initdb"); err == nil {
		if pgctl, err := exec.LookPath("pg_ctl"); err == nil {
			// PATH entries are often symlinks into the real installation;
			// pg_ctl needs postgres next to it, so prefer the resolved dir.
			for _, p := range []string{initdb, pgctl} {
				if real, err := filepath.EvalSymlinks(p); err == nil && hasServerBinaries(filepath.Dir(real)) {
					return filepath.Dir(real), nil
				}
			}
			if hasServerBinaries(filepath.Dir(initdb)) {
				return filepath.Dir(initdb), nil
			}
		}
	}
	dirs, _ := filepath.Glob(glob)
	// Newest major version first; lexical order would put 9.6 after 15.
	slices.SortFunc(dirs, func(a, b string) int {
		return compareVersions(filepath.Base(filepath.Dir(b)), filepath.Base(filepath.Dir(a)))
	})
	for _, d := range dirs {
		if hasServerBinaries(d) {
			return d, nil
		}
	}
	return "", fmt.Errorf("%w on PATH or under %s; install them with: apt-get update && apt-get install -y postgresql", ErrNoBinaries, glob)
}

func hasServerBinaries(dir string) bool {
	for _, name := range []string{"initdb", "pg_ctl", "postgres"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
			return false
		}
	}
	return true
}

// compareVersions orders dotted numeric versions such as "9.6" and "15".
func compareVersions(a, b string) int {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < max(len(as), len(bs)); i++ {
		var x, y int
		if i < len(as) {
			x, _ = strconv.Atoi(as[i])
		}
		if i < len(bs) {
			y, _ = strconv.Atoi(bs[i])
		}
		if x != y {
			return x - y
		}
	}
	return strings.Compare(a, b)
}

// Options tunes a cluster for its use.
type Options struct {
	// Durable keeps PostgreSQL's default crash safety. Tests leave it false:
	// the data is thrown away anyway, and skipping fsync makes them several
	// times faster. Demos and benchmarks set it so that numbers are honest.
	Durable bool
	// Log receives the output of initdb and pg_ctl as they run, and the
	// server's own log when the cluster is stopped. Nil discards it; errors
	// still carry the relevant tail.
	Log io.Writer
	// Replication configures the server as a primary that streaming
	// standbys (StartStandby) can copy and follow: failover tests need one.
	Replication bool
}

// Cluster is a running private PostgreSQL server.
type Cluster struct {
	dir  string
	port int
	x    *executor
	// durable and replication are the Options the cluster was started
	// with; a standby inherits them from its primary.
	durable     bool
	replication bool

	stopOnce sync.Once
	stopErr  error
}

// Start creates and starts a new cluster. It first removes clusters whose
// owning process has died, so a crashed or killed test binary never leaves
// a server running into the next run.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	binDir, err := FindBinaries()
	if err != nil {
		return nil, err
	}
	x, dir, err := prepare(binDir, opts.Log)
	if err != nil {
		return nil, err
	}
	c := &Cluster{dir: dir, x: x, durable: opts.Durable, replication: opts.Replication}
	if err := c.start(ctx, opts); err != nil {
		return nil, errors.Join(err, c.Stop())
	}
	return c, nil
}

// prepare returns an executor of the binaries in binDir and a new private
// directory under the temporary root, after removing the clusters there
// whose owning process has died.
func prepare(binDir string, log io.Writer) (*executor, string, error) {
	x, err := newExecutor(binDir, log)
	if err != nil {
		return nil, "", err
	}
	root, err := x.tempRoot()
	if err != nil {
		return nil, "", err
	}
	x.sweep(root)
	dir, err := os.MkdirTemp(root, dirPattern)
	if err != nil {
		return nil, "", fmt.Errorf("create cluster dir: %w", err)
	}
	return x, dir, nil
}

func (c *Cluster) start(ctx context.Context, opts Options) error {
	if err := os.WriteFile(filepath.Join(c.dir, ownerFile), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", ownerFile, err)
	}
	if err := c.x.chownTree(c.dir); err != nil {
		return err
	}

	data := filepath.Join(c.dir, dataSubdir)
	// --locale=C: the cluster must not depend on which locales the host
	// happens to have generated, and C makes collation deterministic.
	args := []string{"-D", data, "-U", superuser, "--auth=trust", "-E", "UTF8", "--locale=C"}
	if !opts.Durable {
		args = append(args, "--no-sync")
	}
	if out, err := c.x.run(ctx, c.dir, "initdb", args...); err != nil {
		return fmt.Errorf("initdb: %w\n%s", err, tail(out))
	}

	conf := []string{
		"",
		"# Added by sqlstreams pgcluster.",
		// Only loopback: a throwaway trust-auth server must not be
		// reachable from the network.
		"listen_addresses = '127.0.0.1'",
		"unix_socket_directories = " + confString(c.dir),
		"max_connections = 300",
		"shared_buffers = '256MB'",
	}
	if !opts.Durable {
		conf = append(conf, "fsync = off", "synchronous_commit = off", "full_page_writes = off")
	}
	if err := appendFile(filepath.Join(data, "postgresql.conf"), strings.Join(conf, "\n")+"\n"); err != nil {
		return fmt.Errorf("configure: %w", err)
	}

	if opts.Replication {
		if err := configureReplication(data); err != nil {
			return err
		}
	}
	return c.launch(ctx)
}

// launch starts the server of c's data directory on a free port, retrying
// with another port when one is taken between picking and binding it.
func (c *Cluster) launch(ctx context.Context) error {
	data := filepath.Join(c.dir, dataSubdir)
	logPath := filepath.Join(c.dir, logFile)
	for attempt := 1; ; attempt++ {
		port, err := freePort()
		if err != nil {
			return err
		}
		before := fileSize(logPath)
		out, err := c.x.run(ctx, c.dir, "pg_ctl", "start", "-w", "-t", "120", "-D", data, "-l", logPath, "-o", "-p "+strconv.Itoa(port))
		if err == nil {
			c.port = port
			return nil
		}
		serverLog := readFrom(logPath, before)
		// The port was free when we picked it, but another process may have
		// taken it since; that race is the only failure worth retrying.
		if attempt < portRetries && ctx.Err() == nil && portTaken(serverLog) {
			continue
		}
		return fmt.Errorf("pg_ctl start: %w\n%s\nserver log:\n%s", err, tail(out), tail(serverLog))
	}
}

// Restart stops the server (fast shutdown: every session is cut) and
// starts it again on the same port and data. Chaos tests use it to show
// that a database restart mid-run loses nothing.
func (c *Cluster) Restart(ctx context.Context) error {
	data := filepath.Join(c.dir, dataSubdir)
	logPath := filepath.Join(c.dir, logFile)
	if out, err := c.x.run(ctx, c.dir, "pg_ctl", "restart", "-m", "fast", "-w", "-t", "120", "-D", data, "-l", logPath,
		"-o", "-p "+strconv.Itoa(c.port)); err != nil {
		return fmt.Errorf("pg_ctl restart: %w\n%s", err, tail(out))
	}
	return nil
}

// StopServer stops the server with the given pg_ctl mode ("fast" cuts every
// session and checkpoints; "immediate" is a crash, recovered at the next
// start), keeping its data and port, so that StartServer brings the same
// database back. Outage tests use the pair to hold the database down for as
// long as they need.
func (c *Cluster) StopServer(ctx context.Context, mode string) error {
	switch mode {
	case "fast", "immediate", "smart":
	default:
		return fmt.Errorf("pgcluster: stop mode %q: want fast, immediate or smart", mode)
	}
	data := filepath.Join(c.dir, dataSubdir)
	if out, err := c.x.run(ctx, c.dir, "pg_ctl", "stop", "-D", data, "-m", mode, "-w", "-t", "60"); err != nil {
		return fmt.Errorf("pg_ctl stop -m %s: %w\n%s", mode, err, tail(out))
	}
	return nil
}

// StartServer starts a server StopServer stopped, on the same port and data.
func (c *Cluster) StartServer(ctx context.Context) error {
	data := filepath.Join(c.dir, dataSubdir)
	logPath := filepath.Join(c.dir, logFile)
	if out, err := c.x.run(ctx, c.dir, "pg_ctl", "start", "-w", "-t", "120", "-D", data, "-l", logPath,
		"-o", "-p "+strconv.Itoa(c.port)); err != nil {
		return fmt.Errorf("pg_ctl start: %w\n%s", err, tail(out))
	}
	return nil
}

// URL returns a connection URL for dbname over TCP. TCP rather than the unix
// socket keeps the URL usable by any client, including ones that cannot
// reach the cluster's private directory.
func (c *Cluster) URL(dbname string) string {
	if dbname == "" {
		dbname = superuser
	}
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User(superuser),
		Host:     net.JoinHostPort("127.0.0.1", strconv.Itoa(c.port)),
		Path:     "/" + dbname,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// Port returns the TCP port the server listens on (127.0.0.1 only).
func (c *Cluster) Port() int { return c.port }

// Dir returns the cluster's private directory, which also holds the unix
// socket, the data directory and server.log.
func (c *Cluster) Dir() string { return c.dir }

// Stop shuts the server down and deletes its directory. It is safe to call
// more than once, so it can be both deferred and called explicitly.
func (c *Cluster) Stop() error {
	c.stopOnce.Do(func() { c.stopErr = c.stop() })
	return c.stopErr
}

func (c *Cluster) stop() error {
	if _, err := os.Stat(c.dir); errors.Is(err, os.ErrNotExist) {
		return nil // already swept, e.g. by another process
	}
	stopErr := c.x.shutdown(c.dir, "fast")
	if c.x.log != nil {
		if f, err := os.Open(filepath.Join(c.dir, logFile)); err == nil {
			_, _ = io.Copy(c.x.log, f)
			_ = f.Close()
		}
	}
	if err := os.RemoveAll(c.dir); err != nil {
		return errors.Join(stopErr, fmt.Errorf("remove cluster dir: %w", err))
	}
	return stopErr
}

// executor runs the PostgreSQL tools, as the unprivileged postgres OS user
// when we are root, because initdb and postgres refuse to run as root.
type executor struct {
	binDir string
	log    io.Writer
	cred   *syscall.Credential // nil: run as ourselves
}

func newExecutor(binDir string, log io.Writer) (*executor, error) {
	x := &executor{binDir: binDir, log: log}
	if os.Geteuid() != 0 {
		return x, nil
	}
	u, err := user.Lookup(osUser)
	if err != nil {
		return nil, fmt.Errorf("running as root, and PostgreSQL refuses to run as root, but there is no unprivileged %q OS user to run it as (%v); create one with: useradd --system %s", osUser, err, osUser)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("user %s: %w", osUser, err)
	}
	x.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	return x, nil
}

// tempRoot picks where cluster directories go. As root, the postgres user
// must be able to reach the directory; a private TMPDIR such as /root/tmp
// would make initdb fail with a puzzling permission error, so fall back to
// /tmp instead.
func (x *executor) tempRoot() (string, error) {
	root := os.TempDir()
	if x.cred == nil {
		return root, nil
	}
	for _, r := range []string{root, "/tmp"} {
		if real, err := filepath.EvalSymlinks(r); err == nil && traversable(real, x.cred) {
			return r, nil
		}
	}
	return "", fmt.Errorf("neither %s nor /tmp is traversable by the %s OS user; set TMPDIR to a directory it can reach", root, osUser)
}

func traversable(path string, cred *syscall.Credential) bool {
	for p := filepath.Clean(path); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return false
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return false
		}
		perm := fi.Mode().Perm()
		var bit os.FileMode = 0o001
		switch {
		case st.Uid == cred.Uid:
			bit = 0o100
		case st.Gid == cred.Gid:
			bit = 0o010
		}
		if perm&bit == 0 {
			return false
		}
		if p == filepath.Dir(p) {
			return true
		}
	}
}

func (x *executor) chownTree(dir string) error {
	if x.cred == nil {
		return nil
	}
	err := filepath.WalkDir(dir, func(p string, _ os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, int(x.cred.Uid), int(x.cred.Gid))
	})
	if err != nil {
		return fmt.Errorf("chown cluster dir to %s: %w", osUser, err)
	}
	return nil
}

// run executes a PostgreSQL tool and returns its combined output, which is
// also copied to the log writer.
func (x *executor) run(ctx context.Context, dir, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(x.binDir, name), args...)
	var buf bytes.Buffer
	var w io.Writer = &buf
	if x.log != nil {
		w = io.MultiWriter(&buf, x.log)
	}
	cmd.Stdout, cmd.Stderr = w, w
	// The tools must not inherit a cwd the postgres user cannot read.
	cmd.Dir = dir
	cmd.Env = toolEnv()
	if x.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: x.cred}
	}
	// pg_ctl start leaves the postmaster running; should it ever hold our
	// output pipe, do not wait for it forever.
	cmd.WaitDelay = 10 * time.Second
	err := cmd.Run()
	return buf.Bytes(), err
}

// toolEnv drops PG* variables so that a developer's PGDATA, PGPORT and
// friends cannot redirect the tools to a shared server.
func toolEnv() []string {
	return slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "PG") })
}

// shutdown stops the server in dir, escalating from the given pg_ctl mode to
// immediate and finally SIGKILL, because a cluster that cannot be stopped
// would otherwise outlive its directory.
func (x *executor) shutdown(dir, mode string) error {
	data := filepath.Join(dir, dataSubdir)
	pidFile := filepath.Join(data, "postmaster.pid")
	if _, err := os.Stat(pidFile); errors.Is(err, os.ErrNotExist) {
		return nil // never started, or already stopped cleanly
	}
	var errs []error
	for _, m := range slices.Compact([]string{mode, "immediate"}) {
		out, err := x.run(context.Background(), dir, "pg_ctl", "stop", "-D", data, "-m", m, "-w", "-t", "60")
		if err == nil {
			return nil
		}
		errs = append(errs, fmt.Errorf("pg_ctl stop -m %s: %w: %s", m, err, bytes.TrimSpace(out)))
	}
	pid := readPostmasterPID(pidFile)
	if pid <= 0 || !alive(pid) {
		return nil
	}
	if !isPostgres(pid) {
		return errors.Join(append(errs, fmt.Errorf("postmaster pid %d is not a postgres process; not killing it", pid))...)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return errors.Join(append(errs, fmt.Errorf("kill postmaster %d: %w", pid, err))...)
	}
	// The postmaster is not our child, so we cannot wait(2) for it; poll
	// briefly so that the directory is not removed under a live server.
	for range 100 {
		if !alive(pid) {
			return nil
		}
		<-wall.Timer(50 * time.Millisecond).C()
	}
	return errors.Join(append(errs, fmt.Errorf("postmaster %d survived SIGKILL", pid))...)
}

// sweep removes clusters left behind by processes that died without calling
// Stop. It is best effort: failing to clean up someone's debris must not stop
// a new cluster from starting.
func (x *executor) sweep(root string) {
	dirs, _ := filepath.Glob(filepath.Join(root, dirPattern))
	for _, dir := range dirs {
		if !x.stale(dir) {
			continue
		}
		err := errors.Join(x.shutdown(dir, "immediate"), os.RemoveAll(dir))
		if x.log != nil {
			if err != nil {
				fmt.Fprintf(x.log, "pgcluster: removing stale cluster %s: %v\n", dir, err)
			} else {
				fmt.Fprintf(x.log, "pgcluster: removed stale cluster %s\n", dir)
			}
		}
	}
}

func (x *executor) stale(dir string) bool {
	fi, err := os.Lstat(dir)
	if err != nil || !fi.IsDir() {
		return false
	}
	// Without root we could not stop or remove another user's cluster anyway.
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || (x.cred == nil && int(st.Uid) != os.Geteuid()) {
		return false
	}
	b, err := os.ReadFile(filepath.Join(dir, ownerFile))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return false
	}
	pid, perr := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || perr != nil || pid <= 0 {
		// Either a Start that crashed early or one that is just starting.
		return wall.Since(fi.ModTime()) > ownerlessGrace
	}
	return !alive(pid)
}

// alive reports whether pid exists and is not a zombie. EPERM means the
// process exists but belongs to someone else, which still counts.
func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	if err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	if b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); err == nil {
		// Format: pid (comm) state ...; comm may contain spaces or parens.
		if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) && b[i+2] == 'Z' {
			return false
		}
	}
	return true
}

// isPostgres guards the SIGKILL fallback against a recycled pid. Without
// /proc we cannot tell, and trust postmaster.pid.
func isPostgres(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	if err != nil {
		return true
	}
	return strings.HasPrefix(strings.TrimSpace(string(b)), "postgres")
}

func readPostmasterPID(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, _ := strconv.Atoi(strings.TrimSpace(first))
	return pid
}

// freePort asks the kernel for an unused port. It can be taken again before
// the server binds it, which Start handles by retrying.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pick free port: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		return 0, fmt.Errorf("pick free port: %w", err)
	}
	return port, nil
}

func portTaken(serverLog []byte) bool {
	s := string(serverLog)
	return strings.Contains(s, "could not bind") || strings.Contains(s, "Address already in use") ||
		strings.Contains(s, "could not create any TCP/IP sockets")
}

// confString quotes s as a postgresql.conf string literal.
func confString(s string) string {
	s = strings.ReplaceAll(s, `\`, `\\`)
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

func appendFile(path, text string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(text)
	return errors.Join(err, f.Close())
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

func readFrom(path string, off int64) []byte {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	b, _ := io.ReadAll(io.NewSectionReader(f, off, 1<<30))
	return b
}

// tail keeps error messages readable: the end of a log is where the reason
// for a failure is.
func tail(b []byte) string {
	const maxLines, maxBytes = 20, 4096
	b = bytes.TrimRight(b, "\n")
	if len(b) > maxBytes {
		b = b[len(b)-maxBytes:]
	}
	lines := strings.Split(string(b), "\n")
	if len(lines) > maxLines {
		lines = lines[len(lines)-maxLines:]
	}
	return strings.Join(lines, "\n")
}
