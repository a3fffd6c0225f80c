package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/dfkv/dfkv/go/client"
	"github.com/dfkv/dfkv/go/internal/transport/rdma/verbs/soft"
)

// Direct loads (GETs into registered device memory, issue 32) over the provider under
// test. The "device" allocation is a stand-in: a memfd the test maps itself. The client
// registers the memfd as a DMA-BUF; the NIC (the soft provider maps the buffer on its own)
// writes the bytes, which the test then checks through its own mapping — never in a host
// staging buffer. On a real GPU the same code path takes a CUDA allocation's DMA-BUF.

// devMem is one stand-in device allocation: fd (the DMA-BUF) and the test's own mapping.
type devMem struct {
	fd   int
	mem  []byte
	iova uint64
}

func newDevMem(t *testing.T, size int) *devMem {
	t.Helper()
	fd, err := unix.MemfdCreate("dfkv-dev", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		t.Fatal(err)
	}
	m, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	d := &devMem{fd: fd, mem: m, iova: uint64(uintptr(unsafe.Pointer(&m[0])))}
	t.Cleanup(func() {
		unix.Munmap(m)
		unix.Close(fd)
	})
	return d
}

func (d *devMem) fill(b byte) {
	for i := range d.mem {
		d.mem[i] = b
	}
}

// untouched fails unless every byte of d outside the [off, off+n) spans is b.
func (d *devMem) untouched(t *testing.T, b byte, spans [][2]int) {
	t.Helper()
	in := make([]bool, len(d.mem)/4096+1)
	for _, s := range spans {
		for p := s[0] / 4096; p <= (s[0]+s[1]-1)/4096; p++ {
			in[p] = true
		}
	}
	for p := range in {
		if in[p] {
			continue
		}
		lo, hi := p*4096, min((p+1)*4096, len(d.mem))
		for i := lo; i < hi; i++ {
			if d.mem[i] != b {
				t.Fatalf("device byte %d is %#x, outside every target (a stray write)", i, d.mem[i])
			}
		}
	}
}

type directRig struct {
	s   *serverProc
	c   *client.Client
	dev *devMem
	src []byte // registered host memory the values are PUT from (no staging)
	dir string
}

// newDirectRig starts a server (64 MiB values over RDMA) and a client with a registered
// 160 MiB device buffer and a registered 64 MiB host source.
func newDirectRig(t *testing.T, serverExtra []string, o client.RDMAOptions) *directRig {
	t.Helper()
	dir := t.TempDir()
	s := startServer(t, dir, rdmaArgs(append([]string{"--cap", "1GiB", "--max-msg", "64MiB",
		"--rdma-segment", "160MiB", "--rdma-depth", "2"}, serverExtra...)...)...)
	ms, err := client.NewStatic([]client.Member{{ID: "n1", Addr: s.addr, Weight: 100}})
	if err != nil {
		t.Fatal(err)
	}
	o.Provider, o.MaxBlock, o.Depth = rdmaProvider, 64<<20, 2
	c, err := client.New(client.Options{Membership: ms, Namespace: []byte("direct"), IOTimeout: fabricTimeout(20 * time.Second),
		RDMA: &o})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	r := &directRig{s: s, c: c, dev: newDevMem(t, 160<<20), dir: dir}
	buf, err := unix.Mmap(-1, 0, 64<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(buf) })
	r.src = buf
	if err := c.RegisterMemory(r.src); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *directRig) put(t *testing.T, key string, val []byte) {
	t.Helper()
	copy(r.src, val)
	if err := r.c.Put(t.Context(), []byte(key), r.src[:len(val)]); err != nil {
		t.Fatalf("put %s: %v", key, err)
	}
}

