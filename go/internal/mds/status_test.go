package mds

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/dfkv/dfkv/go/identity"
	"github.com/dfkv/dfkv/go/internal/server"
	"github.com/dfkv/dfkv/go/internal/store"
	"github.com/dfkv/dfkv/go/internal/wire"
	"github.com/dfkv/dfkv/go/internal/wire/fb"
)

// nodeMetrics serves a real server.Metrics registry over a memory engine, like a node's
// metrics listener, with a switchable /readyz.
func nodeMetrics(t *testing.T, ready *atomic.Pointer[string]) (*httptest.Server, store.Engine) {
	t.Helper()
	eng := store.NewMem(8 << 20)
	reg := prometheus.NewRegistry()
	server.NewMetrics(reg, eng)
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if why := ready.Load(); why != nil {
			http.Error(w, "not ready: "+*why, http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ready\n")
	})
	ts := httptest.NewServer(mux)
	t.Cleanup(ts.Close)
	return ts, eng
}

func getPage(t *testing.T, h http.Handler) string {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/status", nil))
	if rec.Code != http.StatusOK || !strings.HasPrefix(rec.Header().Get("Content-Type"), "text/html") {
		t.Fatalf("status page: %d %s", rec.Code, rec.Header().Get("Content-Type"))
	}
	return rec.Body.String()
}

// rowOf returns the table row of a member.
func rowOf(t *testing.T, page, id string) string {
	t.Helper()
	i := strings.Index(page, `data-member="`+id+`"`)
	if i < 0 {
		t.Fatalf("member %s not on the page:\n%s", id, page)
	}
	j := strings.Index(page[i:], "</tr>")
	return page[i : i+j]
}

