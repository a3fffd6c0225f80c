package cabi

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/dfkv/dfkv/go/client"
	"github.com/dfkv/dfkv/go/internal/server"
	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/transport/tcp"
)

func good() Options {
	return Options{StructSize: OptionsSize, ABIVersion: ABIVersion, Members: "n1=127.0.0.1:1"}
}

func TestOpenRefusals(t *testing.T) {
	cases := []struct {
		name string
		mut  func(o *Options)
		ok   bool
	}{
		{"valid", func(o *Options) {}, true},
		{"larger struct from a newer caller", func(o *Options) { o.StructSize = OptionsSize + 16 }, true},
		{"short struct", func(o *Options) { o.StructSize = OptionsSize - 8 }, false},
		{"wrong version", func(o *Options) { o.ABIVersion = 1 }, false},
		{"unknown flag", func(o *Options) { o.Flags = 1 << 5 }, false},
		{"reserved set", func(o *Options) { o.Reserved0 = 1 }, false},
		{"no members no mds", func(o *Options) { o.Members = "  " }, false},
		{"bad members", func(o *Options) { o.Members = "n1=nohost" }, false},
		// MDS discovery is always linked (mds.go's init); an unreachable MDS does not fail Open.
		{"mds only, unreachable", func(o *Options) { o.Members = ""; o.MDSEndpoints = "127.0.0.1:9" }, true},
	}
	for _, c := range cases {
		o := good()
		c.mut(&o)
		id := Open(&o)
		if (id != 0) != c.ok {
			t.Errorf("%s: id=%d want ok=%v (last error %q)", c.name, id, c.ok, LastError())
		}
		Close(id)
	}
	if Open(nil) != 0 {
		t.Error("nil options accepted")
	}
}

func TestHandleLifecycleAndOutputs(t *testing.T) {
	srv, err := server.New(server.Config{Engine: store.NewMem(1 << 20)})
	if err != nil {
		t.Fatal(err)
	}
	ln, _ := tcp.Listen("127.0.0.1:0")
	go srv.Serve(ln)
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	}()
	o := good()
	o.Members = "n1=" + ln.Addr().String()
	id := Open(&o)
	h := Lookup(id)
	if h == nil {
		t.Fatal(LastError())
	}
	rc := func(r int, _ error) int { return r }
	if r, err := h.Put([]byte("k"), nil); r != -1 || err == nil {
		t.Error("zero-length put accepted")
	}
	if rc(h.Put([]byte("k"), []byte("abc"))) != 0 || rc(h.Get([]byte("k"), make([]byte, 3))) != 1 {
		t.Error("put/get exact")
	}
	if r, err := h.Get([]byte("k"), make([]byte, 2)); r != 0 || !errors.Is(err, client.ErrBufferTooSmall) {
		t.Errorf("exact get of the wrong size: %d %v", r, err)
	}
	if r, n, err := h.GetAuto([]byte("k"), make([]byte, 10)); r != 1 || n != 3 || err != nil {
		t.Errorf("get auto %d %d %v", r, n, err)
	}
	// Outputs start as failure even when the call is refused.
	ok := []int32{7, 7}
	lens := []uint64{9, 9}
	if rc(h.BatchGetAuto([][]byte{[]byte("k")}, [][]byte{make([]byte, 3), nil}, ok, lens)) != -1 {
		t.Error("mismatched batch lengths accepted")
	}
	if ok[0] != 0 || ok[1] != 0 || lens[0] != 0 || lens[1] != 0 {
		t.Errorf("outputs not reset: %v %v", ok, lens)
	}
	r, err := h.BatchGetAuto([][]byte{[]byte("k"), []byte("x")}, [][]byte{make([]byte, 3), make([]byte, 3)}, ok, lens)
	if r != 0 || ok[0] != 1 || ok[1] != 0 || lens[0] != 3 {
		t.Errorf("mixed batch: %v %v", ok, lens)
	}
	if !errors.Is(err, client.ErrNotFound) || !strings.Contains(err.Error(), "item 1") {
		t.Errorf("mixed batch: the first failed item's reason, got %v", err)
	}
	// Remove: 1 when removed and when already absent (the original ABI's rule).
	if rc(h.Remove([]byte("k"))) != 1 || rc(h.Remove([]byte("k"))) != 1 || rc(h.Exist([]byte("k"))) != 0 {
		t.Error("remove of a present and an absent key")
	}
	if rc(h.BatchRemove([][]byte{[]byte("k"), []byte("x")}, ok)) != 0 || ok[0] != 1 || ok[1] != 1 {
		t.Errorf("batch remove of absent keys: %v", ok)
	}
	regBuf := make([]byte, 10)
	if h.MaxSGSegs() == 0 || h.TransportMode() != "tcp" || rc(h.RegisterMemory(unsafe.Pointer(&regBuf[0]), 10)) != 0 ||
		rc(h.RegisterMemory(nil, 10)) != -1 || rc(h.RegisterMemory(unsafe.Pointer(&regBuf[0]), 0)) != -1 {
		t.Error("metadata calls")
	}
	if rc(h.UnregisterMemory(unsafe.Pointer(&regBuf[0]), 9)) != -1 || rc(h.UnregisterMemory(unsafe.Pointer(&regBuf[0]), 10)) != 0 ||
		rc(h.UnregisterMemory(unsafe.Pointer(&regBuf[0]), 10)) != -1 || rc(h.UnregisterMemory(nil, 10)) != -1 {
		t.Error("unregister: another length -1, the registered range 0, again -1, NULL -1")
	}
	before := panics.Load()
	if err := Recovered("boom", nil); err == nil || !strings.Contains(err.Error(), "boom") {
		t.Errorf("recovered panic error: %v", err)
	}
	snap := string(h.StatsSnapshot())
	if !strings.Contains(snap, "dfkv_client_ops_total") ||
		!strings.Contains(snap, fmt.Sprintf("dfkv_cabi_panics_total %d\n", before+1)) {
		t.Errorf("snapshot lacks the ops or the panic counter:\n%s", snap)
	}
	Close(id)
	if Lookup(id) != nil {
		t.Error("handle alive after close")
	}
	Close(id) // double close is harmless
}

