package sqlstreams

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// FuzzFastJSONDecodesAsEncodingJSON is the differential fuzz target of
// decision 0086: for any payload it decodes into each of fuzzTargets' types,
// fresh as adapt (consumer.go) makes them, with FastJSON{} and StandardJSON{}
// (each on a copy of the payload it overwrites afterwards, as a claim's
// recycled buffer is), and requires the same outcome: both fail or neither
// and, when neither fails, the same value (fuzzEqual: floats bit for bit,
// nil apart from empty). Error messages are not compared: decodeError never
// shows a decoder's message, only, for a type mismatch, the field and the
// type it wants, which FastJSON may name differently
// (TestFastJSONDecodeDivergences). A divergence fuzzKnown names is one the
// decision lists and is let pass; any other fails. `go test` runs the seeds
// below, decodeCorpus and testdata/fuzz/FuzzFastJSONDecodesAsEncodingJSON;
// the decision gives the campaign's command.
func FuzzFastJSONDecodesAsEncodingJSON(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add([]byte(s))
	}
	for _, c := range decodeCorpus {
		f.Add([]byte(c.json))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, tg := range fuzzTargets {
			if d, known := fuzzDiverges(tg, data); d != "" && known == "" {
				t.Errorf("into %s, payload %q: %s", tg.name, data, d)
			}
		}
	})
}

// fuzzTargets are the message types users write: one rich struct with every
// rule of the Decoder's contract, numbers at every width, and the shapes a
// whole message takes (a map, an interface, a slice, a struct embedding
// others whose fields collide).
var fuzzTargets = []fuzzTarget{
	{"fzOrder", func() any { return new(fzOrder) }},
	{"fzNumbers", func() any { return new(fzNumbers) }},
	{"fzFloat32s", func() any { return new(fzFloat32s) }},
	{"fzEvent", func() any { return new(fzEvent) }},
	{"fzStrings", func() any { return new(fzStrings) }},
	{"map[string]any", func() any { return new(map[string]any) }},
	{"any", func() any { return new(any) }},
	{"[]*fzLine", func() any { return new([]*fzLine) }},
	{"map[int]fzLine", func() any { return new(map[int]fzLine) }},
}

type fuzzTarget struct {
	name string
	new  func() any
}

// FzShipping is exported: encoding/json cannot allocate an embedded pointer
// to an unexported struct.
type FzShipping struct {
	Carrier string `json:"carrier"`
	Days    int    `json:"days,omitempty"`
}

type fzBase struct {
	ID      int64     `json:"id"`
	Created time.Time `json:"created"`
}

type fzLine struct {
	SKU   string  `json:"sku"`
	Qty   int     `json:"qty"`
	Price float64 `json:"price,omitempty"`
}

// fzCents is a json.Unmarshaler of the usual kind: a string "12.34" or a
// number of cents.
type fzCents int64

func (c *fzCents) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		whole, frac, _ := strings.Cut(s, ".")
		w, err := strconv.ParseInt(whole, 10, 64)
		if err != nil {
			return fmt.Errorf("cents: %w", err)
		}
		f, err := strconv.ParseInt("0"+frac, 10, 64)
		if err != nil || len(frac) > 2 {
			return fmt.Errorf("cents: bad fraction %q", frac)
		}
		*c = fzCents(w*100 + f)
		return nil
	}
	var n int64
	if err := json.Unmarshal(b, &n); err != nil {
		return err
	}
	*c = fzCents(n)
	return nil
}

// fzSeen keeps the bytes its UnmarshalJSON was handed: both decoders must
// hand a Unmarshaler the same bytes.
type fzSeen struct{ Raw string }

func (s *fzSeen) UnmarshalJSON(b []byte) error {
	s.Raw = string(b)
	return nil
}

// fzColor is an encoding.TextUnmarshaler, as a field and as a map key.
type fzColor int

func (c *fzColor) UnmarshalText(b []byte) error {
	switch string(b) {
	case "red":
		*c = 1
	case "green":
		*c = 2
	case "":
		*c = 0
	default:
		return errors.New("unknown color")
	}
	return nil
}