// Values of 4 KiB to 64 MiB GET into the device buffer byte-exact through the scalar,
// batch and scatter-gather forms; nothing goes through staging or an ad-hoc MR, nothing
// lands outside the targets, and the direct counters account for every load. A miss is
// a clean NotFound that writes nothing.
func TestRDMADirectLoads(t *testing.T) {
	softOnly(t) // a memfd is a DMA-BUF only to the soft NIC; the guest's udmabuf test is TestRDMADirectIbverbs
	r := newDirectRig(t, nil, client.RDMAOptions{})
	ctx := t.Context()
	c, dev := r.c, r.dev
	if err := c.RegisterDMABuf(dev.fd, 0, uint64(len(dev.mem)), dev.iova); err != nil {
		t.Fatal(err)
	}
	dev.fill(0xee)
	sizes := []int{4 << 10, 4<<10 + 13, 64 << 10, 1 << 20, 8 << 20, 64 << 20}
	vals := map[string][]byte{}
	for i, n := range sizes {
		k := fmt.Sprintf("v%d", i)
		vals[k] = rnd(n, uint64(100+i))
		r.put(t, k, vals[k])
	}
	var spans [][2]int
	var loads, moved float64
	check := func(what string, off int, want []byte) {
		t.Helper()
		if !bytes.Equal(dev.mem[off:off+len(want)], want) {
			t.Fatalf("%s: wrong bytes in device memory at %d (%d bytes)", what, off, len(want))
		}
		spans = append(spans, [2]int{off, len(want)})
	}
	// Scalar: Get (exact) and GetAuto at odd offsets.
	off := 4096 + 7
	for i, n := range sizes {
		k := fmt.Sprintf("v%d", i)
		dst := dev.mem[off : off+n]
		if i%2 == 0 {
			if err := c.Get(ctx, []byte(k), dst); err != nil {
				t.Fatalf("get %s: %v", k, err)
			}
		} else {
			got, err := c.GetAuto(ctx, []byte(k), dev.mem[off:off+n+4096])
			if err != nil || got != n {
				t.Fatalf("get auto %s: %d, %v", k, got, err)
			}
		}
		check("scalar "+k, off, vals[k])
		loads, moved = loads+1, moved+float64(n)
		off += n + 8192
	}
	// Batch into one fresh region of the buffer (the small values).
	items := make([]client.Item, 4)
	base := off
	for i := range items {
		k := fmt.Sprintf("v%d", i)
		items[i] = client.Item{Key: []byte(k), Buf: dev.mem[off : off+len(vals[k])]}
		off += len(vals[k]) + 4096
	}
	if err := c.BatchGet(ctx, items, client.Exact); err != nil {
		t.Fatal(err)
	}
	off = base
	for i, it := range items {
		if it.Err != nil {
			t.Fatalf("batch item %d: %v", i, it.Err)
		}
		check(fmt.Sprintf("batch v%d", i), off, vals[string(it.Key)])
		loads, moved = loads+1, moved+float64(len(vals[string(it.Key)]))
		off += len(vals[string(it.Key)]) + 4096
	}
	// Scatter-gather: an 8 MiB value into 4 fragmented pieces (non-adjacent, in an order
	// unrelated to their addresses), as a KV block lands in per-layer K/V slots.
	v := vals["v4"]
	q := len(v) / 4
	pieceOff := []int{off + 3*(q+8192), off, off + 2*(q+8192), off + (q + 8192)}
	segs := make([][]byte, 4)
	for i := range segs {
		segs[i] = dev.mem[pieceOff[i] : pieceOff[i]+q]
	}
	if n, err := c.GetAutoSegs(ctx, []byte("v4"), segs); err != nil || n != len(v) {
		t.Fatalf("sg get: %d, %v", n, err)
	}
	for i := range segs {
		check(fmt.Sprintf("sg piece %d", i), pieceOff[i], v[i*q:(i+1)*q])
	}
	loads, moved = loads+1, moved+float64(len(v))
	// The same pieces through a batch SG item.
	dev.fill(0xee)
	spans = nil
	bitems := []client.Item{{Key: []byte("v4"), Segs: segs}}
	if err := c.BatchGet(ctx, bitems, client.Auto); err != nil || bitems[0].Err != nil || bitems[0].N != int64(len(v)) {
		t.Fatalf("batch sg: %v %v %d", err, bitems[0].Err, bitems[0].N)
	}
	for i := range segs {
		check(fmt.Sprintf("batch sg piece %d", i), pieceOff[i], v[i*q:(i+1)*q])
	}
	loads, moved = loads+1, moved+float64(len(v))
	// A miss writes nothing.
	dst := dev.mem[len(dev.mem)-8192 : len(dev.mem)-4096]
	if err := c.Get(ctx, []byte("absent"), dst); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("miss: %v", err)
	}
	dev.untouched(t, 0xee, spans)

	for name, want := range map[string]float64{
		"dfkv_rdma_staged_ops_total": 0, "dfkv_rdma_mr_adhoc_registrations_total": 0,
		"dfkv_rdma_direct_gets_total": loads, "dfkv_rdma_direct_bytes_total": moved,
		"dfkv_rdma_direct_failures_total": 0, "dfkv_rdma_direct_refused_total": 0,
		"dfkv_rdma_dmabuf_registrations_total": 1, "dfkv_rdma_dmabuf_bytes": float64(len(dev.mem)),
		`dfkv_client_direct_loads_total{result="ok"}`:   loads,
		`dfkv_client_direct_loads_total{result="miss"}`: 1,
	} {
		if got := snapshotValue(c, name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if got := snapshotValue(c, "dfkv_rdma_direct_transfer_seconds_total"); got <= 0 {
		t.Errorf("direct transfer time %v", got)
	}
	// A PUT from device memory is refused (the TCP path would read it on the host).
	if err := c.Put(ctx, []byte("from-dev"), dev.mem[:4096]); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("put from device memory: %v", err)
	}
	// A piece straddling the registered range's end is invalid, not a partial direct load.
	if err := c.RegisterDMABuf(dev.fd, 0, 1<<20, dev.iova+uint64(len(dev.mem))); err != nil {
		t.Fatalf("a second, adjacent registration: %v", err)
	}
	if err := c.UnregisterDMABuf(dev.iova+uint64(len(dev.mem)), 1<<20); err != nil {
		t.Fatal(err)
	}
	if err := c.RegisterDMABuf(dev.fd, 0, 4096, dev.iova+4096); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("an overlapping registration: %v", err)
	}
	if err := c.UnregisterDMABuf(dev.iova, uint64(len(dev.mem))); err != nil {
		t.Fatal(err)
	}
	if err := c.UnregisterDMABuf(dev.iova, uint64(len(dev.mem))); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("second unregister: %v", err)
	}
	if got := snapshotValue(c, "dfkv_rdma_dmabuf_bytes"); got != 0 {
		t.Fatalf("dmabuf bytes after unregister: %v", got)
	}
}

