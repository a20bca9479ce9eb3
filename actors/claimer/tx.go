package claimer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/c1702965/sqlstreams/internal/policy"
	"github.com/c1702965/sqlstreams/internal/store"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Transactional handlers (decision 0087).
//
// A transactional handler runs inside a transaction that also settles its
// message: whatever it writes commits with the message's settlement (its
// range's settled set, or its exception row's result), or none of it does.
// A tx worker takes a batch of one range's messages (or one exception row),
// begins a transaction on the pool, runs each message's handler in a
// savepoint of it (a failure rolls back only its own writes), decides each
// result as the actor would, writes the settlements fenced by the lease's
// token, and commits. The actor then applies the results as already
// written (Outcome.tx.recorded). A batch whose settlement finds the lease
// gone, or whose commit fails or cannot say whether it applied, commits
// nothing the actor knows of (Outcome.tx.lost): the range is let go of, and
// whoever holds its lease next finds in the database exactly what committed.

// TxHandler runs one delivery inside tx, the transaction that settles it.
type TxHandler func(ctx context.Context, tx pgx.Tx, d *Delivery) error

// MaxTxBatch bounds the messages of one transaction: each runs in a
// savepoint, and a transaction with more than 64 subtransactions that
// wrote overflows PostgreSQL's per-backend cache of them, which slows every
// snapshot taken meanwhile.
const MaxTxBatch = 50

// decided is an attempt's result as its settlement writes it.
type decided struct {
	next policy.Next
	// The range path's: the message's exception row (nil: a success) and
	// delivery-log row (nil: not logged).
	write *store.ExceptionWrite
	log   *store.DeliveryWrite
	// The exception path's settlement of the row.
	settle *store.Settlement
}

// txResult is what a tx worker says of one message's attempt.
type txResult struct {
	// recorded: the settlement committed with the handler's writes.
	recorded bool
	// lost: nothing of the batch is known to have committed (its lease was
	// gone, its transaction failed, or its commit's reply was lost).
	lost bool
	decided
}

// txSettler is what a tx worker needs from its actor: how an attempt's
// result is decided (safe to call from any goroutine), and how a batch's
// settlements are written inside the transaction (ok false: the lease was
// gone).
type txSettler interface {
	decide(j Job, err error) decided
	write(ctx context.Context, tx pgx.Tx, batch []Job, results []decided) (ok bool, err error)
}

// txMode is a runner's transactional mode.
type txMode struct {
	pool    *pgxpool.Pool
	settler txSettler
	batch   int // messages a transaction at most
}

// errTxLost is the outcome of a message whose transaction committed
// nothing the actor knows of.
var errTxLost = errors.New("its transaction did not commit")

// runTx runs a batch of jobs in one transaction and returns their outcomes
// in order.
func (r *runner) runTx(ctx context.Context, batch []Job, slot **executor) []Outcome {
	outs := make([]Outcome, len(batch))
	lost := func(from int, err error) []Outcome {
		for i := from; i < len(batch); i++ {
			outs[i] = Outcome{Ref: batch[i].Ref, Err: fmt.Errorf("%w: %w", errTxLost, err), tx: txResult{lost: true}}
			if m := batch[i].Delivery.Msg; m != nil {
				outs[i].msgID = m.ID
			}
		}
		return outs
	}
	if ctx.Err() != nil {
		for i, j := range batch {
			outs[i] = Outcome{Ref: j.Ref, Err: ctx.Err(), Canceled: true}
		}
		return outs
	}
	tx, err := r.tx.pool.Begin(ctx)
	if err != nil {
		return lost(0, err)
	}
	canceled := func(err error) []Outcome { // the pool stops: nothing settles
		for i, j := range batch {
			outs[i] = Outcome{Ref: j.Ref, Err: err, Canceled: true}
		}
		return outs
	}
	results := make([]decided, len(batch))
	for i := range batch {
		j := batch[i]
		if _, err := tx.Exec(ctx, "SAVEPOINT sqlstreams_message"); err != nil {
			_ = tx.Rollback(ctx)
			return lost(0, err)
		}
		j.Delivery.Tx = tx
		o := r.run(ctx, j, slot)
		switch {
		case o.Canceled:
			if !o.handlerLeft { // else the handler still uses tx: it is left to it
				_ = tx.Rollback(ctx)
			}
			return canceled(o.Err)
		case o.handlerLeft:
			// Abandoned past its grace: the handler may still use tx, which
			// is its now. Its timeout is recorded alone; nothing else of the
			// batch commits.
			res := lost(0, errors.New("a handler of the batch was abandoned with its transaction"))
			res[i] = r.settleAlone(ctx, j, o)
			return res
		case o.Err != nil:
			if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT sqlstreams_message"); err != nil {
				// The transaction is unusable (a timeout cut its connection):
				// the failure is recorded alone, the rest runs again.
				_ = tx.Rollback(ctx)
				res := lost(0, err)
				res[i] = r.settleAlone(ctx, j, o)
				return res
			}
		}
		outs[i] = o
		results[i] = r.tx.settler.decide(j, o.Err)
	}
	ok, err := r.tx.settler.write(ctx, tx, batch, results)
	if err == nil && !ok {
		err = store.ErrLeaseLost
	}
	if err != nil {
		_ = tx.Rollback(ctx)
		return lost(0, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return lost(0, err)
	}
	for i := range outs {
		outs[i].tx = txResult{recorded: true, decided: results[i]}
	}
	return outs
}

// settleAlone records one failed attempt in a transaction of its own (its
// handler's writes went with the batch's) and returns its outcome: recorded
// if that commits, else lost with the batch.
func (r *runner) settleAlone(ctx context.Context, j Job, o Outcome) Outcome {
	res := r.tx.settler.decide(j, o.Err)
	sctx, cancel := r.clock.WithTimeout(context.WithoutCancel(ctx), settleAloneBound)
	defer cancel()
	err := pgx.BeginFunc(sctx, r.tx.pool, func(tx pgx.Tx) error {
		ok, err := r.tx.settler.write(sctx, tx, []Job{j}, []decided{res})
		if err == nil && !ok {
			err = store.ErrLeaseLost
		}
		return err
	})
	o.tx = txResult{recorded: err == nil, lost: err != nil, decided: res}
	return o
}

// settleAloneBound bounds the transaction that records a failed attempt
// alone (its batch's was unusable).
const settleAloneBound = 5 * time.Second

// batches groups jobs into the runner's transactions: consecutive jobs of
// one range (its incarnation) in batches of at most n; an exception row's
// job alone.
func batches(jobs []Job, n int) []Job {
	out := make([]Job, 0, len(jobs))
	for i := 0; i < len(jobs); {
		j := jobs[i]
		k := i + 1
		if j.Ref.row == (store.Position{}) {
			for k < len(jobs) && k-i < n && jobs[k].Ref.rangeID == j.Ref.rangeID && jobs[k].Ref.token == j.Ref.token {
				k++
			}
		}
		out = append(out, Job{Ref: j.Ref, batch: append([]Job(nil), jobs[i:k]...)})
		i = k
	}
	return out
}