type fzOrder struct {
	fzBase
	*FzShipping
	Customer string               `json:"customer"`
	Skip     string               `json:"-"`
	Qty      int                  `json:"qty,string"`
	Paid     bool                 `json:"paid,string"`
	Rate     float64              `json:"rate,string"`
	Ref      *int64               `json:"ref,string"`
	Code     string               `json:"code,string"`
	Total    fzCents              `json:"total"`
	Seen     fzSeen               `json:"seen"`
	SeenPtr  *fzSeen              `json:"seen_ptr"`
	Raw      json.RawMessage      `json:"raw"`
	Num      json.Number          `json:"num"`
	Tags     []string             `json:"tags,omitempty"`
	Attrs    map[string]any       `json:"attrs"`
	ByColor  map[fzColor]int      `json:"by_color"`
	ByNumber map[int]string       `json:"by_number"`
	ByUint   map[uint8]bool       `json:"by_uint"`
	Color    fzColor              `json:"color"`
	Note     *string              `json:"note"`
	Blob     []byte               `json:"blob"`
	Pair     [2]int               `json:"pair"`
	Any      any                  `json:"any"`
	Nested   *fzLine              `json:"nested"`
	Lines    []fzLine             `json:"lines"`
	Opt      map[string]*fzLine   `json:"opt,omitempty"`
	Deep     map[string][]*fzLine `json:"deep"`
	Untagged string
	Renamed  map[string]json.Number `json:"renamed"`
	//lint:ignore U1000 an unexported field is never set from JSON: both decoders must leave it
	hidden string
}

// fzFloat32s holds float32s, which go-json parses as float64s first;
// fzFloat64s is its twin with float64s, to tell a float32 rounding or range
// apart from the rest of the payload (fuzzKnown).
type fzFloat32s struct {
	F32  float32 `json:"f32"`
	SF32 float32 `json:"sf32,string"`
	Fs   []float32
	M    map[string]float32 `json:"m"`
	P    *float32           `json:"p"`
}

type fzFloat64s struct {
	F32  float64 `json:"f32"`
	SF32 float64 `json:"sf32,string"`
	Fs   []float64
	M    map[string]float64 `json:"m"`
	P    *float64           `json:"p"`
}

type fzNumbers struct {
	I8   int8             `json:"i8"`
	U8   uint8            `json:"u8"`
	I16  int16            `json:"i16"`
	U16  uint16           `json:"u16"`
	I32  int32            `json:"i32"`
	U32  uint32           `json:"u32"`
	I64  int64            `json:"i64"`
	U64  uint64           `json:"u64"`
	I    int              `json:"i"`
	U    uint             `json:"u"`
	F64  float64          `json:"f64"`
	PF   *float64         `json:"pf"`
	PI   *int             `json:"pi"`
	S8   int8             `json:"s8,string"`
	SU64 uint64           `json:"su64,string"`
	All  []int64          `json:"all"`
	Keys map[int64]uint16 `json:"keys"`
	Big  map[uint64]int8  `json:"big"`
}

// fzEvent embeds structs whose fields collide: the shallower field wins,
// two at one depth cancel out unless one is tagged.
type fzEvent struct {
	fzHeader
	*fzMeta
	Name  string          `json:"name"`
	Data  json.RawMessage `json:"data"`
	Items []any           `json:"items"`
}

type fzHeader struct {
	Name    string `json:"name"` // hidden by fzEvent.Name
	Version int    `json:"version"`
	Source  string
	Trace   string `json:"trace"`
}

// fzMeta is an embedded pointer to an unexported struct: encoding/json
// reports an error when a payload sets one of its fields.
type fzMeta struct {
	Source string // collides with fzHeader.Source at one depth: neither
	Trace  string // collides with the tagged fzHeader.Trace: that one wins
	Region string `json:"region"`
}

