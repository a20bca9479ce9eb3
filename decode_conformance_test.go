package sqlstreams

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The corpus's types: the shapes users write.

type confAddress struct {
	Street string `json:"street"`
	City   string `json:"city,omitempty"`
}

// ConfShipping is exported: encoding/json cannot allocate an embedded
// pointer to an unexported struct.
type ConfShipping struct {
	Carrier string `json:"carrier"`
	Days    int    `json:"days,omitempty"`
}

type confBase struct {
	ID      int64  `json:"id"`
	Created string `json:"created"`
}

type confCents int64

// UnmarshalJSON takes "12.34" (a string) or 1234 (a number of cents).
func (c *confCents) UnmarshalJSON(b []byte) error {
	s := string(b)
	if strings.HasPrefix(s, `"`) {
		var whole, frac int64
		if _, err := fmt.Sscanf(strings.Trim(s, `"`), "%d.%d", &whole, &frac); err != nil {
			return fmt.Errorf("cents: %w", err)
		}
		*c = confCents(whole*100 + frac)
		return nil
	}
	var n int64
	if err := json.Unmarshal(b, &n); err != nil {
		return err
	}
	*c = confCents(n)
	return nil
}

type confColor int

func (c *confColor) UnmarshalText(b []byte) error {
	switch string(b) {
	case "red":
		*c = 1
	case "green":
		*c = 2
	default:
		return errors.New("unknown color")
	}
	return nil
}

type confOrder struct {
	confBase
	*ConfShipping
	Customer string                  `json:"customer"`
	Skip     string                  `json:"-"`
	Qty      int                     `json:"qty,string"`
	Total    confCents               `json:"total"`
	Raw      json.RawMessage         `json:"raw"`
	Tags     []string                `json:"tags"`
	Attrs    map[string]any          `json:"attrs"`
	ByColor  map[confColor]int       `json:"by_color"`
	ByNumber map[int]string          `json:"by_number"`
	Color    confColor               `json:"color"`
	Note     *string                 `json:"note"`
	When     time.Time               `json:"when"`
	Blob     []byte                  `json:"blob"`
	Pair     [2]int                  `json:"pair"`
	Any      any                     `json:"any"`
	Nested   *confAddress            `json:"nested"`
	Lines    []confAddress           `json:"lines"`
	Ratio    float64                 `json:"ratio"`
	Small    int8                    `json:"small"`
	Flag     bool                    `json:"flag"`
	Opt      map[string]*confAddress `json:"opt,omitempty"`

	//lint:ignore SA5008 the tag "-," names the field "-": one of encoding/json's rules the corpus checks
	Dash string `json:"-,"`
	//lint:ignore U1000 an unexported field is never set from JSON: the corpus checks both decoders leave it
	unexported string
}

