package store

import (
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// The rendered-statement cache stays within its bound however many streams
// pass through it: the entries looked up lately stay (the same value), the
// idle ones go, and one that went is rendered again when next looked up.
func TestTheRenderedCacheIsBoundedAndKeepsWhatIsUsed(t *testing.T) {
	c := renderCache{max: 8}
	renders := map[string]int{}
	get := func(key string) *rendered {
		return c.get(key, func() *rendered { renders[key]++; return &rendered{texts: []string{key}} })
	}
	hot := get("hot")
	for i := range 100 {
		get(fmt.Sprintf("cold-%d", i))
		require.Same(t, hot, get("hot"), "a stream in use keeps its entry (after %d others)", i+1)
		require.LessOrEqual(t, c.len(), c.max)
	}
	require.Equal(t, 1, renders["hot"])
	require.Equal(t, []string{"cold-0"}, get("cold-0").texts, "an evicted entry is rendered again")
	require.Equal(t, 2, renders["cold-0"])

	n := c.len()
	c.drop("hot")
	require.Equal(t, n-1, c.len())
	get("hot")
	require.Equal(t, 2, renders["hot"], "a dropped entry is rendered again")
}

// Every entry looked up lately still leaves room: the sweep's second pass
// takes marked entries when the first freed too few.
func TestTheRenderedCacheEvictsWhenEveryEntryWasUsed(t *testing.T) {
	c := renderCache{max: 4}
	var keys []string
	for i := range 20 {
		k := fmt.Sprint(i)
		keys = append(keys, k)
		for _, k := range keys { // every entry looked up before each insert
			c.get(k, func() *rendered { return &rendered{} })
		}
		require.LessOrEqual(t, c.len(), c.max)
	}
}

// A stream's statements rendered again are the texts and names it had:
// the prepared statements a connection holds stay valid after an eviction.
func TestAStreamRenderedAgainHasTheSameStatements(t *testing.T) {
	st := &Store{schema: "render_test", s: `"render_test"`}
	first := st.stream(42)
	texts, names := slices.Clone(first.texts), slices.Clone(first.names)
	renderedCache.drop(renderKey(st.schema, 42))
	again := st.stream(42)
	require.NotSame(t, first, again)
	require.Equal(t, texts, again.texts)
	require.Equal(t, names, again.names)
}
