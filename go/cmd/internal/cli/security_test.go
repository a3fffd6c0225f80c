package cli

import (
	"bytes"
	"flag"
	"log/slog"
	"strings"
	"testing"

	"github.com/dfkv/dfkv/go/internal/secure"
)

func TestWarnIfOpen(t *testing.T) {
	full := &Loaded{TLS: &secure.TLS{}, Tokens: &secure.Tokens{}}
	for _, tc := range []struct {
		name string
		l    *Loaded
		host string
		warn bool
	}{
		{"loopback v4", &Loaded{}, "127.0.0.1", false},
		{"loopback v6", &Loaded{}, "::1", false},
		{"localhost", &Loaded{}, "localhost", false},
		{"any, nothing", &Loaded{}, "0.0.0.0", true},
		{"lan, tls only", &Loaded{TLS: &secure.TLS{}}, "10.0.0.5", true},
		{"lan, both", full, "10.0.0.5", false},
	} {
		var buf bytes.Buffer
		tc.l.WarnIfOpen(slog.New(slog.NewTextHandler(&buf, nil)), tc.host)
		if got := strings.Contains(buf.String(), "without full protection"); got != tc.warn {
			t.Errorf("%s: warned=%v, want %v (%q)", tc.name, got, tc.warn, buf.String())
		}
	}
}

func TestSecurityFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		ok   bool
	}{
		{nil, true},
		{[]string{"--tls-cert", "c", "--tls-key", "k"}, true},
		{[]string{"--tls-cert", "c"}, false},
		{[]string{"--tls-cert", "c", "--tls-key", "k", "--tls-client-auth", "require"}, false},
		{[]string{"--tls-cert", "c", "--tls-key", "k", "--tls-client-auth", "require", "--tls-ca", "ca"}, true},
		{[]string{"--tls-client-auth", "maybe"}, false},
		{[]string{"--security-reload-interval", "0s"}, false},
	} {
		var s Security
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		s.Define(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		if err := s.Validate(); (err == nil) != tc.ok {
			t.Errorf("%v: %v, want ok=%v", tc.args, err, tc.ok)
		}
	}
}