type fzStrings struct {
	A  string            `json:"a"`
	B  *string           `json:"b"`
	C  []string          `json:"c"`
	M  map[string]string `json:"m"`
	K  string            `json:"k"` // "K" (the Kelvin sign) folds to it in encoding/json
	SS string            `json:"ss"`
	Ü  string            // a non-ASCII name
}

// fuzzDiverges decodes data into a fresh value of tg's type with both
// decoders and describes how the outcomes differ ("" when they agree), and
// names the known divergence it is (fuzzKnown), if any.
func fuzzDiverges(tg fuzzTarget, data []byte) (diff, known string) {
	want, got := tg.new(), tg.new()
	wantErr := fuzzUnmarshal(StandardJSON{}, data, want)
	gotErr := fuzzUnmarshal(FastJSON{}, data, got)
	switch {
	case (wantErr == nil) != (gotErr == nil):
		diff = fmt.Sprintf("encoding/json error %v, FastJSON error %v (decoded %s)", wantErr, gotErr, fuzzShow(want, got))
	case wantErr == nil && !fuzzEqual(reflect.ValueOf(want), reflect.ValueOf(got)):
		diff = "decoded differently: " + fuzzShow(want, got)
	default:
		return "", ""
	}
	return diff, fuzzKnown(tg, data, wantErr, gotErr)
}

// fuzzKnown names the divergence of FastJSON from encoding/json that
// decision 0086 lists (and FastJSON's comment), or "" for a new one:
//   - "float32": go-json parses a number into a float32 as a float64 and then
//     narrows it, so it rounds twice and rejects numbers that round to
//     math.MaxFloat32 (json.Marshal writes it as 3.4028235e+38). Known when
//     the same payload decodes alike into fzFloat64s, the float64 twin.
//   - "string-nan": a float field with the string option takes "NaN", "Inf"
//     and the like, which encoding/json rejects as not a JSON number.
//   - "string-plus-sign": a number field with the string option takes a
//     leading plus sign ("+0"), which encoding/json rejects as not a JSON
//     number; json.Marshal never writes one.
//   - "string-quote-escape": a string field with the string option holds a
//     quoted string whose escapes encoding/json unquotes without its
//     scanner, so it takes \' (an apostrophe) there, which go-json and
//     JSON reject. Known when the payload without those escapes decodes
//     alike; json.Marshal never writes one.
func fuzzKnown(tg fuzzTarget, data []byte, wantErr, gotErr error) string {
	if wantErr == nil && gotErr != nil && bytes.Contains(data, []byte(`\\'`)) {
		if d, _ := fuzzDiverges(tg, bytes.ReplaceAll(data, []byte(`\\'`), []byte(`'`))); d == "" {
			return "string-quote-escape"
		}
	}
	if tg.name == "fzFloat32s" {
		if d, _ := fuzzDiverges(fuzzTarget{"fzFloat64s", func() any { return new(fzFloat64s) }}, data); d == "" {
			return "float32"
		}
	}
	const prefix = "json: invalid use of ,string struct tag, trying to unmarshal "
	if wantErr != nil && gotErr == nil && strings.HasPrefix(wantErr.Error(), prefix) {
		quoted, into, _ := strings.Cut(strings.TrimPrefix(wantErr.Error(), prefix), " into ")
		s, err := strconv.Unquote(quoted)
		f, perr := strconv.ParseFloat(s, 64)
		if err == nil && perr == nil && (math.IsNaN(f) || math.IsInf(f, 0)) && strings.HasPrefix(into, "float") &&
			!strings.ContainsAny(s, "0123456789") {
			return "string-nan"
		}
		if err == nil && strings.HasPrefix(s, "+") {
			if _, perr := strconv.ParseFloat(s[1:], 64); perr == nil && !strings.HasPrefix(s[1:], "-") {
				return "string-plus-sign"
			}
		}
	}
	return ""
}

