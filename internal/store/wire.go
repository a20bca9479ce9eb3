package store

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"slices"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The produce insert is the one statement whose parameters are large: a
// batch of 100 messages of 1 KB sends 100 KB. Encoded by pgx, the arrays grow
// its parameter buffer from 256 bytes by doubling on every call (it drops
// large buffers between queries), which with the garbage it leaves was a
// fifth of a batched produce's client CPU. The insert therefore sends
// parameters it encoded itself, in PostgreSQL's binary format, into one
// buffer sized up front and reused, straight to the connection's prepared
// statement.

// PostgreSQL type OIDs of the insert's array elements.
const (
	oidInt4 = 23
	oidText = 25
)

// pgEpochMicros is 2000-01-01 00:00:00 UTC, the binary timestamptz epoch, in
// Unix microseconds.
const pgEpochMicros = 946_684_800_000_000

// maxPooledParamBytes keeps one huge batch from pinning its buffer.
const maxPooledParamBytes = 4 << 20

var paramBufs = sync.Pool{New: func() any { return new([]byte) }}

// produceParams encodes the insert's six parameters ($1 produced_at, $2
// int4[] versions, $3..$6 text[] routing keys, message keys, payloads and
// options) of msgs[idx...] into buf. Empty keys and options are sent as NULL
// elements.
func produceParams(buf []byte, now Now, msgs []NewMessage, idx []int) ([][]byte, []byte) {
	size := 8 + 6*20 + 8*len(idx) // produced_at, array headers, the int4 elements
	for _, i := range idx {
		m := &msgs[i]
		size += 5*4 + len(m.RoutingKey) + len(m.Key) + len(m.Payload) + len(m.Options) + len(m.Headers)
	}
	buf = slices.Grow(buf[:0], size)
	var spans [7][2]int
	if now != nil {
		spans[0][0] = len(buf)
		buf = binary.BigEndian.AppendUint64(buf, uint64(now.UnixMicro()-pgEpochMicros))
		spans[0][1] = len(buf)
	}
	spans[1][0] = len(buf)
	buf = arrayHeader(buf, oidInt4, len(idx))
	for _, i := range idx {
		buf = binary.BigEndian.AppendUint32(buf, 4)
		buf = binary.BigEndian.AppendUint32(buf, uint32(int32(msgs[i].Version)))
	}
	spans[1][1] = len(buf)
	// The five text arrays, in parameter order ($3..$7).
	columns := [5]func(m *NewMessage, buf []byte) []byte{
		func(m *NewMessage, buf []byte) []byte { return appendText(buf, m.RoutingKey) },
		func(m *NewMessage, buf []byte) []byte { return appendText(buf, m.Key) },
		func(m *NewMessage, buf []byte) []byte { return appendText(buf, m.Payload) },
		func(m *NewMessage, buf []byte) []byte { return appendText(buf, m.Options) },
		func(m *NewMessage, buf []byte) []byte { return appendText(buf, m.Headers) },
	}
	for c, column := range columns {
		k := 2 + c
		spans[k][0] = len(buf)
		buf = arrayHeader(buf, oidText, len(idx))
		for _, i := range idx {
			buf = column(&msgs[i], buf)
		}
		spans[k][1] = len(buf)
	}
	values := make([][]byte, len(spans))
	for k, sp := range spans {
		if k == 0 && now == nil {
			continue // NULL: the database's clock
		}
		values[k] = buf[sp[0]:sp[1]]
	}
	return values, buf
}

// appendText appends one text array element; empty is NULL.
func appendText[S string | []byte](buf []byte, v S) []byte {
	if len(v) == 0 {
		return binary.BigEndian.AppendUint32(buf, 0xFFFFFFFF)
	}
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(v)))
	return append(buf, v...)
}

// arrayHeader appends a one-dimensional array header without NULL flag (the
// server derives it from the elements).
func arrayHeader(buf []byte, elemOID uint32, n int) []byte {
	buf = binary.BigEndian.AppendUint32(buf, 1) // dimensions
	buf = binary.BigEndian.AppendUint32(buf, 0) // has nulls: recomputed by array_recv
	buf = binary.BigEndian.AppendUint32(buf, elemOID)
	buf = binary.BigEndian.AppendUint32(buf, uint32(n))
	return binary.BigEndian.AppendUint32(buf, 1) // lower bound
}

// statementName names a prepared statement after its text, so one name never
// stands for two texts on a connection.
func statementName(sql string) string {
	h := fnv.New64a()
	_, _ = h.Write([]byte(sql))
	return fmt.Sprintf("sqlstreams_%016x", h.Sum64())
}

