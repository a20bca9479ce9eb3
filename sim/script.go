package sim

import (
	"bufio"
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/c1702965/sqlstreams/internal/groupconfig"
	"github.com/c1702965/sqlstreams/internal/policy"
)

// Exec runs one line of a scenario script. The language:
//
//	config max_retries=N backoff=D reclaims=N   redeclare the group config
//	start i1 [pattern ...]                      start the next instance (named in order: i1, i2, ...)
//	produce N [key=K] [conc=exclusive|ordered] [rk=ROUTING.KEY]
//	claim iN                                    one range claim
//	run iN [ok|fails|terminal|delays] [all]     run the oldest handed-out range job(s)
//	retry iN                                    claim due exception rows
//	runretry iN [result] [all]                  run the oldest handed-out retry job(s)
//	advance D                                   move the clock; due beats, refreshes and binding attempts run
//	crash iN | stop iN                          kill without a hand-back | stop gracefully
//	stall iN D                                  the instance's actors take no step for D of mock time
//	settle                                      run every consuming instance until all is handled or dead
//	check                                       run the invariants and trace a summary
//
// Blank lines and lines starting with # are ignored. Every line runs the
// invariants afterwards.
func (w *World) Exec(ctx context.Context, line string) error {
	f := strings.Fields(line)
	if len(f) == 0 || strings.HasPrefix(f[0], "#") {
		return nil
	}
	args := map[string]string{}
	var words []string
	for _, a := range f[1:] {
		if k, v, ok := strings.Cut(a, "="); ok {
			args[k] = v
		} else {
			words = append(words, a)
		}
	}
	inst := func() (*instance, error) {
		if len(words) == 0 {
			return nil, fmt.Errorf("%s: which instance?", f[0])
		}
		return w.instance(words[0])
	}
	var err error
	switch f[0] {
	case "config":
		d := w.declared
		if v, ok := args["max_retries"]; ok {
			n, perr := strconv.Atoi(v)
			if perr != nil {
				return fmt.Errorf("config: max_retries: %w", perr)
			}
			d.Message.MaxRetries = n
		}
		if v, ok := args["backoff"]; ok {
			if d.ExceptionInitialBackoff, err = time.ParseDuration(v); err != nil {
				return fmt.Errorf("config: backoff: %w", err)
			}
		}
		if v, ok := args["reclaims"]; ok {
			if d.MaxRangeReclaims, err = strconv.Atoi(v); err != nil {
				return fmt.Errorf("config: reclaims: %w", err)
			}
		}
		err = w.declare(ctx, d)
		w.tracef("config declared: max_retries=%d reclaims=%d", d.Message.MaxRetries, d.MaxRangeReclaims)
	case "start":
		if len(words) == 0 {
			return fmt.Errorf("start: name the instance")
		}
		if want := fmt.Sprintf("i%d", w.nextInst+1); words[0] != want {
			return fmt.Errorf("start: the next instance is %s, not %s", want, words[0])
		}
		_, err = w.Start(ctx, words[1:])
	case "produce":
		n := 1
		if len(words) > 0 {
			if n, err = strconv.Atoi(words[0]); err != nil {
				return fmt.Errorf("produce: %w", err)
			}
		}
		err = w.Produce(ctx, n, args["key"], policy.Concurrency(args["conc"]), args["rk"])
	case "claim":
		var in *instance
		if in, err = inst(); err == nil {
			err = w.Claim(ctx, in)
		}
	case "retry":
		var in *instance
		if in, err = inst(); err == nil {
			err = w.Retry(ctx, in)
		}
	case "run", "runretry":
		var in *instance
		if in, err = inst(); err != nil {
			break
		}
		result, all := "ok", false
		for _, word := range words[1:] {
			if word == "all" {
				all = true
			} else {
				result = word
			}
		}
		exc := f[0] == "runretry"
		for {
			queue := in.jobs
			if exc {
				queue = in.exJobs
			}
			if len(queue) == 0 {
				break
			}
			if err = w.RunOne(ctx, in, exc, result); err != nil || !all {
				break
			}
		}
	case "advance":
		if len(words) == 0 {
			return fmt.Errorf("advance: how far?")
		}
		var d time.Duration
		if d, err = time.ParseDuration(words[0]); err != nil {
			return fmt.Errorf("advance: %w", err)
		}
		err = w.Advance(ctx, d, 0)
	case "stall":
		var in *instance
		if in, err = inst(); err != nil {
			break
		}
		if len(words) < 2 {
			return fmt.Errorf("stall: for how long?")
		}
		var d time.Duration
		if d, err = time.ParseDuration(words[1]); err != nil {
			return fmt.Errorf("stall: %w", err)
		}
		w.Stall(in, d)
	case "crash":
		var in *instance
		if in, err = inst(); err == nil {
			w.Crash(in)
		}
	case "stop":
		var in *instance
		if in, err = inst(); err == nil {
			err = w.Stop(ctx, in)
		}
	case "settle":
		err = w.Settle(ctx, 200)
	case "check":
		var sum string
		if sum, err = w.Summary(ctx); err == nil {
			w.tracef("check: %s", sum)
		}
	default:
		return fmt.Errorf("unknown command %q", f[0])
	}
	if err != nil {
		return err
	}
	return w.Check(ctx)
}

// RunScript runs a scenario, line by line.
func (w *World) RunScript(ctx context.Context, script string) error {
	sc := bufio.NewScanner(strings.NewReader(script))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line != "" && !strings.HasPrefix(line, "#") {
			w.trace = append(w.trace, "> "+line)
		}
		if err := w.Exec(ctx, line); err != nil {
			return fmt.Errorf("line %d %q: %w", n, line, err)
		}
	}
	return sc.Err()
}

// DefaultConfig is the group config scenarios and random runs start from:
// short curves so that retries come due in simulated seconds.
func DefaultConfig() groupconfig.Declared {
	return groupconfig.Declared{
		Message:                 policy.Options{Timeout: 5 * time.Second, MaxRetries: 3, BaseDelay: 100 * time.Millisecond, MaxDelay: time.Second},
		ExceptionInitialBackoff: 100 * time.Millisecond,
	}
}
