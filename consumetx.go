package sqlstreams

import (
	"context"
	"fmt"

	"github.com/c1702965/sqlstreams/engine"
	"github.com/jackc/pgx/v5"
)

// TxHandler handles one message inside tx, the transaction that settles it
// (ConsumeTx): whatever it writes through tx, and whatever it produces with
// ProduceOptions{Tx: tx}, commits together with the message's settlement,
// or none of it does. Its results mean what a Handler's do (nil, an error
// for the retry curve, Terminal, Delay); a failed attempt's writes are
// rolled back and its outcome is recorded. It must use tx only until it
// returns, never commit or roll it back itself, and use no other
// connection for what must commit with the message.
type TxHandler[T any] func(ctx context.Context, tx pgx.Tx, msg *T) error

// ConsumeTx runs one instance of the group, as Consume does, with a
// transactional handler: a message's effects in the database and its
// settlement are one transaction, so each message's effects commit exactly
// once (until an operator seeks back or redrives it), whatever the process,
// the connections or the database do meanwhile. The settlement is fenced
// by the lease's token inside the transaction: a frozen or lapsed instance's
// transaction fails instead of committing a second effect.
//
// Up to MaxTxMessages messages of one range run in one transaction, each in
// a savepoint, so that one failure rolls back only its own writes
// (decision 0087). Each of MessageConcurrency workers holds a pool
// connection while its transaction runs: size the pool for it.
func (c *Consumer[T]) ConsumeTx(ctx context.Context, handler TxHandler[T], opts *ConsumeOptions) error {
	if handler == nil {
		return fmt.Errorf("%w: ConsumeTx needs a handler", ErrInvalidConfig)
	}
	return c.consume(ctx, nil, func(ctx context.Context, tx pgx.Tx, d *engine.Delivery) error {
		return c.adapt(func(ctx context.Context, msg *T) error { return handler(ctx, tx, msg) })(ctx, d)
	}, opts)
}

// MaxTxMessages is the most messages ConsumeTx runs in one transaction.
const MaxTxMessages = engine.MaxTxMessages
