package store

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestWakePayloadListsDistinctRoutingKeys(t *testing.T) {
	w, err := ParseWake(WakePayloadOf(7, []NewMessage{{RoutingKey: "a.b"}, {}, {RoutingKey: "a.b"}, {RoutingKey: "c"}}))
	require.NoError(t, err)
	require.Equal(t, Wake{StreamID: 7, Known: true, Keys: []string{"a.b", "c"}}, w)

	w, err = ParseWake(WakePayloadOf(7, []NewMessage{{}}))
	require.NoError(t, err)
	require.Equal(t, Wake{StreamID: 7, Known: true}, w, "no routing keys at all: known, none listed")

	many := make([]NewMessage, 100)
	for i := range many {
		many[i].RoutingKey = fmt.Sprintf("key.number.%d.of.a.long.batch", i)
	}
	w, err = ParseWake(WakePayloadOf(7, many))
	require.NoError(t, err)
	require.Equal(t, Wake{StreamID: 7}, w, "too many keys to list: the stream only, which wakes every group")

	_, err = ParseWake("x;a")
	require.Error(t, err)
}