func TestStatusPage(t *testing.T) {
	svc, _, _ := newTestService(t)
	var readyA, readyB atomic.Pointer[string]
	a, engA := nodeMetrics(t, &readyA)
	b, _ := nodeMetrics(t, &readyB)
	if err := engA.Put(store.Key{ID: identity.ObjectID{Hi: 1, Lo: 2}}, 1000, func(dst []byte) error { return nil }); err != nil {
		t.Fatal(err)
	}
	reg := func(id string, ts *httptest.Server, weight uint32) {
		m := member(id, "127.0.0.1:1"+id[1:])
		m.Weight = weight
		if ts != nil {
			m.Config = append(m.Config, wire.KV{Key: MetricsAddrKey, Value: strings.TrimPrefix(ts.URL, "http://")})
		}
		if id == "n1" {
			m.Rails = []wire.Rail{
				{Device: "mlx5_0", PortState: 4, PhysState: 5, QueryOK: true, Health: fb.RailHealthHealthy, Generation: 1},
				{Device: "mlx5_1", PortState: 1, PhysState: 3, QueryOK: true, Tier: 1, Health: fb.RailHealthDown, Generation: 2},
				{Device: "mlx5_2", PortState: 4, PhysState: 5, QueryOK: true, Tier: 1, Health: fb.RailHealthQuarantined, Generation: 3},
			}
		}
		if r := call(t, svc, wire.MdsRequest{Op: fb.MdsOpRegisterMember, Member: m}); r.Status != fb.StatusOk {
			t.Fatalf("register %s: %+v", id, r)
		}
	}
	reg("n1", a, 3)
	reg("n2", b, 1)
	reg("n3", nil, 1)
	if r := call(t, svc, wire.MdsRequest{Op: fb.MdsOpRegisterClient, Client: &wire.ClientInfo{ID: "sglang-7", Hostname: "gpu-host-1", PID: 4242}}); r.Status != fb.StatusOk {
		t.Fatalf("register client: %+v", r)
	}
	etcdErr := error(nil)
	p, err := NewStatusPage(StatusConfig{Service: svc, EtcdReady: func() error { return etcdErr }, Version: "vtest",
		PollInterval: 50 * time.Millisecond, ScrapeTimeout: time.Second, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	page := getPage(t, p)
	for _, want := range []string{`<meta http-equiv="refresh" content="1">`, "vtest", `id="etcd">healthy`, "sglang-7", "gpu-host-1", "4242",
		`id="nodes-up">2 / 3`, "members epoch"} {
		if !strings.Contains(page, want) {
			t.Fatalf("page lacks %q:\n%s", want, page)
		}
	}
	if strings.Contains(page, "<script") {
		t.Fatal("the status page must work without JavaScript")
	}
	r1 := rowOf(t, page, "n1")
	for _, want := range []string{`data-state="up"`, "127.0.0.1:11", "8.0 MiB", ">3<", "v1",
		"rail mlx5_0: healthy (tier 0, port state 4)", "rail mlx5_1: down (tier 1, port state 1)", "rail mlx5_2: quarantined (tier 1, port state 4)"} {
		if !strings.Contains(r1, want) {
			t.Fatalf("n1 row lacks %q: %s", want, r1)
		}
	}
	if !strings.Contains(rowOf(t, page, "n3"), `data-state="unknown"`) {
		t.Fatalf("n3 without a metrics address: %s", rowOf(t, page, "n3"))
	}
	// Weight 3 of 5: the ring share is near 60%.
	if !strings.Contains(r1, "%</td>") {
		t.Fatalf("n1 row has no share: %s", r1)
	}

	// n2 stops answering readiness, then dies; etcd goes down.
	why := "store unhealthy"
	readyB.Store(&why)
	time.Sleep(60 * time.Millisecond) // let the poll interval pass (the page caches scrapes)
	if r2 := rowOf(t, getPage(t, p), "n2"); !strings.Contains(r2, `data-state="not ready"`) || !strings.Contains(r2, "store unhealthy") {
		t.Fatalf("n2 should be not ready: %s", r2)
	}
	b.Close()
	etcdErr = errors.New("etcd unreachable")
	time.Sleep(60 * time.Millisecond)
	page = getPage(t, p)
	if r2 := rowOf(t, page, "n2"); !strings.Contains(r2, `data-state="down"`) || !strings.Contains(page, `class="row-down" data-member="n2"`) {
		t.Fatalf("n2 should be down: %s", r2)
	}
	if !strings.Contains(page, `id="etcd">down`) || !strings.Contains(page, "etcd unreachable") {
		t.Fatalf("etcd should show down:\n%s", page)
	}
	if !strings.Contains(page, `id="nodes-up">1 / 3`) {
		t.Fatal("nodes-up count did not drop")
	}
}

func TestHumanBytes(t *testing.T) {
	for _, c := range []struct {
		in   float64
		want string
	}{{0, "0 B"}, {1023, "1023 B"}, {1024, "1.0 KiB"}, {8 << 20, "8.0 MiB"}, {1.5 * (1 << 40), "1.5 TiB"}} {
		if got := humanBytes(c.in); got != c.want {
			t.Errorf("humanBytes(%v) = %q, want %q", c.in, got, c.want)
		}
	}
}

// TestStatusPageEtcdDownAndConcurrentViews: with the store down the page still renders
// (the group shows the error), and concurrent viewers share the node scrapes safely.
func TestStatusPageEtcdDownAndConcurrentViews(t *testing.T) {
	svc, st, _ := newTestService(t)
	var ready atomic.Pointer[string]
	ts, _ := nodeMetrics(t, &ready)
	m := member("n1", "127.0.0.1:11")
	m.Config = append(m.Config, wire.KV{Key: MetricsAddrKey, Value: strings.TrimPrefix(ts.URL, "http://")})
	if r := call(t, svc, wire.MdsRequest{Op: fb.MdsOpRegisterMember, Member: m}); r.Status != fb.StatusOk {
		t.Fatalf("register: %+v", r)
	}
	p, err := NewStatusPage(StatusConfig{Service: svc, PollInterval: time.Millisecond, Logger: quiet(),
		Groups: func() []string { return []string{"other", DefaultGroup} }})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rec := httptest.NewRecorder()
			p.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/status", nil))
			if !strings.Contains(rec.Body.String(), `data-member="n1" data-state="up"`) {
				t.Errorf("concurrent view lacks n1 up:\n%s", rec.Body.String())
			}
		}()
	}
	wg.Wait()
	page := getPage(t, p)
	if !strings.Contains(page, "Group <span class=\"mono\">other</span>") || !strings.Contains(page, "No members registered.") {
		t.Fatalf("an empty group should be listed as empty:\n%s", page)
	}
	st.SetDown(true)
	page = getPage(t, p)
	if !strings.Contains(page, `<span class="badge down">list members of default`) {
		t.Fatalf("store down: the group should show the listing error:\n%s", page)
	}
}