// binaryFormat is the format code list meaning "every parameter (or result
// column) in binary".
var binaryFormat = []int16{1}

// preparer prepares a statement: a connection's or a transaction's Prepare.
type preparer func(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error)

// insertPrepared runs insert (prepared under its name by prepare, on conn)
// with rows and assigns the returned ids.
func insertPrepared(ctx context.Context, conn *pgx.Conn, prepare preparer, insert namedSQL, rows insertRows) error {
	sd, err := prepare(ctx, insert.name, insert.sql)
	if err != nil {
		return fmt.Errorf("prepare the insert: %w", err)
	}
	return insertWith(rows, func(values [][]byte) *pgconn.ResultReader {
		return conn.PgConn().ExecPrepared(ctx, sd.Name, values, binaryFormat, binaryFormat)
	})
}

// insertUnnamed runs insert as an unnamed statement: parse, bind and execute
// in one round trip, for the first unnamedSightings times a connection meets
// a stream (sighting).
func insertUnnamed(ctx context.Context, conn *pgx.Conn, insert string, rows insertRows) error {
	oids := insertParamOIDs[:7+len(rows.text)]
	return insertWith(rows, func(values [][]byte) *pgconn.ResultReader {
		return conn.PgConn().ExecParams(ctx, insert, values, oids, binaryFormat, binaryFormat)
	})
}

// insertParamOIDs are the types of the insert's parameters: the seven
// produceParams encodes (produced_at, the versions, the five text arrays),
// then the text ones: the guard, and the wake's channel and payload
// (insertBatchWakeSQL only).
var insertParamOIDs = []uint32{oidTimestamptz, oidInt4Array, oidTextArray, oidTextArray, oidTextArray, oidTextArray, oidTextArray, oidText, oidText, oidText}

const (
	oidTimestamptz = 1184
	oidInt4Array   = 1007
	oidTextArray   = 1009
)

// insertWith encodes the insert's parameters (rows), runs it with exec and
// assigns the returned ids.
func insertWith(rows insertRows, exec func(values [][]byte) *pgconn.ResultReader) error {
	bp := paramBufs.Get().(*[]byte)
	values, buf := produceParams(*bp, rows.now, rows.msgs, rows.idx)
	for _, x := range rows.text {
		values = append(values, []byte(x)) // text's binary form is its bytes
	}
	defer func() {
		if cap(buf) <= maxPooledParamBytes {
			*bp = buf[:0]
			paramBufs.Put(bp)
		}
	}()
	rr := exec(values)
	ids := make([]int64, 0, len(rows.idx))
	for rr.NextRow() {
		v := rr.Values()[0]
		if len(v) != 8 {
			_, _ = rr.Close()
			return fmt.Errorf("an id of %d bytes", len(v))
		}
		ids = append(ids, int64(binary.BigEndian.Uint64(v)))
	}
	if _, err := rr.Close(); err != nil {
		return fmt.Errorf("insert: %w", err)
	}
	return assignIDs(ids, rows.idx, rows.out)
}

// maxSeenStreams bounds the streams a connection remembers for sighting;
// past it the set starts over (a stream then runs unnamed twice more).
const maxSeenStreams = 4096

// unnamedSightings is how many times a connection runs a stream's insert
// unnamed before it prepares it. Preparing costs a round trip and a parse
// of its own, and pays back only after the insert has run on the connection
// a few times (PostgreSQL plans the first five executions of a prepared
// statement as it would an unnamed one); a produce spread over many streams
// meets most (connection, stream) pairs once or twice: the prepares of pairs
// met twice took 0.20–0.31 s of about 20 worker-seconds in make
// bench-scale's spread (BENCHMARKS.md at 1ada310).
const unnamedSightings = 2

// sighting reports how many times the connection has met the statement
// named name, this time included (1 the first time; it stops counting a
// little past unnamedSightings, where only "more" matters), and remembers
// it.
func sighting(conn *pgconn.PgConn, name string) int {
	data := conn.CustomData()
	seen, _ := data["sqlstreams.produced"].(map[string]uint8)
	if n, ok := seen[name]; ok {
		if n < unnamedSightings+1 {
			seen[name] = n + 1
		}
		return int(n) + 1
	}
	if seen == nil || len(seen) >= maxSeenStreams {
		seen = make(map[string]uint8)
		data["sqlstreams.produced"] = seen
	}
	seen[name] = 1
	return 1
}
