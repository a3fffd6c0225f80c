//go:build linux && cgo

package ibverbs

import (
	"context"
	"debug/elf"
	"errors"
	"hash/crc32"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs"
)

// A process keeps the first library that loads; a later provider naming another library
// still gets that library's own failure (dlopen, dlsym) reported, in any test order.

func oneLine(t *testing.T, err error) {
	t.Helper()
	if msg := err.Error(); strings.Contains(msg, "\n") || msg == "" {
		t.Fatalf("reason is not one line: %q", msg)
	}
}

func TestMissingLibrary(t *testing.T) {
	p := New(Options{Library: "/nonexistent/libibverbs.so.1"})
	_, err := p.Devices()
	if !errors.Is(err, verbs.ErrUnavailable) || !strings.Contains(err.Error(), "dlopen /nonexistent/libibverbs.so.1") {
		t.Fatalf("Devices: %v", err)
	}
	oneLine(t, err)
	if _, err := p.Open("mlx5_0"); !errors.Is(err, verbs.ErrUnavailable) {
		t.Fatalf("Open: %v", err)
	}
}

func TestLibraryWithoutVerbs(t *testing.T) {
	_, err := New(Options{Library: "libc.so.6"}).Devices()
	if !errors.Is(err, verbs.ErrUnavailable) || !strings.Contains(err.Error(), "dlsym ibv_get_device_list") {
		t.Fatalf("Devices: %v", err)
	}
	oneLine(t, err)
}

func TestNUMANode(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "mlx5_1", "device"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "mlx5_1", "device", "numa_node"), []byte("1\n"), 0o644)
	p := New(Options{SysClass: dir})
	if got := p.numaNode("mlx5_1"); got != 1 {
		t.Fatalf("numa node %d, want 1", got)
	}
	if got := p.numaNode("mlx5_0"); got != -1 {
		t.Fatalf("numa node of an unknown device %d, want -1", got)
	}
}

// TestSystemLibrary runs against the machine's own libibverbs: without a device it must
// say why in one line (this is the path taken on machines without RDMA); with devices
// (hardware or Soft-RoCE) their attributes must be filled in.
func TestSystemLibrary(t *testing.T) {
	p := New(Options{})
	devs, err := p.Devices()
	if err != nil {
		if !errors.Is(err, verbs.ErrNoDevice) && !errors.Is(err, verbs.ErrUnavailable) {
			t.Fatalf("Devices: %v wraps neither ErrNoDevice nor ErrUnavailable", err)
		}
		oneLine(t, err)
		if entries, _ := os.ReadDir("/sys/class/infiniband"); len(entries) > 0 && errors.Is(err, verbs.ErrNoDevice) {
			t.Fatalf("sysfs lists %d RDMA devices but the provider says: %v", len(entries), err)
		}
		if _, oerr := p.Open("mlx5_0"); !errors.Is(oerr, verbs.ErrNoDevice) && !errors.Is(oerr, verbs.ErrUnavailable) {
			t.Fatalf("Open without devices: %v", oerr)
		}
		t.Logf("reported: %v", err)
		return
	}
	for _, d := range devs {
		if d.Name == "" || len(d.Ports) == 0 || d.MaxQPWR <= 0 {
			t.Fatalf("device %+v", d)
		}
	}
	if _, err := p.Open("no-such-device"); !errors.Is(err, verbs.ErrNoDevice) {
		t.Fatalf("Open unknown: %v", err)
	}
}

// The binary must not need libibverbs to start: it is dlopen'ed, never linked.
func TestNotLinked(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	f, err := elf.Open(exe)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	libs, err := f.ImportedLibraries()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range libs {
		if strings.Contains(l, "ibverbs") {
			t.Fatalf("binary links %s; libibverbs must be loaded with dlopen", l)
		}
	}
}

// TestLoopback moves bytes through a QP pair on the first ACTIVE port. It needs an RDMA
// device (hardware, or Soft-RoCE: modprobe rdma_rxe; rdma link add rxe0 type rxe netdev
// eth0) and skips with the reason where there is none.
func TestLoopback(t *testing.T) {
	p := New(Options{})
	devs, err := p.Devices()
	if err != nil {
		t.Skipf("no RDMA device here: %v", err)
	}
	for _, d := range devs {
		if pi, ok := d.ActivePort(); ok {
			loopback(t, p, d.Name, pi)
			return
		}
	}
	t.Skipf("no ACTIVE port on %d RDMA devices", len(devs))
}