// UnregisterDMABuf while a direct GET targets the range waits for it (the server's port
// stalls: its WRITEs and reply stay queued), then succeeds once the port is back; the GET lands byte-exact. While it waits, a new
// direct GET into the range is refused at once (never sent over TCP).
func TestRDMADirectUnregisterWaits(t *testing.T) {
	softOnly(t)
	faults := filepath.Join(t.TempDir(), "faults")
	if err := os.WriteFile(faults, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("DFKV_SOFT_RDMA_FAULTS", faults) // the server inherits it
	r := newDirectRig(t, nil, client.RDMAOptions{})
	c, dev := r.c, r.dev
	if err := c.RegisterDMABuf(dev.fd, 0, uint64(len(dev.mem)), dev.iova); err != nil {
		t.Fatal(err)
	}
	val := rnd(1<<20, 5)
	r.put(t, "k", val)
	if err := c.Get(t.Context(), []byte("k"), dev.mem[:len(val)]); err != nil { // the connection is up
		t.Fatal(err)
	}
	clear(dev.mem[:len(val)])
	const hold = 1500 * time.Millisecond
	if err := soft.WriteFaults(faults, "soft0 port stall\n"); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { got <- c.Get(t.Context(), []byte("k"), dev.mem[:len(val)]) }()
	time.Sleep(200 * time.Millisecond) // the GET is posted and held
	t0 := time.Now()
	uerr := make(chan error, 1)
	go func() { uerr <- c.UnregisterDMABuf(dev.iova, uint64(len(dev.mem))) }()
	time.Sleep(100 * time.Millisecond)
	select {
	case err := <-uerr:
		t.Fatalf("unregister returned (%v) while a GET into the range was held", err)
	default:
	}
	// Leaving: a new GET into the range is refused, not served another way.
	t1 := time.Now()
	if err := c.Get(t.Context(), []byte("k"), dev.mem[2<<20:2<<20+len(val)]); !errors.Is(err, client.ErrDirectUnsupported) {
		t.Fatalf("a GET into a range being unregistered: %v", err)
	}
	if d := time.Since(t1); d > 100*time.Millisecond {
		t.Fatalf("the refusal of a GET into a range being unregistered took %v", d)
	}
	time.Sleep(hold - time.Since(t0))
	if err := soft.WriteFaults(faults, "soft0 port up\n"); err != nil {
		t.Fatal(err)
	}
	if err := <-uerr; err != nil {
		t.Fatalf("unregister: %v", err)
	}
	waited := time.Since(t0)
	if err := <-got; err != nil {
		t.Fatalf("the held GET: %v", err)
	}
	if !bytes.Equal(dev.mem[:len(val)], val) {
		t.Fatal("the held GET left wrong bytes")
	}
	if waited < hold {
		t.Fatalf("unregister returned after %v, before the held GET completed (held %v)", waited, hold)
	}
}

// A failed load leaves no transfer aimed at the memory: an injected completion error on
// the server's NIC, then a server killed mid-load. Each GET fails as a load failure (not a
// refusal, not wrong bytes), counted; UnregisterDMABuf then returns promptly, and after it
// nothing writes into the freed range.
func TestRDMADirectFailures(t *testing.T) {
	softOnly(t)
	faults := filepath.Join(t.TempDir(), "faults")
	if err := os.WriteFile(faults, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("DFKV_SOFT_RDMA_FAULTS", faults)
	r := newDirectRig(t, nil, client.RDMAOptions{})
	c, dev := r.c, r.dev
	if err := c.RegisterDMABuf(dev.fd, 0, uint64(len(dev.mem)), dev.iova); err != nil {
		t.Fatal(err)
	}
	val := rnd(8<<20, 9)
	r.put(t, "k", val)
	if err := c.Get(t.Context(), []byte("k"), dev.mem[:len(val)]); err != nil {
		t.Fatal(err)
	}

	// Injected completion errors on every WRITE the server posts.
	if err := soft.WriteFaults(faults, "soft0 comp_err 1000\n"); err != nil {
		t.Fatal(err)
	}
	err := c.Get(t.Context(), []byte("k"), dev.mem[:len(val)])
	if err == nil || errors.Is(err, client.ErrDirectUnsupported) || errors.Is(err, client.ErrNotFound) {
		t.Fatalf("GET under injected completion errors: %v (want a load failure)", err)
	}
	if snapshotValue(c, "dfkv_rdma_direct_failures_total") < 1 && snapshotValue(c, `dfkv_client_direct_loads_total{result="error"}`) < 1 {
		t.Fatalf("the failed load was not counted:\n%s", c.Snapshot())
	}
	if err := soft.WriteFaults(faults, ""); err != nil {
		t.Fatal(err)
	}
	// The client recovers: a fresh connection loads byte-exact.
	clear(dev.mem[:len(val)])
	deadline := time.Now().Add(fabricTimeout(15 * time.Second))
	for {
		err := c.Get(t.Context(), []byte("k"), dev.mem[:len(val)])
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no recovery after the fault cleared: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !bytes.Equal(dev.mem[:len(val)], val) {
		t.Fatal("wrong bytes after recovery")
	}

	// The server killed while its port holds a load's WRITEs.
	if err := soft.WriteFaults(faults, "soft0 port stall\n"); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { got <- c.Get(t.Context(), []byte("k"), dev.mem[32<<20:32<<20+len(val)]) }()
	time.Sleep(300 * time.Millisecond)
	r.s.kill()
	select {
	case err := <-got:
		if err == nil || errors.Is(err, client.ErrDirectUnsupported) {
			t.Fatalf("GET from a killed server: %v (want a load failure)", err)
		}
	case <-time.After(fabricTimeout(25 * time.Second)):
		t.Fatal("GET from a killed server did not return")
	}
	t0 := time.Now()
	if err := c.UnregisterDMABuf(dev.iova, uint64(len(dev.mem))); err != nil {
		t.Fatalf("unregister after failed loads: %v", err)
	}
	if d := time.Since(t0); d > 5*time.Second {
		t.Fatalf("unregister took %v after the loads failed", d)
	}
	// "Freed": nothing may write there any more.
	dev.fill(0x5a)
	time.Sleep(500 * time.Millisecond)
	dev.untouched(t, 0x5a, nil)
}

// A server that does not accept device targets gets a refusal (ErrDirectUnsupported,
// naming why), never a TCP or host-staging fallback: the device memory is untouched. A
// client without RDMA and a NIC that cannot import DMA-BUFs refuse the registration.
func TestRDMADirectRefusals(t *testing.T) {
	softOnly(t)
	r := newDirectRig(t, []string{"--rdma-device-targets=false"}, client.RDMAOptions{})
	c, dev := r.c, r.dev
	if err := c.RegisterDMABuf(dev.fd, 0, uint64(len(dev.mem)), dev.iova); err != nil {
		t.Fatal(err)
	}
	dev.fill(0xee)
	val := rnd(1<<20, 3)
	r.put(t, "k", val)
	err := c.Get(t.Context(), []byte("k"), dev.mem[:len(val)])
	if !errors.Is(err, client.ErrDirectUnsupported) || !strings.Contains(err.Error(), "device targets") {
		t.Fatalf("direct GET from a server without device targets: %v", err)
	}
	items := []client.Item{{Key: []byte("k"), Buf: dev.mem[:len(val)]}}
	if err := c.BatchGet(t.Context(), items, client.Exact); err != nil || !errors.Is(items[0].Err, client.ErrDirectUnsupported) {
		t.Fatalf("direct batch GET from a server without device targets: %v / %v", err, items[0].Err)
	}
	dev.untouched(t, 0xee, nil)
	if got := snapshotValue(c, `dfkv_client_direct_loads_total{result="refused"}`); got != 2 {
		t.Fatalf("refused loads %v, want 2", got)
	}
	// Host memory still loads from it.
	host := make([]byte, len(val))
	if err := c.Get(t.Context(), []byte("k"), host); err != nil || !bytes.Equal(host, val) {
		t.Fatalf("host GET: %v", err)
	}

	// No RDMA: nothing could ever write device memory.
	ms, err := client.NewStatic([]client.Member{{ID: "n1", Addr: r.s.addr, Weight: 100}})
	if err != nil {
		t.Fatal(err)
	}
	tc, err := client.New(client.Options{Membership: ms})
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	if err := tc.RegisterDMABuf(dev.fd, 0, 4096, dev.iova); !errors.Is(err, client.ErrDirectUnsupported) {
		t.Fatalf("register without RDMA: %v", err)
	}
	// A NIC without DMA-BUF import.
	nc, err := client.New(client.Options{Membership: ms, RDMA: &client.RDMAOptions{Provider: rdmaProvider, SoftNoDMABuf: true}})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	err = nc.RegisterDMABuf(dev.fd, 0, 4096, dev.iova)
	if !errors.Is(err, client.ErrDirectUnsupported) || !strings.Contains(err.Error(), "EOPNOTSUPP") {
		t.Fatalf("register on a NIC without DMA-BUF: %v", err)
	}
	if got := snapshotValue(nc, "dfkv_rdma_dmabuf_registration_failures_total"); got != 1 {
		t.Fatalf("registration failures %v, want 1", got)
	}
	// Bad arguments.
	if err := c.RegisterDMABuf(-1, 0, 4096, dev.iova); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("bad fd: %v", err)
	}
	if err := c.UnregisterDMABuf(dev.iova+4096, 4096); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("unknown range: %v", err)
	}
}

// udmabufCreate is UDMABUF_CREATE (_IOW('u', 0x42, struct udmabuf_create)).
const udmabufCreate = 0x40187542

// newUDMABuf makes a real DMA-BUF (a udmabuf over a sealed memfd, the kernel's stand-in
// for device memory) and maps the memfd as the "device" allocation; skipped where the
// kernel has no /dev/udmabuf (Debian 12's 6.1: the host; the Soft-RoCE guest has it).
func newUDMABuf(t *testing.T, size int) *devMem {
	t.Helper()
	u, err := unix.Open("/dev/udmabuf", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Skipf("no udmabuf here (%v): the soft-provider stand-in (TestRDMADirectLoads) covers the path; the Soft-RoCE guest runs this", err)
	}
	defer unix.Close(u)
	mfd, err := unix.MemfdCreate("dfkv-udmabuf", unix.MFD_ALLOW_SEALING|unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(mfd) })
	if err := unix.Ftruncate(mfd, int64(size)); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.FcntlInt(uintptr(mfd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK); err != nil {
		t.Fatal(err)
	}
	arg := struct {
		memfd, flags uint32
		offset, size uint64
	}{memfd: uint32(mfd), flags: 1 /* UDMABUF_FLAGS_CLOEXEC */, size: uint64(size)}
	fd, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(u), udmabufCreate, uintptr(unsafe.Pointer(&arg)))
	if errno != 0 {
		t.Fatalf("UDMABUF_CREATE: %v", errno)
	}
	m, err := unix.Mmap(mfd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	d := &devMem{fd: int(fd), mem: m, iova: uint64(uintptr(unsafe.Pointer(&m[0])))}
	t.Cleanup(func() {
		unix.Munmap(m)
		unix.Close(int(fd))
	})
	return d
}

// A real DMA-BUF through the provider under test (in CI: ibverbs on rxe in the Soft-RoCE
// guest, whose kernel has udmabuf). Either the NIC imports it and values load into it
// byte-exact, or it refuses: then RegisterDMABuf fails with ErrDirectUnsupported carrying
// the driver's exact errno (rxe answers EOPNOTSUPP, 95), the failure is counted, and the
// range is not direct (nothing is registered that could be written).
func TestRDMADirectDMABuf(t *testing.T) {
	dev := newUDMABuf(t, 16<<20)
	r := newDirectRig(t, nil, client.RDMAOptions{})
	c := r.c
	err := c.RegisterDMABuf(dev.fd, 0, uint64(len(dev.mem)), dev.iova)
	if err != nil {
		var errno unix.Errno
		if !errors.Is(err, client.ErrDirectUnsupported) || !errors.As(err, &errno) {
			t.Fatalf("register udmabuf over %s: %v (want a refusal naming the errno, or success)", rdmaProvider, err)
		}
		t.Logf("%s refuses DMA-BUF registration: errno %d (%v): %v", rdmaProvider, int(errno), errno, err)
		if rdmaProvider == "ibverbs" && errno != unix.EOPNOTSUPP {
			t.Logf("note: errno %d is not rxe's EOPNOTSUPP", int(errno))
		}
		if got := snapshotValue(c, "dfkv_rdma_dmabuf_registration_failures_total"); got != 1 {
			t.Fatalf("registration failures %v, want 1", got)
		}
		if got := snapshotValue(c, "dfkv_rdma_dmabuf_bytes"); got != 0 {
			t.Fatalf("dmabuf bytes %v after a refusal", got)
		}
		if err := c.UnregisterDMABuf(dev.iova, uint64(len(dev.mem))); !errors.Is(err, client.ErrInvalid) {
			t.Fatalf("unregister of a refused registration: %v", err)
		}
		return
	}
	t.Logf("%s imports the udmabuf", rdmaProvider)
	dev.fill(0xee)
	var spans [][2]int
	off := 0
	for i, n := range []int{4 << 10, 1 << 20, 8 << 20} {
		k := fmt.Sprintf("u%d", i)
		v := rnd(n, uint64(i+40))
		r.put(t, k, v)
		if err := c.Get(t.Context(), []byte(k), dev.mem[off:off+n]); err != nil {
			t.Fatalf("direct get %s: %v", k, err)
		}
		if !bytes.Equal(dev.mem[off:off+n], v) {
			t.Fatalf("%s: wrong bytes in the udmabuf", k)
		}
		spans = append(spans, [2]int{off, n})
		off += n + 4096
	}
	dev.untouched(t, 0xee, spans)
	if got := snapshotValue(c, "dfkv_rdma_staged_ops_total"); got != 0 {
		t.Fatalf("%v staged ops", got)
	}
	if err := c.UnregisterDMABuf(dev.iova, uint64(len(dev.mem))); err != nil {
		t.Fatal(err)
	}
}