func TestTimeoutEnv(t *testing.T) {
	t.Setenv("DFKV_IO_TIMEOUT_MS", "250")
	t.Setenv("DFKV_CONNECT_TIMEOUT_MS", "100")
	o := good()
	id := Open(&o)
	if id == 0 {
		t.Fatalf("valid timeouts refused: %s", LastError())
	}
	Close(id)
	t.Setenv("DFKV_PEER_COOLDOWN_MS", "soon")
	if id := Open(&o); id != 0 {
		Close(id)
		t.Fatal("malformed DFKV_PEER_COOLDOWN_MS accepted")
	}
	if !strings.Contains(LastError(), "DFKV_PEER_COOLDOWN_MS") {
		t.Fatalf("error does not name the variable: %q", LastError())
	}
}

// The library reads no environment; the C ABI turns DFKV_CLIENT_REGISTER into the MDS
// options: "0" clears a requested registration, anything else leaves the flag in charge.
func TestRegisterEnv(t *testing.T) {
	for _, c := range []struct {
		env  string // "" = unset
		flag bool
		want bool
	}{
		{"", true, true},
		{"", false, false},
		{"1", true, true},
		{"0", true, false},
		{"0", false, false},
	} {
		if c.env != "" {
			t.Setenv(envRegister, c.env)
		} else {
			t.Setenv(envRegister, "1") // restore on cleanup, then clear for this case
			os.Unsetenv(envRegister)
		}
		o := good()
		o.MDSEndpoints = "127.0.0.1:9"
		if c.flag {
			o.Flags |= FlagRegisterWithMDS
		}
		mo, err := mdsOptions(&o)
		if err != nil {
			t.Fatal(err)
		}
		if mo.Register != c.want {
			t.Errorf("%s=%q flag=%v: Register %v, want %v", envRegister, c.env, c.flag, mo.Register, c.want)
		}
	}
}

// DFKV_FANOUT_THREADS reaches the client's options: a sane value opens, a malformed one
// or one past the client's bound refuses the open and says why.
func TestFanoutEnv(t *testing.T) {
	o := good()
	for _, c := range []struct {
		val  string
		ok   bool
		word string
	}{
		{"8", true, ""},
		{"4096", true, ""},
		{"many", false, envFanout},
		{"-1", false, envFanout},
		{"4097", false, "fan-out"},
	} {
		t.Setenv(envFanout, c.val)
		id := Open(&o)
		if (id != 0) != c.ok {
			t.Errorf("%s=%s: id=%d want ok=%v (%q)", envFanout, c.val, id, c.ok, LastError())
		}
		Close(id)
		if !c.ok && !strings.Contains(LastError(), c.word) {
			t.Errorf("%s=%s: error %q does not say %q", envFanout, c.val, LastError(), c.word)
		}
	}
}

// DFKV_RDMA_DEV is a comma list (the rail whitelist), DFKV_RDMA_TIERS "a,b;c" ranks it, and
// DFKV_RDMA_PRIMARY_DEV prefers one; a set the client cannot honour refuses the open.
func TestRDMARailEnv(t *testing.T) {
	if got := splitList(" soft0, soft1 ,,soft2", ","); strings.Join(got, "|") != "soft0|soft1|soft2" {
		t.Fatalf("splitList: %q", got)
	}
	for _, tc := range []struct {
		in   string
		want string
	}{
		{"", "[]"},
		{"a,b;c", "[[a b] [c]]"},
		{"a|b ; c", "[[a b] [c]]"},
		{"a;;c", "[[a] [] [c]]"}, // the empty tier is kept, for client.New to refuse
	} {
		if got := fmt.Sprint(parseTiers(tc.in)); got != tc.want {
			t.Errorf("parseTiers(%q) = %s, want %s", tc.in, got, tc.want)
		}
	}
	t.Setenv("DFKV_RDMA", "1")
	t.Setenv("DFKV_RDMA_PROVIDER", "soft")
	t.Setenv("DFKV_RDMA_DEV", "soft0,soft1")
	t.Setenv("DFKV_RDMA_TIERS", "soft0;soft1")
	t.Setenv("DFKV_RDMA_PRIMARY_DEV", "soft1")
	o := good()
	id := Open(&o)
	if id == 0 {
		t.Fatalf("valid rail settings refused: %s", LastError())
	}
	Close(id)
	for env, bad := range map[string]string{
		"DFKV_RDMA_TIERS":       "soft0;soft9",
		"DFKV_RDMA_PRIMARY_DEV": "soft7",
	} {
		t.Run(env, func(t *testing.T) {
			t.Setenv(env, bad)
			if id := Open(&o); id != 0 {
				Close(id)
				t.Fatalf("%s=%s accepted", env, bad)
			}
			if !strings.Contains(LastError(), "rdma") {
				t.Fatalf("error does not say what: %q", LastError())
			}
		})
	}
}

