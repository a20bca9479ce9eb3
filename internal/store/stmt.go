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
	// used: looked up since the cache's last eviction sweep looked at it.
	used atomic.Bool
}

// MaxRenderedStreams bounds the process's cache of rendered statements
// (renderedCache): one entry per (schema, stream) in use, about 55 KB each,
// so at most about 110 MB. A process's working set of streams fits (the
// scale benchmark's 1,000); past the bound, the entries looked up least
// lately go, and a stream whose entry went is rendered again (the same
// texts, so the same prepared statements) at its next lookup. Handles
// that hold an entry (a session's store.Group) keep it.
const MaxRenderedStreams = 2048

// renderedCache holds every stream's rendered statements, shared by every
// Store of the process: lookups take no lock; an insert past the bound
// evicts first.
var renderedCache = renderCache{max: MaxRenderedStreams}

// renderCache is a bounded map of rendered statements. Eviction is a clock
// sweep (second chance): an entry looked up again since it was made or the
// last sweep passed it is kept once more, so the streams in use stay and
// those idle (or looked up once) go.
type renderCache struct {
	m   sync.Map   // key → *rendered
	mu  sync.Mutex // inserts, deletes and sweeps
	n   int        // entries in m
	max int
}

// get returns key's entry, made by render (outside the lock) when missing.
func (c *renderCache) get(key string, render func() *rendered) *rendered {
	if v, ok := c.m.Load(key); ok {
		r := v.(*rendered)
		if !r.used.Load() { // a store only when it changes: lookups stay reads
			r.used.Store(true)
		}
		return r
	}
	r := render() // unmarked: an entry looked up once goes at the next sweep
	c.mu.Lock()
	defer c.mu.Unlock()
	if v, ok := c.m.Load(key); ok { // another caller rendered it first
		return v.(*rendered)
	}
	if c.n >= c.max {
		c.evict()
	}
	c.m.Store(key, r)
	c.n++
	return r
}

// evict frees an eighth of the bound (at least one entry), taking entries
// not looked up since the last sweep and clearing the mark of the others;
// a second pass takes marked ones if the first freed too few. Under c.mu.
func (c *renderCache) evict() {
	target := c.max - max(c.max/8, 1)
	for pass := 0; pass < 2 && c.n > target; pass++ {
		c.m.Range(func(k, v any) bool {
			if v.(*rendered).used.Swap(false) {
				return true // looked up lately: a second chance
			}
			c.m.Delete(k)
			c.n--
			return c.n > target
		})
	}
}

// drop forgets key's entry (its stream was destroyed).
func (c *renderCache) drop(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m.LoadAndDelete(key); ok {
		c.n--
	}
}

// len is the number of entries.
func (c *renderCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

func renderKey(schema string, streamID int64) string {
	return schema + "\x00" + strconv.FormatInt(streamID, 10)
}

// stream returns streamID's rendered statements.
func (st *Store) stream(streamID int64) *rendered {
	return renderedCache.get(renderKey(st.schema, streamID), func() *rendered {
		rep := strings.NewReplacer("{s}", st.s, "{t}", tablePrefix(streamID), "{id}", strconv.FormatInt(streamID, 10))
		r := &rendered{texts: make([]string, len(templates)), names: make([]string, len(templates))}
		for i, tmpl := range templates {
			r.texts[i] = rep.Replace(tmpl)
			r.names[i] = statementName(r.texts[i])
		}
		return r
	})
}

func (r *rendered) sql(s streamSQL) string  { return r.texts[s] }
func (r *rendered) name(s streamSQL) string { return r.names[s] }

// namedSQL is a statement's text and the name it is prepared under.
type namedSQL struct{ name, sql string }

func (r *rendered) named(s streamSQL) namedSQL { return namedSQL{name: r.names[s], sql: r.texts[s]} }

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
	// tx, if set, runs the group's statements (InTx).
	tx Querier
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