// fuzzUnmarshal is the Decoder's Unmarshal on a copy of data, which it then
// overwrites, as a claim's recycled buffer is (slabsFor: a value that kept
// a slice of its input would change), with a panic reported as an error
// that no decoder returns.
func fuzzUnmarshal(d Decoder, data []byte, v any) (err error) {
	buf := append([]byte(nil), data...)
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v", p)
		}
		for i := range buf {
			buf[i] = '#'
		}
	}()
	return d.Unmarshal(buf, v)
}

func fuzzShow(want, got any) string {
	return fmt.Sprintf("\nencoding/json %s\nFastJSON      %s", fuzzDump(reflect.ValueOf(want)), fuzzDump(reflect.ValueOf(got)))
}

// fuzzDump prints a value with its floats' bits, its strings quoted and
// its nil slices and maps apart from empty ones.
func fuzzDump(v reflect.Value) string {
	switch v.Kind() {
	case reflect.Invalid:
		return "<invalid>"
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			return "nil"
		}
		return "&" + fuzzDump(v.Elem())
	case reflect.Struct:
		var b strings.Builder
		b.WriteString("{")
		for i := range v.NumField() {
			if i > 0 {
				b.WriteString(" ")
			}
			b.WriteString(v.Type().Field(i).Name + ":" + fuzzDump(v.Field(i)))
		}
		return b.String() + "}"
	case reflect.Map:
		if v.IsNil() {
			return "map(nil)"
		}
		var parts []string
		for it := v.MapRange(); it.Next(); {
			parts = append(parts, fuzzDump(it.Key())+":"+fuzzDump(it.Value()))
		}
		slices.Sort(parts)
		return "map[" + strings.Join(parts, " ") + "]"
	case reflect.Slice, reflect.Array:
		if v.Kind() == reflect.Slice && v.IsNil() {
			return "slice(nil)"
		}
		var parts []string
		for i := range v.Len() {
			parts = append(parts, fuzzDump(v.Index(i)))
		}
		return "[" + strings.Join(parts, " ") + "]"
	case reflect.String:
		return strconv.Quote(v.String())
	case reflect.Float32, reflect.Float64:
		return fmt.Sprintf("%v(%#x)", v.Float(), math.Float64bits(v.Float()))
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return strconv.FormatInt(v.Int(), 10)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return strconv.FormatUint(v.Uint(), 10)
	case reflect.Bool:
		return strconv.FormatBool(v.Bool())
	}
	return v.Kind().String()
}

// fuzzEqual is reflect.DeepEqual but for floats, compared bit for bit (-0 is
// not 0, and a NaN equals itself), and unexported fields, read without
// Interface.
func fuzzEqual(a, b reflect.Value) bool {
	if a.IsValid() != b.IsValid() {
		return false
	}
	if !a.IsValid() {
		return true
	}
	if a.Type() != b.Type() {
		return false
	}
	switch a.Kind() {
	case reflect.Pointer, reflect.Interface:
		if a.IsNil() || b.IsNil() {
			return a.IsNil() == b.IsNil()
		}
		return fuzzEqual(a.Elem(), b.Elem())
	case reflect.Struct:
		for i := range a.NumField() {
			if !fuzzEqual(a.Field(i), b.Field(i)) {
				return false
			}
		}
		return true
	case reflect.Map:
		if a.IsNil() != b.IsNil() || a.Len() != b.Len() {
			return false
		}
		for it := a.MapRange(); it.Next(); {
			bv := b.MapIndex(it.Key())
			if !bv.IsValid() || !fuzzEqual(it.Value(), bv) {
				return false
			}
		}
		return true
	case reflect.Slice:
		if a.IsNil() != b.IsNil() {
			return false
		}
		fallthrough
	case reflect.Array:
		if a.Len() != b.Len() {
			return false
		}
		for i := range a.Len() {
			if !fuzzEqual(a.Index(i), b.Index(i)) {
				return false
			}
		}
		return true
	case reflect.Float32, reflect.Float64:
		return math.Float64bits(a.Float()) == math.Float64bits(b.Float())
	case reflect.String:
		return a.String() == b.String()
	case reflect.Bool:
		return a.Bool() == b.Bool()
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return a.Int() == b.Int()
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return a.Uint() == b.Uint()
	}
	panic("fuzzEqual: unexpected kind " + a.Kind().String())
}

