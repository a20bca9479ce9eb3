package sqlstreams

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	gojson "github.com/goccy/go-json"
)

// Decoder turns a stored payload (JSON: decision 0012) into a consumer's
// message type. ClientConfig.Decoder picks it; every consumer of the client
// uses it. An implementation must follow encoding/json's rules for the
// types users write, since producers encode with encoding/json: struct tags
// (renames, "-", omitempty, string), case-insensitive field names, unknown
// fields ignored, json.RawMessage, json.Unmarshaler and
// encoding.TextUnmarshaler, embedded structs, pointers, maps, slices and
// interface values (numbers as float64). A type mismatch should be reported
// as a *json.UnmarshalTypeError so that the dead letter names the field.
type Decoder interface {
	Unmarshal(data []byte, v any) error
}

// StandardJSON is the Decoder that decodes with encoding/json, the rules
// producers encode with. StandardJSON{} is the default (decision 0086).
type StandardJSON struct{}

// Unmarshal decodes with encoding/json.
func (StandardJSON) Unmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }

// FastJSON is the Decoder that decodes with github.com/goccy/go-json: about
// 5.5 times as fast as encoding/json on the benchmark's Order on the
// reference machine (decision 0033), and opt-in (set ClientConfig.Decoder to
// FastJSON{}), because it does not decode exactly like encoding/json
// (decision 0086, whose fuzz target compares the two):
//   - a number into a float32 is parsed as a float64 and then narrowed:
//     json.Marshal's text of ±math.MaxFloat32 (3.4028235e+38) is out of range
//     and fails to decode, and a number that is halfway between two
//     float32s as a float64 may round the other way;
//   - a float field with the string option takes "NaN", "Inf" and
//     "Infinity", which encoding/json rejects;
//   - a number field with the string option takes a leading plus ("+1"),
//     which encoding/json rejects;
//   - a string field with the string option refuses \' inside its quoted
//     string, which encoding/json takes as an apostrophe (json.Marshal never
//     writes it);
//   - a type mismatch's field (the one a dead letter names) leaves out the
//     embedded struct it is in, and is empty for a mismatch inside a
//     json.Unmarshaler's own decoding.
//
// Elsewhere it decoded as encoding/json does in the decision's fuzz runs.
type FastJSON struct{}

// Unmarshal decodes with go-json and reports a type mismatch as
// encoding/json's error type, so that callers look for one error type only.
func (FastJSON) Unmarshal(data []byte, v any) error {
	err := gojson.Unmarshal(data, v)
	if err == nil {
		return nil
	}
	var te *gojson.UnmarshalTypeError
	if errors.As(err, &te) {
		return &json.UnmarshalTypeError{Value: te.Value, Type: te.Type, Offset: te.Offset, Struct: te.Struct, Field: stdFieldPath(te.Field)}
	}
	return err
}

// stdFieldPath drops the slice indexes go-json puts in a field path
// ("lines.0.street"): encoding/json names the field ("lines.street").
func stdFieldPath(p string) string {
	parts := strings.Split(p, ".")
	out := parts[:0]
	for _, s := range parts {
		if s == "" || strings.Trim(s, "0123456789") != "" {
			out = append(out, s)
		}
	}
	return strings.Join(out, ".")
}

// decodeError is the Terminal error of a payload that does not decode: it
// names the message, the type and (for a type mismatch) the field, and
// never quotes the payload.
func decodeError(err error, id int64, into any) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return Terminal(fmt.Errorf("%w: message %d into %T: field %q wants %s", ErrDecode, id, into, te.Field, te.Type))
	}
	return Terminal(fmt.Errorf("%w: message %d into %T", ErrDecode, id, into))
}
