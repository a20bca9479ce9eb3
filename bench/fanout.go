package main

// Fan-out (one backlog read by 1, 4 and 16 groups at once) and selective
// bindings (a group whose bindings match 1% of a stream, against an idle
// group, in database CPU).

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/c1702965/sqlstreams"
)

// fanOut has groups groups (one instance each) read the same n-message
// backlog at once; it returns deliveries per second (n × groups / elapsed).
func fanOut(ctx context.Context, s *sqlstreams.StreamHandle[Order], prefix string, groups, n int, label string) (float64, error) {
	cons := make([]*sqlstreams.Consumer[Order], groups)
	for g := range cons {
		c, err := s.Consumer(fmt.Sprintf("%s-g%d", prefix, g)).Register(ctx, &sqlstreams.ConsumerConfig{Start: sqlstreams.StartBeginning})
		if err != nil {
			return 0, err
		}
		cons[g] = c
	}
	total := int64(n) * int64(groups)
	var count, finished atomic.Int64
	all := make(chan struct{})
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, groups)
	stop := progress(label, "deliveries", total, &count)
	start := wall.Now()
	for _, c := range cons {
		var mine atomic.Int64
		go func() {
			opts := burnOptions
			errs <- c.Consume(cctx, func(context.Context, *Order) error {
				count.Add(1)
				if mine.Add(1) == int64(n) && finished.Add(1) == int64(groups) {
					close(all)
				}
				return nil
			}, &opts)
		}()
	}
	elapsed, err := awaitRun(ctx, start, all, errs, groups, &count, total, "delivered", stop, cancel)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", label, err)
	}
	return report1(label, "deliveries", int(total), elapsed), nil
}

// serverCPU reads the CPU time used so far by the PostgreSQL server the pool
// talks to: the postmaster, its live children and the children it has
// waited for (backends that exited), from /proc. It works only
// when the server runs on this machine (the private cluster); otherwise ok
// is false.
func (b *bench) serverCPU(ctx context.Context) (cpu time.Duration, faults int64, ok bool) {
	var backend int
	if err := b.pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		return 0, 0, false
	}
	_, _, postmaster, ok := procStat(backend)
	if !ok {
		return 0, 0, false
	}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	var ticks int64
	for _, p := range procs {
		pid, err := strconv.Atoi(filepath.Base(p))
		if err != nil {
			continue
		}
		t, f, ct, cf, ppid, ok := procStatAll(pid)
		if ok && (pid == postmaster || ppid == postmaster) {
			ticks += t
			faults += f
		}
		if ok && pid == postmaster {
			// Backends that exited count too: a window in which a lane's
			// connection closed would otherwise lose that backend's CPU
			// (the live processes alone undercounted; fixed in d1ff72a).
			ticks += ct
			faults += cf
		}
	}
	return time.Duration(ticks) * time.Second / 100, faults, true // USER_HZ is 100 on Linux
}

// cpuTimes is a reading of the server's and this process's CPU time, and
// of their minor page faults: on a virtual machine whose page faults are
// slow (each one a trip to the hypervisor), a workload that touches more
// fresh memory (new backends, caches of many streams' relations, a heap the
// Go runtime gave back) pays for it in CPU the profile shows as system time.
type cpuTimes struct {
	server, client             time.Duration
	serverFaults, clientFaults int64
}

// perUnit is the server's and the client's CPU from t to after, in
// microseconds for each of n units.
func (t cpuTimes) perUnit(after cpuTimes, n int) (server, client float64) {
	per := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) / float64(n) }
	return per(after.server - t.server), per(after.client - t.client)
}

// perMessage is perUnit as the progress lines print it.
func (t cpuTimes) perMessage(after cpuTimes, n int) string {
	server, client := t.perUnit(after, n)
	return fmt.Sprintf("server %.1f µs, client %.1f µs (page faults a message: server %.2f, client %.2f)", server, client,
		float64(after.serverFaults-t.serverFaults)/float64(n), float64(after.clientFaults-t.clientFaults)/float64(n))
}

// cpuNow reads both; ok is false when the server's is not readable.
func (b *bench) cpuNow(ctx context.Context) (cpuTimes, bool) {
	server, faults, ok := b.serverCPU(ctx)
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	client := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	return cpuTimes{server: server, client: client, serverFaults: faults, clientFaults: ru.Minflt}, ok
}

// procStat returns a process's user+system CPU ticks, its minor page
// faults and its parent's pid.
func procStat(pid int) (ticks, faults int64, ppid int, ok bool) {
	ticks, faults, _, _, ppid, ok = procStatAll(pid)
	return ticks, faults, ppid, ok
}

