package topic_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/c1702965/sqlstreams/internal/topic"
	"github.com/stretchr/testify/require"
)

// refMatch is deliberately the naive recursive definition of AMQP topic
// matching: obviously correct, exponential in the worst case, and therefore
// only fit for short inputs as an oracle.
func refMatch(p, k []string) bool {
	if len(p) == 0 {
		return len(k) == 0
	}
	switch p[0] {
	case "#":
		return refMatch(p[1:], k) || (len(k) > 0 && refMatch(p, k[1:]))
	case "*":
		return len(k) > 0 && refMatch(p[1:], k[1:])
	default:
		return len(k) > 0 && k[0] == p[0] && refMatch(p[1:], k[1:])
	}
}

func refMatchStrings(pattern, key string) bool {
	if key == "" {
		return false
	}
	return refMatch(strings.Split(pattern, "."), strings.Split(key, "."))
}

func TestErrorMessages(t *testing.T) {
	cases := []struct {
		pattern bool
		value   string
		want    string
	}{
		{true, "a..b", `invalid binding pattern "a..b": empty word at position 2`},
		{true, ".a", `invalid binding pattern ".a": empty word at position 1`},
		{true, "a.", `invalid binding pattern "a.": empty word at position 2`},
		{true, "", `invalid binding pattern "": empty pattern`},
		{true, "a.*x", `invalid binding pattern "a.*x": wildcard '*' inside word "*x" at position 2`},
		{true, "a b", `invalid binding pattern "a b": invalid character ' ' in word "a b" at position 1`},
		{true, "a.é", `invalid character 'é' in word "é" at position 2`},
		{true, "a.\xff", `invalid byte 0xff in word "\xff" at position 2`},
		{false, "a.#", `invalid routing key "a.#": wildcard "#" at position 2 is not allowed in a routing key`},
		{false, "a*", `invalid routing key "a*": wildcard '*' in word "a*" at position 1 is not allowed`},
		{false, "a..b", `invalid routing key "a..b": empty word at position 2`},
		{false, "a.$", `invalid character '$' in word "$" at position 2`},
	}
	for _, c := range cases {
		var err error
		if c.pattern {
			err = topic.ValidatePattern(c.value)
			require.ErrorIs(t, err, topic.ErrInvalidPattern, "%q", c.value)
		} else {
			err = topic.ValidateRoutingKey(c.value)
			require.ErrorIs(t, err, topic.ErrInvalidRoutingKey, "%q", c.value)
		}
		require.Contains(t, err.Error(), c.want)
		require.Contains(t, err.Error(), strconv.Quote(c.value))
	}
}

func TestValid(t *testing.T) {
	for _, k := range []string{"", "a", "A.b-c.d_e.0", "orders-v2.created_at", "-._", strings.Repeat("a", topic.MaxLen)} {
		require.NoError(t, topic.ValidateRoutingKey(k), "%q", k)
		if k != "" {
			require.NoError(t, topic.ValidatePattern(k), "%q", k)
		}
	}
	for _, p := range []string{"*", "#", "#.#", "*.*", "a.*.#.c", "#.a.#", strings.Repeat("#.", 127) + "#"} {
		require.NoError(t, topic.ValidatePattern(p), "%q", p)
	}
}

func TestLengthLimit(t *testing.T) {
	long := strings.Repeat("a", topic.MaxLen+1)
	err := topic.ValidateRoutingKey(long)
	require.ErrorIs(t, err, topic.ErrInvalidRoutingKey)
	require.Contains(t, err.Error(), "256 bytes long, the limit is 255")
	err = topic.ValidatePattern(long)
	require.ErrorIs(t, err, topic.ErrInvalidPattern)
	require.Contains(t, err.Error(), strconv.Quote(long))
}

func TestMatchEdgeCases(t *testing.T) {
	cases := []struct {
		pattern, key string
		want         bool
	}{
		{"#", "", false},
		{"*", "", false},
		{"#.#.#", "a", true},
		{"#.#.#", "a.b.c.d", true},
		{"a.#.#.b", "a.b", true},
		{"a.#.b.#.c", "a.b.b.c", true},
		{"a.#.b.#.c", "a.c.b", false},
		{"#.a.#.a.#", "b.a.b", false},
		{"#.a.#.a.#", "a.a", true},
		{"*.*.#", "a", false},
		{"#.*.*", "a.b", true},
		{"a.b", "a.b.", false},
		{"abc", "ab", false},
		{"ab", "abc", false},
	}
	for _, c := range cases {
		require.Equal(t, c.want, topic.Match(c.pattern, c.key), "Match(%q, %q)", c.pattern, c.key)
		require.Equal(t, c.want, refMatchStrings(c.pattern, c.key), "reference Match(%q, %q)", c.pattern, c.key)
	}
}

func TestCompile(t *testing.T) {
	p, err := topic.Compile("a.#.#.b")
	require.NoError(t, err)
	require.Equal(t, "a.#.#.b", p.String())
	require.True(t, p.Match("a.b"))
	require.True(t, p.Match("a.x.y.b"))
	require.False(t, p.Match("a.x.y"))

	_, err = topic.Compile("a..b")
	require.ErrorIs(t, err, topic.ErrInvalidPattern)
}

func TestMatchAny(t *testing.T) {
	require.False(t, topic.MatchAny(nil, "a"))
	require.False(t, topic.MatchAny([]string{"#"}, ""))
	require.True(t, topic.MatchAny([]string{"x", "a.*"}, "a.b"))
	require.False(t, topic.MatchAny([]string{"x", "a.*"}, "a"))
	require.False(t, topic.MatchAny([]string{"a..b"}, "a..b"), "invalid patterns match nothing")
}

