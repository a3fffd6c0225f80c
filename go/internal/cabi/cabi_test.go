package cabi

import (
	"context"
	"strings"
	"testing"
	"time"
	"unsafe"

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
		{"mds only without discovery linked", func(o *Options) { o.Members = ""; o.MDSEndpoints = "127.0.0.1:9" }, MembershipFactory != nil},
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
	if h.Put([]byte("k"), nil) != -1 {
		t.Error("zero-length put accepted")
	}
	if h.Put([]byte("k"), []byte("abc")) != 0 || h.Get([]byte("k"), make([]byte, 3)) != 1 || h.Get([]byte("k"), make([]byte, 2)) != 0 {
		t.Error("put/get exact")
	}
	if r, n := h.GetAuto([]byte("k"), make([]byte, 10)); r != 1 || n != 3 {
		t.Errorf("get auto %d %d", r, n)
	}
	// Outputs start as failure even when the call is refused.
	ok := []int32{7, 7}
	lens := []uint64{9, 9}
	if h.BatchGetAuto([][]byte{[]byte("k")}, [][]byte{make([]byte, 3), nil}, ok, lens) != -1 {
		t.Error("mismatched batch lengths accepted")
	}
	if ok[0] != 0 || ok[1] != 0 || lens[0] != 0 || lens[1] != 0 {
		t.Errorf("outputs not reset: %v %v", ok, lens)
	}
	if h.BatchGetAuto([][]byte{[]byte("k"), []byte("x")}, [][]byte{make([]byte, 3), make([]byte, 3)}, ok, lens) != 0 ||
		ok[0] != 1 || ok[1] != 0 || lens[0] != 3 {
		t.Errorf("mixed batch: %v %v", ok, lens)
	}
	regBuf := make([]byte, 10)
	if h.MaxSGSegs() == 0 || h.TransportMode() != "tcp" || h.RegisterMemory(unsafe.Pointer(&regBuf[0]), 10) != 0 ||
		h.RegisterMemory(nil, 10) != -1 || h.RegisterMemory(unsafe.Pointer(&regBuf[0]), 0) != -1 {
		t.Error("metadata calls")
	}
	if !strings.Contains(string(h.StatsSnapshot()), "dfkv_client_ops_total") {
		t.Error("snapshot")
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
