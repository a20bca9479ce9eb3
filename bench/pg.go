package main

// A private, throwaway PostgreSQL for the benchmark: initdb into a temporary
// directory, durable settings, loopback only, a free port (never 5432), and
// everything removed again at the end. The library's internal/pgcluster does
// the same for its tests, but Go forbids importing another module's internal
// package, so this is the small version.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

type cluster struct {
	bin, dir string
	port     int
	cred     *syscall.Credential // run the tools as postgres when we are root
}

// pgBinDir finds initdb and pg_ctl: PATH first, else the newest Debian-style
// /usr/lib/postgresql/*/bin.
func pgBinDir() (string, error) {
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		if _, err := os.Stat(filepath.Join(filepath.Dir(p), "initdb")); err == nil {
			return filepath.Dir(p), nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int { return pgMajor(b) - pgMajor(a) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "pg_ctl")); err == nil {
			return d, nil
		}
	}
	return "", fmt.Errorf("PostgreSQL server binaries (initdb, pg_ctl) not found; install them (apt-get install -y postgresql) or pass -url")
}

func pgMajor(binDir string) int {
	n, _ := strconv.Atoi(strings.SplitN(filepath.Base(filepath.Dir(binDir)), ".", 2)[0])
	return n
}

func startCluster(ctx context.Context, statements bool, sharedBuffers string) (*cluster, error) {
	if !validMemory(sharedBuffers) {
		return nil, fmt.Errorf("-shared-buffers %q: want a whole number with a unit, such as 256MB or 2GB", sharedBuffers)
	}
	bin, err := pgBinDir()
	if err != nil {
		return nil, err
	}
	c := &cluster{bin: bin}
	if os.Geteuid() == 0 { // PostgreSQL refuses to run as root
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("running as root needs a postgres OS user to run the server as: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		c.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	// /tmp, not $TMPDIR: the postgres user must be able to reach it.
	if c.dir, err = os.MkdirTemp("/tmp", "sqlstreams-bench-pg-*"); err != nil {
		return nil, err
	}
	if c.cred != nil {
		if err := os.Chown(c.dir, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
			c.stop()
			return nil, err
		}
	}
	data := filepath.Join(c.dir, "data")
	if out, err := c.run(ctx, "initdb", "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C"); err != nil {
		c.stop()
		return nil, fmt.Errorf("initdb: %w\n%s", err, out)
	}
	conf := strings.Join([]string{"",
		"listen_addresses = '127.0.0.1'",
		"unix_socket_directories = '" + c.dir + "'",
		"max_connections = 200",
		"shared_buffers = '" + sharedBuffers + "'",
		"fsync = on",
		"synchronous_commit = on",
		"full_page_writes = on",
	}, "\n") + "\n"
	if statements {
		conf += "shared_preload_libraries = 'pg_stat_statements'\npg_stat_statements.max = 5000\npg_stat_statements.track_planning = on\n"
	}
	f, err := os.OpenFile(filepath.Join(data, "postgresql.conf"), os.O_WRONLY|os.O_APPEND, 0)
	if err == nil {
		_, err = f.WriteString(conf)
		err = errors.Join(err, f.Close())
	}
	if err != nil {
		c.stop()
		return nil, fmt.Errorf("configure: %w", err)
	}
	for attempt := 0; ; attempt++ {
		if c.port, err = freePort(); err != nil {
			c.stop()
			return nil, err
		}
		out, err := c.run(ctx, "pg_ctl", "start", "-w", "-t", "120", "-D", data,
			"-l", filepath.Join(c.dir, "server.log"), "-o", "-p "+strconv.Itoa(c.port))
		if err == nil {
			return c, nil
		}
		if attempt == 3 || ctx.Err() != nil { // a lost race for the port is worth a retry
			log, _ := os.ReadFile(filepath.Join(c.dir, "server.log"))
			c.stop()
			return nil, fmt.Errorf("pg_ctl start: %w\n%s\n%s", err, out, log)
		}
	}
}

func (c *cluster) url() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
}

// stop shuts the server down and removes its directory.
func (c *cluster) stop() {
	data := filepath.Join(c.dir, "data")
	if _, err := os.Stat(filepath.Join(data, "postmaster.pid")); err == nil {
		if out, err := c.run(context.Background(), "pg_ctl", "stop", "-D", data, "-m", "fast", "-w", "-t", "60"); err != nil {
			fmt.Fprintf(os.Stderr, "pg_ctl stop: %v\n%s\n", err, out)
			_, _ = c.run(context.Background(), "pg_ctl", "stop", "-D", data, "-m", "immediate", "-w")
		}
	}
	_ = os.RemoveAll(c.dir)
}

func (c *cluster) run(ctx context.Context, tool string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, tool), args...)
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	cmd.Dir = c.dir
	// PG* variables must not point the tools at another server.
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "PG") })
	if c.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	}
	cmd.WaitDelay = 10 * time.Second // should the postmaster ever hold our pipe
	err := cmd.Run()
	return buf.Bytes(), err
}

// validMemory reports whether s is a PostgreSQL memory setting this harness
// writes into postgresql.conf as is: digits, then kB, MB, GB or TB.
func validMemory(s string) bool {
	for _, unit := range []string{"kB", "MB", "GB", "TB"} {
		if n, ok := strings.CutSuffix(s, unit); ok {
			v, err := strconv.Atoi(n)
			return err == nil && v > 0 && strconv.Itoa(v) == n
		}
	}
	return false
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