// procStatAll is procStat with the CPU ticks and minor page faults of the
// process's children that have exited and been waited for (cutime+cstime,
// cminflt): for the postmaster, every backend that ended.
func procStatAll(pid int) (ticks, faults, childTicks, childFaults int64, ppid int, ok bool) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, 0, 0, 0, false
	}
	s := string(raw)
	i := strings.LastIndexByte(s, ')') // the command may hold spaces
	if i < 0 {
		return 0, 0, 0, 0, 0, false
	}
	f := strings.Fields(s[i+1:]) // f[0] is field 3 (state)
	if len(f) < 15 {
		return 0, 0, 0, 0, 0, false
	}
	ppid, _ = strconv.Atoi(f[1])
	faults, _ = strconv.ParseInt(f[7], 10, 64)
	childFaults, _ = strconv.ParseInt(f[8], 10, 64)
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	cut, _ := strconv.ParseInt(f[13], 10, 64)
	cst, _ := strconv.ParseInt(f[14], 10, 64)
	return ut + st, faults, cut + cst, childFaults, ppid, true
}

// selectiveResult is one run of the selective-bindings workload: database
// CPU over the same window with the producer alone, with an idle group
// added, and with a group whose bindings match 1% of the stream added.
type selectiveResult struct {
	Label       string  `json:"label"`
	Seconds     float64 `json:"seconds"`
	Rate        int     `json:"rate"`
	ProducerCPU float64 `json:"producer_only_cpu_s"`
	IdleCPU     float64 `json:"with_idle_group_cpu_s"`
	OnePctCPU   float64 `json:"with_1pct_group_cpu_s"`
	Handled     int64   `json:"handled_by_1pct_group"`
}

// selective produces at rate msg/s for dur three times to fresh streams,
// 1% of the messages with routing key "orders.hit" and the rest with
// "orders.miss": alone, with an idle group (consuming an empty stream), and
// with a group bound to "orders.hit". Each window's server CPU is read from
// /proc.
func (b *bench) selective(ctx context.Context, newStream func(string) (*sqlstreams.StreamHandle[Order], error), rate int, dur time.Duration, run int) (selectiveResult, error) {
	res := selectiveResult{Label: fmt.Sprintf("selective run %d/%d", run, b.c.runs), Seconds: dur.Seconds(), Rate: rate}
	window := func(mode string) (float64, error) {
		s, err := newStream(fmt.Sprintf("bench.sel.%s.%d", mode, run))
		if err != nil {
			return 0, err
		}
		cctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		var cerr error
		var handled atomic.Int64
		consume := func(c *sqlstreams.Consumer[Order]) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := c.Consume(cctx, func(context.Context, *Order) error { handled.Add(1); return nil }, nil)
				if err != nil && !errors.Is(err, context.Canceled) {
					cerr = err
				}
			}()
		}
		switch mode {
		case "idle":
			empty, err := newStream(fmt.Sprintf("bench.sel.empty.%d", run))
			if err != nil {
				cancel()
				return 0, err
			}
			c, err := empty.Consumer(fmt.Sprintf("sel-idle-%d", run)).Register(ctx, nil)
			if err != nil {
				cancel()
				return 0, err
			}
			consume(c)
		case "onepct":
			c, err := s.Consumer(fmt.Sprintf("sel-hit-%d", run)).Register(ctx, &sqlstreams.ConsumerConfig{Bindings: []string{"orders.hit"}})
			if err != nil {
				cancel()
				return 0, err
			}
			consume(c)
		}
		sleep(time.Second) // the group's instance comes up outside the window
		before, _, ok := b.serverCPU(ctx)
		if !ok {
			cancel()
			wg.Wait()
			return 0, errors.New("server CPU is not readable from /proc (the server is not local)")
		}
		total := int(float64(rate) * dur.Seconds())
		interval := time.Second / time.Duration(rate)
		start := wall.Now()
		for i := range total {
			if w := start.Add(time.Duration(i) * interval).Sub(wall.Now()); w > 0 {
				sleep(w)
			}
			rk := "orders.miss"
			if i%100 == 0 {
				rk = "orders.hit"
			}
			if _, err := s.Produce(ctx, baseOrder, &sqlstreams.ProduceOptions{RoutingKey: rk}); err != nil {
				cancel()
				wg.Wait()
				return 0, err
			}
		}
		after, _, _ := b.serverCPU(ctx)
		cancel()
		wg.Wait()
		if cerr != nil {
			return 0, cerr
		}
		if mode == "onepct" {
			res.Handled = handled.Load()
		}
		return (after - before).Seconds(), nil
	}
	var err error
	if res.ProducerCPU, err = window("alone"); err != nil {
		return res, err
	}
	if res.IdleCPU, err = window("idle"); err != nil {
		return res, err
	}
	if res.OnePctCPU, err = window("onepct"); err != nil {
		return res, err
	}
	fmt.Printf("  %-34s server CPU over %s at %d msg/s: producer alone %.2fs, + idle group %.2fs, + 1%% group %.2fs (%d handled)\n",
		res.Label, dur, rate, res.ProducerCPU, res.IdleCPU, res.OnePctCPU, res.Handled)
	return res, nil
}
