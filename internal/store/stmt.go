package store

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// streamSQL is a statement over one stream's tables, declared beside the
// function that runs it with perStream: {s} stands for the quoted schema,
// {t} for the stream's table prefix (stream_<id>), {id} for the stream id.
// Each is rendered once per stream: pgx caches prepared statements by text,
// so a stable text per stream is also a fast one.
type streamSQL int

// templates holds every perStream statement, in declaration order.
var templates []string

// perStream declares a per-stream statement.
func perStream(template string) streamSQL {
	templates = append(templates, template)
	return streamSQL(len(templates) - 1)
}

// rendered is every per-stream statement of one stream, rendered.
type rendered struct {
	texts []string
	names []string // prepared-statement names, by text (wire.go)
}

var renderedCache sync.Map // schema+"\x00"+streamID → *rendered

// stream returns streamID's rendered statements.
func (st *Store) stream(streamID int64) *rendered {
	key := st.schema + "\x00" + strconv.FormatInt(streamID, 10)
	if r, ok := renderedCache.Load(key); ok {
		return r.(*rendered)
	}
	rep := strings.NewReplacer("{s}", st.s, "{t}", tablePrefix(streamID), "{id}", strconv.FormatInt(streamID, 10))
	r := &rendered{texts: make([]string, len(templates)), names: make([]string, len(templates))}
	for i, tmpl := range templates {
		r.texts[i] = rep.Replace(tmpl)
		r.names[i] = statementName(r.texts[i])
	}
	actual, _ := renderedCache.LoadOrStore(key, r)
	return actual.(*rendered)
}

func (r *rendered) sql(s streamSQL) string  { return r.texts[s] }
func (r *rendered) name(s streamSQL) string { return r.names[s] }

// tablePrefix names a stream's tables by its numeric id, so any valid stream
// name maps to a short, quote-free identifier.
func tablePrefix(streamID int64) string { return fmt.Sprintf("stream_%d", streamID) }

// Group is one consumer group's handle on the store: the statements of the
// group's stream, with the stream and group ids every one of them needs.
type Group struct {
	st       *Store
	r        *rendered
	StreamID int64
	GroupID  int64
	lane     *lane // InLane's; nil: the pool
	// custom: the group's statements run with the connection's own
	// plan_cache_mode, not the lane's generic plans (the exception
	// claimer's: decision 0052).
	custom bool
	// answered, if set, counts the statements the database answered
	// (Counting).
	answered *atomic.Uint64
}

// Group returns the handle of group groupID of stream streamID.
func (st *Store) Group(streamID, groupID int64) Group {
	return Group{st: st, r: st.stream(streamID), StreamID: streamID, GroupID: groupID}
}

func (g Group) sql(s streamSQL) string { return g.r.sql(s) }

// StreamTable returns the schema-qualified, quoted name of one of a
// stream's tables ("log", "exception", "delivery", "binding", …), for the
// test-only statements of storetest.
func (st *Store) StreamTable(streamID int64, table string) string {
	return st.s + "." + tablePrefix(streamID) + "_" + table
}

// SharedTable returns the schema-qualified, quoted name of a shared table.
func (st *Store) SharedTable(table string) string { return st.s + "." + table }