func TestSets(t *testing.T) {
	in := []string{"b", "a", "b", "#"}
	require.Equal(t, []string{"#", "a", "b"}, topic.NormalizeSet(in))
	require.Equal(t, []string{"b", "a", "b", "#"}, in, "input must not be modified")
	require.NotNil(t, topic.NormalizeSet(nil))
	require.Empty(t, topic.NormalizeSet(nil))

	require.True(t, topic.SameSet(nil, []string{}))
	require.True(t, topic.SameSet([]string{"a", "b"}, []string{"b", "a", "a"}))
	require.False(t, topic.SameSet([]string{"a"}, []string{"a", "b"}))
	require.False(t, topic.SameSet([]string{"a"}, nil))
	require.False(t, topic.SameSet([]string{"A"}, []string{"a"}), "patterns are case-sensitive")
}

func pathologicalPattern() string { return strings.Repeat("#.", 20) + "x" }

func manyWords(n int, last string) string {
	words := make([]string, n)
	for i := range words {
		words[i] = "w" + strconv.Itoa(i%10)
	}
	words[n-1] = last
	return strings.Join(words, ".")
}

// TestPathological only has to finish: a backtracking matcher would take
// exponential time here, and the test binary's timeout is the assertion.
func TestPathological(t *testing.T) {
	p := pathologicalPattern()
	require.True(t, topic.Match(p, manyWords(200, "x")))
	require.False(t, topic.Match(p, manyWords(200, "y")))

	// "#" separated by literals cannot be collapsed away, so this exercises
	// the matcher's restart bound rather than the "#.#" collapse.
	interleaved := strings.Repeat("#.a.", 20) + "#.x"
	allA := strings.Repeat("a.", 199) + "a"
	require.False(t, topic.Match(interleaved, allA))
	require.True(t, topic.Match(interleaved, strings.Repeat("a.", 199)+"x"))
	require.True(t, topic.Match(strings.Repeat("*.#.", 30)+"x", manyWords(200, "x")))
}

// tokens turns arbitrary fuzz bytes into words from a tiny alphabet, so
// random input produces valid, frequently-matching patterns and keys rather
// than mostly-invalid strings.
func tokens(s string, alphabet []string, max int) []string {
	if len(s) > max {
		s = s[:max]
	}
	out := make([]string, len(s))
	for i := range len(s) {
		out[i] = alphabet[int(s[i])%len(alphabet)]
	}
	return out
}

func FuzzMatch(f *testing.F) {
	for _, s := range [][2]string{
		{"payments.#.eu", "payments.card.eu"},
		{"#.*.b", "a.b"},
		{"a.*.#.c", "a.b.x.y.c"},
		{"#", ""},
		{"a..b", "a.b"},
		{"\x00\x01\x02\x03", "\x00\x01\x00"},
		{"\x03\x02\x03\x00\x03", "\x01\x00\x01\x00"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, pattern, key string) {
		got := topic.Match(pattern, key)
		if err := topic.ValidatePattern(pattern); err != nil {
			require.False(t, got, "invalid pattern %q matched", pattern)
			require.Contains(t, err.Error(), strconv.Quote(pattern))
		} else if topic.ValidateRoutingKey(key) == nil &&
			strings.Count(pattern, ".") < 8 && strings.Count(key, ".") < 8 {
			require.Equal(t, refMatchStrings(pattern, key), got, "Match(%q, %q)", pattern, key)
		}
		if err := topic.ValidateRoutingKey(key); err != nil {
			require.Contains(t, err.Error(), strconv.Quote(key))
		}

		p := strings.Join(tokens(pattern, []string{"a", "b", "*", "#", "ab"}, 8), ".")
		k := strings.Join(tokens(key, []string{"a", "b", "ab"}, 8), ".")
		if p == "" {
			return
		}
		want := refMatchStrings(p, k)
		require.Equal(t, want, topic.Match(p, k), "Match(%q, %q)", p, k)
		cp, err := topic.Compile(p)
		require.NoError(t, err)
		require.Equal(t, want, cp.Match(k), "Compile(%q).Match(%q)", p, k)
	})
}

func BenchmarkMatch(b *testing.B) {
	key := "payments.card.eu.visa.gold"
	b.Run("compiled/literal", func(b *testing.B) {
		p, _ := topic.Compile("payments.card.eu.visa.gold")
		b.ReportAllocs()
		for b.Loop() {
			p.Match(key)
		}
	})
	b.Run("compiled/wildcards", func(b *testing.B) {
		p, _ := topic.Compile("payments.#.eu.*.gold")
		b.ReportAllocs()
		for b.Loop() {
			p.Match(key)
		}
	})
	b.Run("uncompiled/wildcards", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			topic.Match("payments.#.eu.*.gold", key)
		}
	})
	b.Run("compiled/pathological-200-words", func(b *testing.B) {
		p, _ := topic.Compile(pathologicalPattern())
		k := manyWords(200, "y")
		b.ReportAllocs()
		for b.Loop() {
			p.Match(k)
		}
	})
	b.Run("compiled/interleaved-200-words", func(b *testing.B) {
		p, _ := topic.Compile(strings.Repeat("#.a.", 20) + "#.x")
		k := strings.Repeat("a.", 199) + "a"
		b.ReportAllocs()
		for b.Loop() {
			p.Match(k)
		}
	})
}