func loopback(t *testing.T, p verbs.Provider, name string, port verbs.PortInfo) {
	ctx, err := p.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	pd, err := ctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	defer pd.Close()
	cq, err := ctx.CreateCQ(64)
	if err != nil {
		t.Fatal(err)
	}
	defer cq.Close()
	mk := func() verbs.QP {
		q, err := pd.CreateQP(verbs.QPConfig{Type: verbs.QPTypeRC, SendCQ: cq, RecvCQ: cq, MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 2, MaxRecvSGE: 2})
		if err != nil {
			t.Fatal(err)
		}
		return q
	}
	a, b := mk(), mk()
	defer a.Close()
	defer b.Close()
	// Both QPs are on this host: the selection takes a link-local GID (ChooseGID rule 4),
	// read from the port's real table.
	table, err := ctx.GIDTable(port.Num)
	if err != nil {
		t.Fatal(err)
	}
	pick, err := verbs.ChooseGID(verbs.GIDQuery{LinkLayer: port.LinkLayer, Table: table, PeerLocal: true}, verbs.GIDPolicy{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("GID table %v; chose %+v", table, pick)
	ea := verbs.Endpoint{QPNum: a.Num(), PSN: 11, GID: pick.Entry.GID, LID: port.LID, Port: port.Num, MTU: port.MTU}
	eb := verbs.Endpoint{QPNum: b.Num(), PSN: 22, GID: pick.Entry.GID, LID: port.LID, Port: port.Num, MTU: port.MTU}
	acc := verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteRead
	path := pick.Path(verbs.GIDPolicy{})
	if err := verbs.Connect(a, port.Num, acc, ea, eb, path); err != nil {
		t.Fatal(err)
	}
	if err := verbs.Connect(b, port.Num, acc, eb, ea, path); err != nil {
		t.Fatal(err)
	}
	sb, _ := verbs.AllocBuffer(1 << 20)
	db, _ := verbs.AllocBuffer(1 << 20)
	defer sb.Free()
	defer db.Free()
	for i := range sb.Bytes() {
		sb.Bytes()[i] = byte(i * 7)
	}
	src, err := pd.RegMR(sb.Bytes(), verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := pd.RegMR(db.Bytes(), acc)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	if _, err := b.PostRecv([]verbs.RecvWR{{ID: 9}}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.PostSend([]verbs.SendWR{{ID: 1, Opcode: verbs.OpWriteWithImm, Flags: verbs.SendSignaled, SGL: []verbs.SGE{verbs.SGEOf(src, 0, 1<<20)}, RemoteAddr: dst.Addr(), RKey: dst.RKey(), Imm: 77}}); err != nil {
		t.Fatal(err)
	}
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	seen := map[uint64]verbs.WorkCompletion{}
	for len(seen) < 2 {
		wc, err := verbs.PollOne(c, cq)
		if err != nil {
			t.Fatal(err)
		}
		if wc.Status != verbs.StatusSuccess {
			t.Fatalf("completion %+v", wc)
		}
		seen[wc.ID] = wc
	}
	if r := seen[9]; !r.HasImm || r.Imm != 77 || r.ByteLen != 1<<20 {
		t.Fatalf("receive completion %+v", r)
	}
	if crc32.ChecksumIEEE(db.Bytes()) != crc32.ChecksumIEEE(sb.Bytes()) {
		t.Fatal("loopback WRITE placed wrong bytes")
	}
}

// TestABILayout checks verbs_abi.h (the provider's own declarations, so that building needs
// no rdma-core headers) against rdma-core's <infiniband/verbs.h> wherever that is installed:
// every size, offset and enum value the shim relies on must agree.
func TestABILayout(t *testing.T) {
	vals, ok := abiLayout()
	if !ok {
		t.Skip("rdma-core headers (infiniband/verbs.h) not installed: nothing to compare verbs_abi.h with")
	}
	for _, v := range vals {
		// The exported ibv_query_port fills the compat struct, a prefix of today's
		// ibv_port_attr (later rdma-core appends fields, e.g. active_speed_ex): ours is that
		// prefix, so it may be shorter than a newer header's struct (its offsets are checked).
		if v.name == "sizeof ibv_port_attr" && v.ours <= v.real {
			continue
		}
		if v.ours != v.real {
			t.Errorf("%s: verbs_abi.h %d, rdma-core's header %d", v.name, v.ours, v.real)
		}
	}
	if !t.Failed() {
		t.Logf("%d sizes, offsets and enum values agree with rdma-core's header", len(vals))
	}
}

// TestRegMRUnderMemlock registers more than a lowered RLIMIT_MEMLOCK holds on a real device
// and expects the one-line memlock reason (verbs.ErrMemlock). Root's CAP_IPC_LOCK would
// lift the limit, so the test drops it from this thread's effective set for the duration
// (capabilities are per thread; the goroutine is locked to it) and restores both after.
func TestRegMRUnderMemlock(t *testing.T) {
	p := New(Options{})
	devs, err := p.Devices()
	if err != nil || len(devs) == 0 {
		t.Skipf("no RDMA device here: %v", err)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var caps [2]unix.CapUserData
	if err := unix.Capget(&hdr, &caps[0]); err != nil {
		t.Fatal(err)
	}
	const ipcLock = 1 << unix.CAP_IPC_LOCK
	if caps[0].Effective&ipcLock != 0 {
		saved := caps
		caps[0].Effective &^= ipcLock
		if err := unix.Capset(&hdr, &caps[0]); err != nil {
			t.Fatalf("drop CAP_IPC_LOCK: %v", err)
		}
		defer unix.Capset(&hdr, &saved[0])
	}
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &old); err != nil {
		t.Fatal(err)
	}
	low := unix.Rlimit{Cur: 64 << 10, Max: old.Max}
	if err := unix.Setrlimit(unix.RLIMIT_MEMLOCK, &low); err != nil {
		t.Fatal(err)
	}
	defer unix.Setrlimit(unix.RLIMIT_MEMLOCK, &old)
	ctx, err := p.Open(devs[0].Name)
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	pd, err := ctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	defer pd.Close()
	buf, err := verbs.AllocBuffer(16 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Free()
	mr, err := pd.RegMR(buf.Bytes(), verbs.AccessLocalWrite)
	if err == nil {
		mr.Close()
		t.Fatal("registered 16 MiB under a 64 KiB memlock limit without CAP_IPC_LOCK")
	}
	oneLine(t, err)
	if !errors.Is(err, verbs.ErrMemlock) || !strings.Contains(err.Error(), "ulimit -l 64") {
		t.Fatalf("reason does not name the limit: %v", err)
	}
	t.Logf("reported: %v", err)
}