// DFKV_RDMA_NUMA / _NUMA_NODE / _RAIL_CREDITS / _RAIL_PROBE_MS / _RAIL_SLOW_FACTOR map onto RDMAOptions; a
// malformed value refuses the open with the variable's name.
func TestRDMARailTuningEnv(t *testing.T) {
	t.Setenv("DFKV_RDMA_NUMA", "1")
	t.Setenv("DFKV_RDMA_NUMA_NODE", "1")
	t.Setenv("DFKV_RDMA_RAIL_CREDITS", "3")
	t.Setenv("DFKV_RDMA_RAIL_PROBE_MS", "-1")
	t.Setenv("DFKV_RDMA_RAIL_SLOW_FACTOR", "2.5")
	var o client.RDMAOptions
	if err := applyRailEnv(&o); err != nil {
		t.Fatal(err)
	}
	if !o.NUMA || o.NUMANode != 1 || o.RailCredits != 3 || o.RailProbeInterval != -time.Millisecond || o.RailSlowFactor != 2.5 {
		t.Fatalf("%+v", o)
	}
	t.Setenv("DFKV_RDMA_NUMA", "0")
	t.Setenv("DFKV_RDMA_NUMA_NODE", "")
	t.Setenv("DFKV_RDMA_RAIL_PROBE_MS", "250")
	o = client.RDMAOptions{}
	if err := applyRailEnv(&o); err != nil {
		t.Fatal(err)
	}
	if o.NUMA || o.NUMANode != client.AutoNUMANode || o.RailProbeInterval != 250*time.Millisecond {
		t.Fatalf("%+v", o)
	}
	for env, bad := range map[string]string{
		"DFKV_RDMA_NUMA":             "yes",
		"DFKV_RDMA_NUMA_NODE":        "-2",
		"DFKV_RDMA_RAIL_CREDITS":     "0",
		"DFKV_RDMA_RAIL_PROBE_MS":    "soon",
		"DFKV_RDMA_RAIL_SLOW_FACTOR": "0.5",
	} {
		t.Run(env, func(t *testing.T) {
			t.Setenv(env, bad)
			err := applyRailEnv(&client.RDMAOptions{})
			if err == nil || !strings.Contains(err.Error(), env) {
				t.Fatalf("%s=%s: %v", env, bad, err)
			}
		})
	}
}

// DFKV_RDMA_GID_INDEX / _HOP_LIMIT / _TRAFFIC_CLASS / _REFUSAL_BACKOFF_MS map onto
// RDMAOptions (unset: the GID is chosen per connection); a malformed or out-of-range value
// refuses the open with the variable's name.
func TestRDMAPathEnv(t *testing.T) {
	var o client.RDMAOptions
	if err := applyPathEnv(&o); err != nil || o.GIDIndex != nil || o.HopLimit != 0 || o.TrafficClass != 0 || o.RefusalBackoff != 0 {
		t.Fatalf("unset: %+v %v", o, err)
	}
	t.Setenv("DFKV_RDMA_GID_INDEX", "3")
	t.Setenv("DFKV_RDMA_HOP_LIMIT", "16")
	t.Setenv("DFKV_RDMA_TRAFFIC_CLASS", "106")
	t.Setenv("DFKV_RDMA_REFUSAL_BACKOFF_MS", "250")
	if err := applyPathEnv(&o); err != nil {
		t.Fatal(err)
	}
	if o.GIDIndex == nil || *o.GIDIndex != 3 || o.HopLimit != 16 || o.TrafficClass != 106 || o.RefusalBackoff != 250*time.Millisecond {
		t.Fatalf("%+v", o)
	}
	for env, bad := range map[string]string{
		"DFKV_RDMA_GID_INDEX":          "256",
		"DFKV_RDMA_HOP_LIMIT":          "0",
		"DFKV_RDMA_TRAFFIC_CLASS":      "ef",
		"DFKV_RDMA_REFUSAL_BACKOFF_MS": "-5",
	} {
		t.Run(env, func(t *testing.T) {
			t.Setenv(env, bad)
			err := applyPathEnv(&client.RDMAOptions{})
			if err == nil || !strings.Contains(err.Error(), env) {
				t.Fatalf("%s=%s: %v", env, bad, err)
			}
		})
	}
}