// fuzzSeeds are the shapes users write, a payload per rule, beyond
// decodeCorpus (which the target decodes too).
var fuzzSeeds = []string{
	// Tags, "-", omitempty, the string option, untagged and unexported names.
	`{"customer":"Ann","Skip":"no","-":"no","qty":"3","paid":"true","rate":"1.5","ref":"42","code":"\"x\"","Untagged":"u","hidden":"h"}`,
	`{"qty":3}`, `{"qty":"x"}`, `{"qty":""}`, `{"qty":"null"}`, `{"qty":null}`, `{"qty":" 3"}`, `{"qty":"3 "}`, `{"qty":"0x10"}`,
	`{"paid":"1"}`, `{"paid":true}`, `{"paid":"null"}`, `{"rate":"NaN"}`, `{"rate":"Inf"}`, `{"rate":"-Infinity"}`, `{"rate":"1e400"}`,
	`{"rate":"1_000"}`, `{"rate":"0x1p-2"}`, `{"ref":"null"}`, `{"ref":null}`, `{"ref":"-0"}`, `{"code":"x"}`, `{"code":"\"\\u00e9\""}`,
	`{"code":"null"}`, `{"code":"\"a\" "}`, `{"tags":[]}`, `{"tags":null}`, `{"opt":{}}`,
	// Embedded structs and pointers, and their collisions.
	`{"id":7,"created":"2026-12-02T05:37:01.123456789+01:00","carrier":"DHL","days":2}`, `{"carrier":null}`, `{"days":1.0}`,
	`{"name":"n","version":2,"Source":"s","trace":"t","Trace":"T","region":"eu"}`, `{"region":"eu"}`, `{"Region":null}`,
	`{"source":"x"}`, `{"created":"2026-02-30T00:00:00Z"}`, `{"created":"2026-12-02T05:37:01Z "}`, `{"created":null}`, `{"created":1}`,
	// Pointers, maps with string, int and text keys, interfaces.
	`{"note":"n","nested":{"sku":"a","qty":1},"seen_ptr":null,"ref":"7"}`, `{"nested":{}}`, `{"nested":[]}`,
	`{"by_number":{"1":"a","-2":"b","+3":"c","04":"d"," 5":"e","9223372036854775808":"f"}}`, `{"by_number":{"1.0":"x"}}`,
	`{"by_uint":{"255":true,"256":false}}`, `{"by_uint":{"-1":true}}`, `{"by_color":{"red":1,"":2}}`, `{"by_color":{"blue":1}}`,
	`{"attrs":{"a":1,"b":[1,2.5,"x",null,true,{"c":{}}],"c":1e308,"d":-0,"e":12345678901234567891234}}`,
	`{"any":[],"attrs":null}`, `{"deep":{"a":[null,{"sku":"s"}],"b":null}}`, `{"renamed":{"a":1e3,"b":-0.0}}`, `{"renamed":{"a":"1"}}`,
	`{"1":{"sku":"x"},"-1":{"qty":2}}`, `[{"sku":"a"},null,{"qty":"2"}]`, `{"a":{"b":{"c":[[[[]]]]}}}`, `null`, `true`, `"s"`, `0`,
	// RawMessage, json.Number, Unmarshaler, TextUnmarshaler.
	`{"raw":  [1, 2 ,{"a" : "b"}] ,"num":1.5e3,"seen":  {"k": [1, 2]}  ,"total":"12.34","color":"red","data":"\u00e9"}`,
	`{"raw":null}`, `{"num":"12"}`, `{"num":"x"}`, `{"num":"1.5e3"}`, `{"num":null}`, `{"num":-0}`, `{"num":true}`,
	`{"seen":null,"seen_ptr":null}`, `{"seen":"\u0041\ud83d\ude00"}`, `{"seen":1e400}`, `{"seen_ptr":[ ]}`,
	`{"total":1999}`, `{"total":"abc"}`, `{"total":null}`, `{"total":19.99}`, `{"color":"green"}`, `{"color":3}`, `{"color":null}`,
	`{"color":""}`, `{"color":"\u0072ed"}`, `{"blob":"aGVsbG8="}`, `{"blob":"aGVsbG8"}`, `{"blob":null}`, `{"blob":[1,2]}`, `{"blob":"a\/b="}`,
	`{"pair":[1]}`, `{"pair":[1,2,3]}`, `{"pair":null}`,
	// Unknown, duplicate and case-folded fields.
	`{"customer":"a","extra":{"deep":[1,{"x":null}]},"more":null}`, `{"customer":"first","customer":"second"}`,
	`{"customer":"a","CUSTOMER":"b","Customer":null}`, `{"CusTomer":"c"}`, `{"cust\u006fmer":"esc"}`, `{"customer\u0000":"nul"}`,
	`{"k":"kelvin","\u212a":"K"}`, `{"\u212a":"only"}`, `{"ſs":"long s"}`, `{"SS":"x","ß":"y"}`, `{"ü":"lower","Ü":"upper"}`,
	`{"a":"1","a":2}`, `{"tags":["a"],"tags":null}`, `{"nested":{"sku":"a"},"nested":{"qty":1}}`, `{"attrs":{"a":1},"attrs":{"b":2}}`,
	// Strings: escapes, invalid UTF-8, lone surrogates, control characters.
	`{"a":"\"\\\/\b\f\n\r\t\u0000\u001f\u007f\u2028\u2029"}`, `{"a":"\ud800"}`, `{"a":"\udc00\ud800x"}`, `{"a":"\ud83d\ude00\ud83d"}`,
	`{"a":"\uD83D\uDE00"}`, `{"a":"\u00"}`, `{"a":"\x"}`, `{"a":"tab	in"}`, "{\"a\":\"\xff\xfe\"}", "{\"a\":\"\xc3\x28\"}",
	"{\"a\":\"\xed\xa0\x80\"}", "{\"a\":\"\xf4\x90\x80\x80\"}", "{\"c\":[\"\xe2\x82\"],\"m\":{\"\xff\":\"\xfe\"}}",
	"{\"\xffcustomer\":1}", "{\"customer\":\"\xe2\x82\xac\"}", `{"b":"x","m":{"a":"b","a":"c"}}`, `{"m":{"":""}}`,
	// Numbers at the edges.
	`{"i8":127,"u8":255,"i16":-32768,"u16":65535,"i32":2147483647,"u32":4294967295,"i64":9223372036854775807,"u64":18446744073709551615}`,
	`{"i8":128}`, `{"i8":-129}`, `{"u8":256}`, `{"u8":-1}`, `{"u8":-0}`, `{"i64":9223372036854775808}`, `{"i64":-9223372036854775808}`,
	`{"i64":-9223372036854775809}`, `{"u64":18446744073709551616}`, `{"u64":-1}`, `{"i":1e2}`, `{"i":1.0}`, `{"i":1E+2}`, `{"i":-0}`,
	`{"i":00}`, `{"i":01}`, `{"i":-01}`, `{"i":+1}`, `{"i":.5}`, `{"i":1.}`, `{"i":1e}`, `{"i":0x10}`, `{"i":1_000}`, `{"i":-}`,
	`{"f32":3.4028235e38}`, `{"f32":3.5e38}`, `{"f32":1e-46}`, `{"f32":-0}`, `{"f32":16777217}`, `{"f32":1.00000005960464477550}`,
	`{"f64":1.7976931348623157e308}`, `{"f64":1.8e308}`, `{"f64":4.9e-324}`, `{"f64":2e-324}`, `{"f64":-0.0}`, `{"f64":0e0}`,
	`{"f64":1e-400}`, `{"f64":123456789012345678901234567890}`, `{"f64":0.1e1}`, `{"f64":NaN}`, `{"f64":Infinity}`, `{"f64":"1"}`,
	`{"pf":null,"pi":null}`, `{"pf":-0,"pi":-0}`, `{"pi":1e0}`, `{"s8":"-128","su64":"18446744073709551615","sf32":"3.4e38"}`,
	`{"s8":"128"}`, `{"su64":"-1"}`, `{"sf32":"1e39"}`, `{"sf32":"NaN"}`, `{"sf32":"-0"}`, `{"s8":"1e1"}`, `{"s8":" 1"}`,
	`{"all":[0,-0,1e0,9223372036854775807,-9223372036854775808]}`, `{"all":[1.5]}`, `{"Fs":[1e38,-1e-38,3.4028235677973366e38]}`,
	`{"keys":{"-9223372036854775808":65535}}`, `{"keys":{"1":65536}}`, `{"big":{"18446744073709551615":-128}}`, `{"big":{"-1":0}}`,
	`{"f64":1e999999999999}`, `{"f64":-1e-999999999999}`, `{"u64":1e19}`, `{"i64":9.223372036854775807e18}`,
	// Syntax: whitespace, truncation, trailing data, nesting, non-objects.
	" \t\r\n{ \"customer\" : \"w\" }\r\n ", `{"customer":"a",}`, `{,}`, `{"a" "b"}`, `{"a":1 "b":2}`, `[1,2,]`, `[`, `{"a":[}`,
	`{"a":1}{"a":2}`, `{"a":1} `, `{"a":1} x`, "{\"a\":1}\x00", "\xef\xbb\xbf{}", `{'a':1}`, `{a:1}`, `{"a":tru}`, `{"a":nul}`,
	`{"a":True}`, "{\"a\":\"b\"\x00}", `[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]`,
	`{"items":[{"a":[{"b":[{"c":1}]}]}],"data":{}}`, ``, ` `, `nul`, `"`, `{"`,
}

