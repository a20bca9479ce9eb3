package sqlstreams

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sync"

	"github.com/c1702965/sqlstreams/internal/store"
)

// payloadEncoder encodes a produce call's messages into one shared buffer.
// json.Marshal allocates and copies a result per message, and the copies
// were a fifth of a batched produce's client CPU; the database driver copies
// the payloads into its own wire buffer anyway, so the messages only need to
// live until the statement is sent. The bytes are exactly json.Marshal's.
type payloadEncoder struct {
	buf   bytes.Buffer
	enc   *json.Encoder
	spans [][2]int
}

// maxPooledEncoderBytes keeps an occasional huge batch from pinning its
// buffer in the pool.
const maxPooledEncoderBytes = 4 << 20

var payloadEncoders = sync.Pool{New: func() any {
	e := &payloadEncoder{}
	e.enc = json.NewEncoder(&e.buf)
	return e
}}

func getPayloadEncoder() *payloadEncoder { return payloadEncoders.Get().(*payloadEncoder) }

func putPayloadEncoder(e *payloadEncoder) {
	if e.buf.Cap() > maxPooledEncoderBytes {
		return
	}
	e.buf.Reset()
	e.spans = e.spans[:0]
	payloadEncoders.Put(e)
}

// encode appends v's JSON and returns a view of it that is valid until the
// next call; finish hands out the final views. remaining (this message
// included) sizes the buffer after the first message, so a batch of similar
// messages grows it once.
func (e *payloadEncoder) encode(v any, remaining int) ([]byte, error) {
	start := e.buf.Len()
	if err := e.enc.Encode(v); err != nil {
		e.buf.Truncate(start)
		return nil, err
	}
	end := e.buf.Len() - 1 // Encode ends every value with a newline
	if start == 0 && remaining > 1 {
		// Sized from the first message, capped: one large message at the
		// head of a batch of small ones must not reserve the batch times it.
		e.buf.Grow(min(end*(remaining-1)*9/8, maxPooledEncoderBytes))
	}
	e.spans = append(e.spans, [2]int{start, end})
	return e.buf.Bytes()[start:end], nil
}

// finish points every message's payload at its final place in the buffer
// (growing the buffer may have moved earlier ones). msgs[i] is the i-th
// message encoded.
func (e *payloadEncoder) finish(msgs []store.NewMessage) {
	b := e.buf.Bytes()
	for i, sp := range e.spans {
		msgs[i].Payload = b[sp[0]:sp[1]:sp[1]]
	}
}

// nullPayload is the JSON a nil pointer, a nil json.RawMessage or a nil any
// encodes to. It is not a message: a consumer of a struct type would be
// handed a zero value. Produce and a schedule's payload refuse it (ErrEncode).
var nullPayload = []byte("null")

// refuseNull returns the error for a payload that encoded to JSON null, or
// nil for any other.
func refuseNull(payload []byte) error {
	if bytes.Equal(payload, nullPayload) {
		return fmt.Errorf("%w: a JSON null is not a message (the value is a nil pointer, RawMessage or interface)", ErrEncode)
	}
	return nil
}
