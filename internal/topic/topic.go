// Package topic implements routing keys and binding patterns with AMQP
// topic-exchange rules, because users already know those rules from RabbitMQ
// and a group's bindings should behave the way they expect.
//
// A routing key is a sequence of words separated by "."; a word is one or more
// ASCII letters, digits, '_' or '-'. A pattern uses the same words, except that
// a whole word may be "*" (exactly one word) or "#" (zero or more words).
// Matching is case-sensitive.
//
// It is part of the engine's inside, not an API for users.
package topic

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"
)

// MaxLen bounds routing keys and patterns, matching the AMQP short-string
// limit so values stay portable to and from RabbitMQ.
const MaxLen = 255

var (
	// ErrInvalidRoutingKey lets Produce callers tell a bad key from a
	// transport or database failure with errors.Is.
	ErrInvalidRoutingKey = errors.New("invalid routing key")
	// ErrInvalidPattern lets Register callers tell a bad binding from a
	// transport or database failure with errors.Is.
	ErrInvalidPattern = errors.New("invalid binding pattern")
)

// ValidateRoutingKey accepts the empty key because producing without a
// routing key is legitimate; such messages simply never match a binding.
func ValidateRoutingKey(key string) error {
	if key == "" {
		return nil
	}
	if reason := check(key, false); reason != "" {
		return fmt.Errorf("%w %q: %s", ErrInvalidRoutingKey, key, reason)
	}
	return nil
}

// ValidatePattern rejects the empty pattern, unlike ValidateRoutingKey,
// because an empty binding would silently match nothing; "#" is the way to
// say "everything with a routing key".
func ValidatePattern(p string) error {
	if p == "" {
		return fmt.Errorf("%w %q: empty pattern (use \"#\" to match every routing key)", ErrInvalidPattern, p)
	}
	if reason := check(p, true); reason != "" {
		return fmt.Errorf("%w %q: %s", ErrInvalidPattern, p, reason)
	}
	return nil
}

// check returns a human-readable reason s is invalid, or "" if it is valid.
// Positions are 1-based word indexes because that is how people count the
// words of "payments.card.eu".
func check(s string, wildcards bool) string {
	if len(s) > MaxLen {
		return fmt.Sprintf("%d bytes long, the limit is %d", len(s), MaxLen)
	}
	pos, start := 1, 0
	for i := 0; i <= len(s); i++ {
		if i < len(s) && s[i] != '.' {
			continue
		}
		if reason := checkWord(s[start:i], pos, wildcards); reason != "" {
			return reason
		}
		pos++
		start = i + 1
	}
	return ""
}

func checkWord(w string, pos int, wildcards bool) string {
	if w == "" {
		return fmt.Sprintf("empty word at position %d", pos)
	}
	if w == "*" || w == "#" {
		if wildcards {
			return ""
		}
		return fmt.Sprintf("wildcard %q at position %d is not allowed in a routing key", w, pos)
	}
	for j := 0; j < len(w); j++ {
		c := w[j]
		if isWordByte(c) {
			continue
		}
		if c == '*' || c == '#' {
			if wildcards {
				return fmt.Sprintf("wildcard %q inside word %q at position %d (a wildcard must be a whole word)", c, w, pos)
			}
			return fmt.Sprintf("wildcard %q in word %q at position %d is not allowed in a routing key", c, w, pos)
		}
		r, size := utf8.DecodeRuneInString(w[j:])
		if r == utf8.RuneError && size == 1 {
			return fmt.Sprintf("invalid byte 0x%02x in word %q at position %d (words are ASCII letters, digits, '_' and '-')", c, w, pos)
		}
		return fmt.Sprintf("invalid character %q in word %q at position %d (words are ASCII letters, digits, '_' and '-')", r, w, pos)
	}
	return ""
}

func isWordByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-'
}

type tokenKind uint8

const (
	literal  tokenKind = iota
	oneWord            // "*"
	anyWords           // "#"
)

type token struct {
	kind tokenKind
	lit  string // substring of the pattern, so compiling copies no bytes
}

// Pattern is a validated, pre-split binding so that matching many keys
// against one binding does no parsing and no allocation.
type Pattern struct {
	raw  string
	toks []token
}

// Compile validates once up front so the per-message path (Pattern.Match)
// never has to.
func Compile(p string) (*Pattern, error) {
	toks, err := parse(p, nil)
	if err != nil {
		return nil, err
	}
	return &Pattern{raw: p, toks: toks}, nil
}

// String returns the pattern as written, so logs and listings show what the
// user declared rather than the collapsed internal form.
func (p *Pattern) String() string { return p.raw }