// TestFastJSONDecodeDivergences pins each divergence of FastJSON from
// encoding/json that decision 0086 lists, with the class fuzzKnown gives it
// (the fuzz target lets those pass and no other). When go-json changes and a
// case stops diverging, update the decision and FastJSON's comment.
func TestFastJSONDecodeDivergences(t *testing.T) {
	maxF32, err := json.Marshal(fzFloat32s{F32: math.MaxFloat32})
	if err != nil {
		t.Fatal(err)
	}
	// 1 + 2^-24, a float64 exactly halfway between two float32s: its
	// shortest text is a little above, so encoding/json rounds it up.
	halfway, err := json.Marshal(map[string]float64{"f32": 1 + 0x1p-24})
	if err != nil {
		t.Fatal(err)
	}
	f32s := fuzzTarget{"fzFloat32s", func() any { return new(fzFloat32s) }}
	f64s := fuzzTarget{"fzFloat64s", func() any { return new(fzFloat64s) }}
	for _, c := range []struct {
		name                  string
		into                  fuzzTarget
		payload, field, known string
		want, got             any // the value decoded into field, or an error's text
	}{
		{"json.Marshal's math.MaxFloat32 is out of range", f32s, string(maxF32), "F32", "float32",
			math.MaxFloat32, "json: cannot unmarshal number 3.4028235e+38 into Go struct field fzFloat32s.f32 of type float32"},
		{"a float32 rounded twice", f32s, string(halfway), "F32", "float32", 1 + 0x1p-23, 1.0},
		{"NaN in a string float", f32s, `{"sf32":"NaN"}`, "SF32", "string-nan",
			`json: invalid use of ,string struct tag, trying to unmarshal "NaN" into float32`, math.NaN()},
		{"Inf in a string float", f64s, `{"sf32":"Infinity"}`, "SF32", "string-nan",
			`json: invalid use of ,string struct tag, trying to unmarshal "Infinity" into float64`, math.Inf(1)},
	} {
		t.Run(c.name, func(t *testing.T) {
			diff, known := fuzzDiverges(c.into, []byte(c.payload))
			if diff == "" || known != c.known {
				t.Fatalf("payload %s: divergence %q, known as %q, want known as %q", c.payload, diff, known, c.known)
			}
			for _, d := range []struct {
				dec  Decoder
				want any
			}{{StandardJSON{}, c.want}, {FastJSON{}, c.got}} {
				v := c.into.new()
				err := d.dec.Unmarshal([]byte(c.payload), v)
				got := reflect.ValueOf(v).Elem().FieldByName(c.field).Float()
				switch w := d.want.(type) {
				case string:
					if err == nil || err.Error() != w {
						t.Errorf("%T: error %v, want %s", d.dec, err, w)
					}
				case float64:
					if err != nil || math.IsNaN(w) != math.IsNaN(got) || !math.IsNaN(w) && got != w {
						t.Errorf("%T: %v (error %v), want %v", d.dec, got, err, w)
					}
				}
			}
		})
	}

	// A string field with the string option: encoding/json unquotes \' in
	// the inner string, go-json refuses it.
	const quoteEscape = `{"code":"\"\\'\""}`
	if diff, known := fuzzDiverges(fuzzTarget{"fzOrder", func() any { return new(fzOrder) }}, []byte(quoteEscape)); diff == "" || known != "string-quote-escape" {
		t.Errorf("payload %s: divergence %q, known as %q, want known as string-quote-escape", quoteEscape, diff, known)
	}
	var want fzOrder
	if err := (StandardJSON{}).Unmarshal([]byte(quoteEscape), &want); err != nil || want.Code != "'" {
		t.Errorf("encoding/json: code %q (error %v), want an apostrophe", want.Code, err)
	}
	if err := (FastJSON{}).Unmarshal([]byte(quoteEscape), new(fzOrder)); err == nil {
		t.Errorf("FastJSON decoded %s: the divergence is gone; update decision 0086 and fuzzKnown", quoteEscape)
	}

	// A number field with the string option: go-json takes a leading plus.
	const plus = `{"s8":"+7"}`
	nums := fuzzTarget{"fzNumbers", func() any { return new(fzNumbers) }}
	if diff, known := fuzzDiverges(nums, []byte(plus)); diff == "" || known != "string-plus-sign" {
		t.Errorf("payload %s: divergence %q, known as %q, want known as string-plus-sign", plus, diff, known)
	}
	var withPlus fzNumbers
	if err := (FastJSON{}).Unmarshal([]byte(plus), &withPlus); err != nil || withPlus.S8 != 7 {
		t.Errorf("FastJSON: s8 %d (error %v), want 7: the divergence is gone; update decision 0086 and fuzzKnown", withPlus.S8, err)
	}

	// A dead letter names the field of a type mismatch; FastJSON names a
	// field of an embedded struct without the struct, and none when the
	// mismatch is inside a json.Unmarshaler.
	for _, c := range []struct{ payload, want, got string }{
		{`{"days":1.5}`, "FzShipping.days", "days"},
		{`{"total":19.99}`, "total", ""},
	} {
		var want, got fzOrder
		var wt, gt *json.UnmarshalTypeError
		if !errors.As(StandardJSON{}.Unmarshal([]byte(c.payload), &want), &wt) || !errors.As(FastJSON{}.Unmarshal([]byte(c.payload), &got), &gt) ||
			wt.Field != c.want || gt.Field != c.got {
			t.Errorf("payload %s: the field named: encoding/json %v, FastJSON %v; want %q and %q", c.payload, wt, gt, c.want, c.got)
		}
	}
}

// TestTheDefaultDecoderIsEncodingJSON: FastJSON does not decode exactly like
// encoding/json (TestFastJSONDecodeDivergences), so it is opt-in.
func TestTheDefaultDecoderIsEncodingJSON(t *testing.T) {
	if d := (&ClientConfig{}).withDefaults().Decoder; d != (StandardJSON{}) {
		t.Fatalf("the default Decoder is %T, want StandardJSON", d)
	}
}
