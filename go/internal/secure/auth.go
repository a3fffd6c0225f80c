package secure

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dfkv/dfkv/go/identity"
	"github.com/dfkv/dfkv/go/internal/wire"
)

// Right is a set of operations a token grants.
type Right uint8

// Rights. Admin covers the control plane (MDS member registration, admin views, node
// STATS); it does not imply the data rights.
const (
	RightRead   Right = 1 << iota // GET, EXIST and their batch / scatter-gather forms
	RightWrite                    // PUT and its batch / scatter-gather forms
	RightRemove                   // REMOVE, BATCH_REMOVE
	RightAdmin
)

var rightNames = map[string]Right{"read": RightRead, "write": RightWrite, "remove": RightRemove, "admin": RightAdmin,
	"all": RightRead | RightWrite | RightRemove}

// ErrTokenFile marks a token file that cannot be used.
var ErrTokenFile = errors.New("auth: bad token file")

// Grant is what one token allows.
type Grant struct {
	Rights     Right
	AllTenants bool
	Tenants    map[uint64]bool // wire tenant hashes (identity.Tenant of the names in the file)
}

// Allows reports whether the grant covers right r on tenant (a wire tenant hash).
func (g *Grant) Allows(tenant uint64, r Right) bool {
	if g == nil || g.Rights&r != r {
		return false
	}
	if r == RightAdmin {
		return true
	}
	return g.AllTenants || g.Tenants[tenant]
}

type tokenEntry struct {
	sum   [sha256.Size]byte
	grant *Grant
}

type tokenSet struct {
	gen     uint64
	entries []tokenEntry
	sum     [sha256.Size]byte // of the file, to skip no-op reloads
}

// Tokens is a reloadable token table read from a file (--auth-tokens).
type Tokens struct {
	path string
	log  *slog.Logger
	cur  atomic.Pointer[tokenSet]
	mu   sync.Mutex
}

// LoadTokens reads a token file. Its format, one token per line ('#' starts a comment):
//
//	TOKEN  RIGHTS  TENANTS
//	tok-a  read,write,remove  team-a,team-a-batch
//	tok-o  admin              *
//
// RIGHTS is a comma list of read, write, remove, admin (all = read,write,remove); TENANTS a
// comma list of tenant names as clients pass them (DFKV_TENANT, --tenant), "-" for the
// default (empty) tenant, or "*" for every tenant. Namespaces are hashed into object ids on
// the client and never reach the server, so the tenant is the unit a token scopes.
func LoadTokens(path string, log *slog.Logger) (*Tokens, error) {
	if log == nil {
		log = slog.Default()
	}
	t := &Tokens{path: path, log: log}
	if _, err := t.Reload(); err != nil {
		return nil, err
	}
	return t, nil
}

// parseTokens parses token file content (see LoadTokens).
func parseTokens(data []byte) ([]tokenEntry, error) {
	var out []tokenEntry
	seen := map[[sha256.Size]byte]bool{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if len(f) != 3 {
			return nil, fmt.Errorf("%w: line %d: want TOKEN RIGHTS TENANTS, got %d fields", ErrTokenFile, n, len(f))
		}
		if len(f[0]) > wire.MaxTokenLen {
			return nil, fmt.Errorf("%w: line %d: token longer than %d bytes", ErrTokenFile, n, wire.MaxTokenLen)
		}
		g := &Grant{Tenants: map[uint64]bool{}}
		for _, r := range strings.Split(f[1], ",") {
			bit, ok := rightNames[r]
			if !ok {
				return nil, fmt.Errorf("%w: line %d: right %q (want read, write, remove, admin, all)", ErrTokenFile, n, r)
			}
			g.Rights |= bit
		}
		for _, tn := range strings.Split(f[2], ",") {
			switch tn {
			case "":
				return nil, fmt.Errorf("%w: line %d: empty tenant name (use - for the default tenant)", ErrTokenFile, n)
			case "*":
				g.AllTenants = true
			case "-":
				g.Tenants[identity.Tenant(nil)] = true
			default:
				g.Tenants[identity.Tenant([]byte(tn))] = true
			}
		}
		e := tokenEntry{sum: sha256.Sum256([]byte(f[0])), grant: g}
		if seen[e.sum] {
			return nil, fmt.Errorf("%w: line %d: duplicate token", ErrTokenFile, n)
		}
		seen[e.sum] = true
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrTokenFile, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: no tokens (an empty table would lock every client out)", ErrTokenFile)
	}
	return out, nil
}

// Reload rereads the file; it reports whether the table changed. On error the previous
// table stays in force.
func (t *Tokens) Reload() (bool, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	data, err := os.ReadFile(t.path)
	if err != nil {
		return false, fmt.Errorf("auth: %w", err)
	}
	sum := sha256.Sum256(data)
	old := t.cur.Load()
	if old != nil && old.sum == sum {
		return false, nil
	}
	entries, err := parseTokens(data)
	if err != nil {
		return false, fmt.Errorf("%s: %w", t.path, err)
	}
	s := &tokenSet{entries: entries, sum: sum, gen: 1}
	if old != nil {
		s.gen = old.gen + 1
	}
	t.cur.Store(s)
	return true, nil
}

// Gen is the table's generation: it changes on every effective reload, so a connection
// that resolved its token under an older generation resolves it again.
func (t *Tokens) Gen() uint64 { return t.cur.Load().gen }

// Lookup returns the grant of token, or nil. The time taken does not depend on which entry
// (if any) matches or on how much of the token matches.
func (t *Tokens) Lookup(token []byte) *Grant {
	sum := sha256.Sum256(token)
	var found *Grant
	entries := t.cur.Load().entries
	for i := range entries {
		e := &entries[i]
		if subtle.ConstantTimeCompare(sum[:], e.sum[:]) == 1 {
			found = e.grant
		}
	}
	return found
}

// Watch reloads on every tick of interval and whenever kick receives, until ctx ends.
// Failures are logged (never with token text) and the previous table kept.
func (t *Tokens) Watch(ctx context.Context, interval time.Duration, kick <-chan struct{}) {
	var lastErr string
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		case <-kick:
		}
		changed, err := t.Reload()
		switch {
		case err != nil && err.Error() != lastErr:
			t.log.Error("token file reload failed; keeping the previous tokens", "err", err)
			lastErr = err.Error()
		case changed:
			t.log.Info("token file reloaded", "file", t.path, "tokens", len(t.cur.Load().entries))
			lastErr = ""
		}
	}
}

// Session is one connection's view of its token: it re-resolves the grant whenever the
// table's generation moved, so revocation reaches open connections.
type Session struct {
	tokens *Tokens
	token  []byte
	gen    uint64
	grant  *Grant
}

// NewSession starts a session with no token (nothing allowed but the handshake).
func (t *Tokens) NewSession() *Session { return &Session{tokens: t} }

// SetToken records the token sent in HELLO.
func (s *Session) SetToken(tok string) {
	s.token = []byte(tok)
	s.gen = 0
}

// Grant returns the session's current grant (nil: none).
func (s *Session) Grant() *Grant {
	if g := s.tokens.Gen(); g != s.gen {
		s.gen, s.grant = g, nil
		if len(s.token) > 0 {
			s.grant = s.tokens.Lookup(s.token)
		}
	}
	return s.grant
}
