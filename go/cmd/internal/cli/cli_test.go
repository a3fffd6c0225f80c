package cli

import (
	"flag"
	"testing"
)

func TestParseSize(t *testing.T) {
	cases := []struct {
		in   string
		want int64
		ok   bool
	}{
		{"1048576", 1 << 20, true},
		{"64MiB", 64 << 20, true},
		{"1.5GiB", 3 << 29, true},
		{"10GB", 10e9, true},
		{"4K", 4096, true},
		{" 2 TiB ", 2 << 40, true},
		{"", 0, false},
		{"-1", 0, false},
		{"12XB", 0, false},
		{"1e30", 0, false},
	}
	for _, c := range cases {
		got, err := ParseSize(c.in)
		if (err == nil) != c.ok || (c.ok && got != c.want) {
			t.Errorf("ParseSize(%q) = %d, %v; want %d ok=%v", c.in, got, err, c.want, c.ok)
		}
	}
}

func TestApplyEnvCommandLineWins(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	engine := fs.String("store-engine", "slab", "")
	port := fs.Int("port", 1, "")
	var capacity Size
	fs.Var(&capacity, "cap", "")
	t.Setenv("DFKV_STORE_ENGINE", "file")
	t.Setenv("DFKV_PORT", "99")
	t.Setenv("DFKV_CAP", "2GiB")
	if err := fs.Parse([]string{"--port", "7"}); err != nil {
		t.Fatal(err)
	}
	if err := ApplyEnv(fs); err != nil {
		t.Fatal(err)
	}
	if *engine != "file" || *port != 7 || capacity != 2<<30 {
		t.Fatalf("engine=%s port=%d cap=%d", *engine, *port, capacity)
	}
	t.Setenv("DFKV_PORT", "not-a-number")
	fs2 := flag.NewFlagSet("y", flag.ContinueOnError)
	fs2.Int("port", 1, "")
	_ = fs2.Parse(nil)
	if err := ApplyEnv(fs2); err == nil {
		t.Fatal("bad env value accepted")
	}
	if EnvName("ram-tier-bytes") != "DFKV_RAM_TIER_BYTES" {
		t.Fatal(EnvName("ram-tier-bytes"))
	}
}
