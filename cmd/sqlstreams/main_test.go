package main

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestUsageAndBadCommands(t *testing.T) {
	var out bytes.Buffer
	require.Error(t, run(nil, &out))
	require.Contains(t, out.String(), "sqlstreams demo")
	out.Reset()
	require.ErrorContains(t, run([]string{"explode"}, &out), `unknown command "explode"`)
	require.NoError(t, run([]string{"help"}, &out))
	require.ErrorContains(t, run([]string{"demo", "-rate", "0"}, &out), "must be positive")
	t.Setenv("SQLSTREAMS_DATABASE_URL", "")
	require.ErrorContains(t, run([]string{"migrate"}, &out), "SQLSTREAMS_DATABASE_URL")
}
