package secure

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/dfkv/dfkv/go/identity"
)

func TestParseTokens(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		ok         bool
	}{
		{"one", "tok read a", true},
		{"comments and blanks", "# x\n\n tok  read,write  a,b  # trailing\n", true},
		{"default tenant and all", "t1 all -\nt2 admin *", true},
		{"missing field", "tok read", false},
		{"extra field", "tok read a b", false},
		{"unknown right", "tok fly a", false},
		{"empty tenant", "tok read a,,b", false},
		{"duplicate", "tok read a\ntok write b", false},
		{"empty", "# nothing\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseTokens([]byte(tc.file))
			if (err == nil) != tc.ok {
				t.Fatalf("err = %v, want ok=%v", err, tc.ok)
			}
			if err != nil && !errors.Is(err, ErrTokenFile) {
				t.Fatalf("error is not ErrTokenFile: %v", err)
			}
		})
	}
}

func TestGrants(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(path, []byte("ta read,write team-a\nro read team-a,-\nop admin *\nall all *\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tok, err := LoadTokens(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	a, b, def := identity.Tenant([]byte("team-a")), identity.Tenant([]byte("team-b")), identity.Tenant(nil)
	for _, tc := range []struct {
		token  string
		tenant uint64
		right  Right
		want   bool
	}{
		{"ta", a, RightRead, true}, {"ta", a, RightWrite, true}, {"ta", a, RightRemove, false}, {"ta", b, RightRead, false},
		{"ro", def, RightRead, true}, {"ro", a, RightWrite, false},
		{"op", a, RightAdmin, true}, {"op", a, RightRead, false},
		{"all", b, RightRemove, true}, {"all", b, RightAdmin, false},
		{"t", a, RightRead, false}, {"", a, RightRead, false}, {"ta ", a, RightRead, false},
	} {
		if got := tok.Lookup([]byte(tc.token)).Allows(tc.tenant, tc.right); got != tc.want {
			t.Errorf("%q tenant %x right %d: %v, want %v", tc.token, tc.tenant, tc.right, got, tc.want)
		}
	}
}

func TestSessionSeesRevocation(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens")
	write := func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("ta all a\ntb all b\n")
	tok, err := LoadTokens(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := tok.NewSession()
	if s.Grant() != nil {
		t.Fatal("a session without a token has a grant")
	}
	s.SetToken("ta")
	if !s.Grant().Allows(identity.Tenant([]byte("a")), RightRead) {
		t.Fatal("valid token refused")
	}
	write("tb all b\n")
	if changed, err := tok.Reload(); !changed || err != nil {
		t.Fatalf("reload: %v %v", changed, err)
	}
	if s.Grant() != nil {
		t.Fatal("revoked token still granted on an open session")
	}
	// A broken file keeps the table in force.
	write("tb all\n")
	if _, err := tok.Reload(); err == nil {
		t.Fatal("broken file accepted")
	}
	if tok.Lookup([]byte("tb")) == nil {
		t.Fatal("a failed reload dropped the previous table")
	}
	if changed, err := tok.Reload(); changed || err == nil {
		t.Fatalf("second reload of the broken file: %v %v", changed, err)
	}
}