// parse appends to dst so Match can hand it a stack buffer and stay
// allocation-free for ordinary patterns.
func parse(p string, dst []token) ([]token, error) {
	if err := ValidatePattern(p); err != nil {
		return nil, err
	}
	for w := range strings.SplitSeq(p, ".") {
		t := token{lit: w}
		switch w {
		case "*":
			t.kind = oneWord
		case "#":
			// "#.#" means the same as "#"; collapsing keeps the matcher's
			// work proportional to the pattern's meaningful length.
			if n := len(dst); n > 0 && dst[n-1].kind == anyWords {
				continue
			}
			t.kind = anyWords
		}
		dst = append(dst, t)
	}
	return dst, nil
}

// Match reports whether key is routed to this binding. The empty key never
// matches: a message produced without a routing key is not delivered to a
// group that has bindings.
//
// Key syntax is not re-validated here because Produce already did it; an
// invalid key gives a well-defined but unspecified answer.
func (p *Pattern) Match(key string) bool {
	return matchTokens(p.toks, key)
}

// matchTokens is glob matching over words ("#" is the star, "*" the single
// wildcard). It is the greedy algorithm that remembers only the most recent
// "#": when a later literal fails, that "#" absorbs one more word and matching
// resumes after it. Earlier "#"s never need revisiting, because anything they
// could absorb the latest "#" can absorb too, so the worst case is
// O(words(pattern) × words(key)) with no recursion and no allocation, instead
// of the exponential blow-up of naive backtracking.
func matchTokens(toks []token, key string) bool {
	if key == "" {
		return false
	}
	n := len(key)
	pi, ki := 0, 0 // ki is the byte offset of the current key word; ki > n once every word is consumed
	starPi, starKi := -1, 0
	for ki <= n {
		if pi < len(toks) && toks[pi].kind == anyWords {
			starPi, starKi = pi, ki
			pi++
			continue
		}
		end := wordEnd(key, ki)
		if pi < len(toks) {
			t := toks[pi]
			if t.kind == oneWord || key[ki:end] == t.lit {
				pi++
				ki = end + 1
				continue
			}
		}
		if starPi < 0 {
			return false
		}
		pi = starPi + 1
		starKi = wordEnd(key, starKi) + 1
		ki = starKi
	}
	for pi < len(toks) && toks[pi].kind == anyWords {
		pi++
	}
	return pi == len(toks)
}

func wordEnd(key string, start int) int {
	if i := strings.IndexByte(key[start:], '.'); i >= 0 {
		return start + i
	}
	return len(key)
}

// Match is the one-off form of Compile + Pattern.Match. An invalid pattern
// matches nothing, since it could never have been registered.
func Match(pattern, key string) bool {
	var buf [16]token
	toks, err := parse(pattern, buf[:0])
	if err != nil {
		return false
	}
	return matchTokens(toks, key)
}

// MatchAny is a plain "any of": an empty pattern list returns false. The
// stream-level rule that a group with no bindings receives everything
// (including messages without a routing key) belongs to the caller, which
// knows whether the list is a group's whole binding set.
func MatchAny(patterns []string, key string) bool {
	if key == "" {
		return false
	}
	for _, p := range patterns {
		if Match(p, key) {
			return true
		}
	}
	return false
}

// NormalizeSet gives a binding set one canonical form so declarations can be
// compared and stored deterministically. It compares text only (it does not
// rewrite "a.#.#" to "a.#") so stored bindings stay exactly as declared. The
// input is not modified, and the result is never nil so that it encodes as
// an empty array rather than NULL.
func NormalizeSet(patterns []string) []string {
	out := make([]string, len(patterns))
	copy(out, patterns)
	slices.Sort(out)
	return slices.Clip(slices.Compact(out))
}

// SameSet decides whether two declarations state the same binding set,
// which is what Register needs to choose between joining and waiting: order
// and repetition in a declaration carry no meaning.
func SameSet(a, b []string) bool {
	return slices.Equal(NormalizeSet(a), NormalizeSet(b))
}

// wordClass is one routing-key word in a POSIX regular expression.
const wordClass = `[A-Za-z0-9_-]+`

// Regex translates the pattern for the database, which matches it against
// '.' || routing_key: every word, wildcard or not, consumes its leading dot,
// so "#" can absorb zero words without leaving a dot behind. The expression
// has no back-references and no capturing groups, so PostgreSQL runs it as
// an automaton, linear in the key's length whatever the pattern.
func (p *Pattern) Regex() string {
	var b strings.Builder
	b.WriteString("^")
	for _, t := range p.toks {
		switch t.kind {
		case oneWord:
			b.WriteString(`\.` + wordClass)
		case anyWords:
			b.WriteString(`(?:\.` + wordClass + `)*`)
		default:
			b.WriteString(`\.` + t.lit) // literal words hold only [A-Za-z0-9_-]
		}
	}
	b.WriteString("$")
	return b.String()
}