// decodeCorpus is one payload per rule, each decoded into a fresh value of
// its type. Payloads that must fail are in it too: both decoders must fail.
var decodeCorpus = []struct {
	name string
	new  func() any
	json string
}{
	{"full order", func() any { return new(confOrder) }, `{"id":7,"created":"2026-12-02","carrier":"DHL","days":2,"customer":"Ann",
"qty":"3","total":"12.34","raw":{"k":[1,2,{"x":null}]},"tags":["a","b"],"attrs":{"n":1.5,"big":12345678901234567890,"s":"x","l":[true,null]},
"by_color":{"red":1,"green":2},"by_number":{"1":"one","-2":"minus two"},"color":"green","note":"hi","when":"2026-12-02T05:37:01.123456789+01:00",
"blob":"aGVsbG8=","pair":[1,2],"any":{"a":[1,"2",3.5e3]},"nested":{"street":"S"},"lines":[{"street":"L1"},{"street":"L2","city":"C"}],
"ratio":-1.25e-3,"small":-128,"flag":true,"opt":{"a":{"street":"o"},"b":null}}`},
	{"case-insensitive names", func() any { return new(confOrder) }, `{"CUSTOMER":"Bo","Tags":["x"],"Id":9}`},
	{"unknown fields ignored", func() any { return new(confOrder) }, `{"customer":"C","extra":{"deep":[1,2,3]},"more":null}`},
	{"dash names", func() any { return new(confOrder) }, `{"Skip":"no","-":"yes"}`},
	{"null leaves zero values", func() any { return new(confOrder) }, `{"customer":null,"note":null,"nested":null,"tags":null,"total":null}`},
	{"number of cents", func() any { return new(confOrder) }, `{"total":1999}`},
	{"duplicate keys: last wins", func() any { return new(confOrder) }, `{"customer":"first","customer":"second"}`},
	{"unicode escapes", func() any { return new(confOrder) }, `{"customer":"caf\u00e9 \ud83d\ude00 \"q\" \\ \/ \n\t"}`},
	{"empty object", func() any { return new(confOrder) }, `{}`},
	{"top-level map", func() any { return new(map[string]int) }, `{"a":1,"b":-2}`},
	{"top-level slice", func() any { return new([]confAddress) }, `[{"street":"a"},{"city":"b"}]`},
	{"top-level any", func() any { return new(any) }, `[1,"a",{"b":[null,false]},2.5]`},
	{"raw message", func() any { return new(json.RawMessage) }, ` {"a": [1, 2]} `},
	{"array longer than its Go array", func() any { return new(confOrder) }, `{"pair":[1,2,3]}`},
	{"array shorter than its Go array", func() any { return new(confOrder) }, `{"pair":[5]}`},
	{"whitespace everywhere", func() any { return new(confOrder) }, " \n{ \"customer\" : \"w\" ,\t\"tags\" : [ \"t\" ] }\n "},
	// Failures: both must fail, with the same field for a type mismatch.
	{"string into int", func() any { return new(confOrder) }, `{"small":"x"}`},
	{"out of range int8", func() any { return new(confOrder) }, `{"small":300}`},
	{"float into int", func() any { return new(confOrder) }, `{"small":1.5}`},
	{"object into string", func() any { return new(confOrder) }, `{"customer":{"a":1}}`},
	{"number into nested string", func() any { return new(confOrder) }, `{"lines":[{"street":5}]}`},
	{"number into a map's string", func() any { return new(confOrder) }, `{"by_number":{"1":5}}`},
	{"bad map key", func() any { return new(confOrder) }, `{"by_number":{"x":"y"}}`},
	{"bad text map key", func() any { return new(confOrder) }, `{"by_color":{"blue":1}}`},
	{"bad unmarshaler input", func() any { return new(confOrder) }, `{"total":"abc"}`},
	{"bad text unmarshaler input", func() any { return new(confOrder) }, `{"color":"blue"}`},
	{"bad base64", func() any { return new(confOrder) }, `{"blob":"***"}`},
	{"bad time", func() any { return new(confOrder) }, `{"when":"yesterday"}`},
	{"truncated", func() any { return new(confOrder) }, `{"customer":"a"`},
	{"trailing garbage", func() any { return new(confOrder) }, `{"customer":"a"} x`},
	{"not json", func() any { return new(confOrder) }, `customer`},
	{"array into struct", func() any { return new(confOrder) }, `[1,2]`},
}

// TestFastJSONDecodesAsEncodingJSON decodes the corpus with both decoders and
// compares values and errors: FastJSON, opt-in, keeps encoding/json's rules
// on it (FuzzFastJSONDecodesAsEncodingJSON looks further, and decision 0086
// lists where it does not).
func TestFastJSONDecodesAsEncodingJSON(t *testing.T) {
	for _, c := range decodeCorpus {
		t.Run(c.name, func(t *testing.T) {
			want, got := c.new(), c.new()
			wantErr := StandardJSON{}.Unmarshal([]byte(c.json), want)
			gotErr := FastJSON{}.Unmarshal([]byte(c.json), got)
			if (wantErr == nil) != (gotErr == nil) {
				t.Fatalf("encoding/json error %v, FastJSON error %v", wantErr, gotErr)
			}
			var wt, gt *json.UnmarshalTypeError
			if errors.As(wantErr, &wt) {
				require.True(t, errors.As(gotErr, &gt), "FastJSON's error %v is not a *json.UnmarshalTypeError", gotErr)
				// The same field, or a path within it: go-json also names
				// the map key under a map field.
				require.True(t, gt.Field == wt.Field || strings.HasPrefix(gt.Field, wt.Field+"."),
					"the field a type mismatch names: encoding/json %q, FastJSON %q", wt.Field, gt.Field)
			}
			if wantErr == nil {
				require.True(t, reflect.DeepEqual(want, got), "decoded differently:\nencoding/json %#v\nFastJSON      %#v", want, got)
			}
		})
	}
}
