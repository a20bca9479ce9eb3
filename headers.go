package sqlstreams

import (
	"encoding/json"
	"errors"
	"fmt"
	"unicode"
)

// Bounds of a message's headers (ProduceOptions.Headers, BatchItem.Headers).
const (
	MaxHeaders          = 32   // headers per message
	MaxHeaderNameBytes  = 128  // a header's name
	MaxHeaderValueBytes = 1024 // a header's value
	MaxHeadersBytes     = 8192 // every name and value of a message together
)

// ErrInvalidHeader: a message header breaking the rules of Headers. The
// error names the header, never its value.
var ErrInvalidHeader = errors.New("invalid header")

// Headers are a message's metadata beside its payload: trace context
// (W3C traceparent, tracestate), a correlation id, the name of the
// producing service. Names are 1 to MaxHeaderNameBytes of ASCII letters,
// digits, '-', '_' and '.' (case-sensitive); values any UTF-8 text of at
// most MaxHeaderValueBytes without control characters; at most MaxHeaders
// of them, MaxHeadersBytes in all. Stored with the message and handed to
// consumers in Meta.Headers; never logged.
type Headers map[string]string

func (h Headers) validate() error {
	if len(h) > MaxHeaders {
		return fmt.Errorf("%w: %d headers, at most %d", ErrInvalidHeader, len(h), MaxHeaders)
	}
	total := 0
	for name, value := range h {
		if name == "" || len(name) > MaxHeaderNameBytes {
			return fmt.Errorf("%w: header name %q: 1 to %d bytes", ErrInvalidHeader, truncateName(name), MaxHeaderNameBytes)
		}
		for _, r := range name {
			if !(r < unicode.MaxASCII && (r == '-' || r == '_' || r == '.' || unicode.IsLetter(r) || unicode.IsDigit(r))) {
				return fmt.Errorf("%w: header name %q: ASCII letters, digits, '-', '_' and '.' only", ErrInvalidHeader, truncateName(name))
			}
		}
		if len(value) > MaxHeaderValueBytes {
			return fmt.Errorf("%w: header %q: a value of %d bytes, at most %d", ErrInvalidHeader, name, len(value), MaxHeaderValueBytes)
		}
		for _, r := range value {
			if unicode.IsControl(r) || r == unicode.ReplacementChar {
				return fmt.Errorf("%w: header %q: its value holds a control character or invalid UTF-8", ErrInvalidHeader, name)
			}
		}
		total += len(name) + len(value)
	}
	if total > MaxHeadersBytes {
		return fmt.Errorf("%w: headers of %d bytes, at most %d", ErrInvalidHeader, total, MaxHeadersBytes)
	}
	return nil
}

func truncateName(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

// encode is the stored form: a JSON object, or nil for none.
func (h Headers) encode() ([]byte, error) {
	if len(h) == 0 {
		return nil, nil
	}
	return json.Marshal(map[string]string(h))
}

// decodeHeaders reads the stored form; nil for none.
func decodeHeaders(b []byte) Headers {
	if len(b) == 0 {
		return nil
	}
	var h Headers
	if err := json.Unmarshal(b, &h); err != nil {
		return nil // written by this library as an object of strings; nothing else reaches here
	}
	return h
}
