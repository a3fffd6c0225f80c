//go:build ops

package ops

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dfkv/dfkv/go/client"
	"github.com/dfkv/dfkv/go/internal/opsdash"
)

const (
	scrapeInterval = time.Second
	statusPoll     = time.Second
	alertFor       = 3 * time.Second // every for: in the rules, shortened for the test
	rateWindow     = "15s"           // stands in for Grafana's $__rate_interval
)

var repoRoot = func() string { r, _ := filepath.Abs("../../.."); return r }()

// tool finds a required program; outside CI a missing one skips the test, in CI it fails.
func tool(t *testing.T, names ...string) string {
	t.Helper()
	for _, n := range names {
		if p, err := exec.LookPath(n); err == nil {
			return p
		}
	}
	msg := fmt.Sprintf("%s not installed (Debian: apt-get install prometheus chromium; tools/test.sh does it)", names[0])
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func port(addr string) string { _, p, _ := net.SplitHostPort(addr); return p }

type proc struct {
	name   string
	cmd    *exec.Cmd
	log    *bytes.Buffer
	mu     *sync.Mutex
	exited chan struct{}
}

type lockedBuf struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (l lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.b.Len() > 4<<20 {
		return len(p), nil
	}
	return l.b.Write(p)
}

func start(t *testing.T, name, bin string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, cmd: exec.Command(bin, args...), log: &bytes.Buffer{}, mu: &sync.Mutex{}, exited: make(chan struct{})}
	w := lockedBuf{p.mu, p.log}
	p.cmd.Stdout, p.cmd.Stderr = w, w
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() { _ = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("--- %s log (tail):\n%s", name, p.tail(3000))
		}
	})
	return p
}

func (p *proc) kill() {
	select {
	case <-p.exited:
	default:
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		<-p.exited
	}
}

func (p *proc) tail(n int) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.log.String()
	if len(s) > n {
		s = s[len(s)-n:]
	}
	return s
}

// waitFor polls cond every 100ms until it holds or the deadline passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	last := ""
	for {
		ok, why := cond()
		if ok {
			return
		}
		last = why
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v (last: %s)", what, d, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func readAddrFile(t *testing.T, p *proc, path string) string {
	t.Helper()
	var addr string
	waitFor(t, 60*time.Second, p.name+" listening", func() (bool, string) {
		select {
		case <-p.exited:
			t.Fatalf("%s exited at start:\n%s", p.name, p.tail(3000))
		default:
		}
		b, err := os.ReadFile(path)
		addr = strings.TrimSpace(string(b))
		return err == nil && addr != "", fmt.Sprint(err)
	})
	return addr
}

func binaries(t *testing.T) string {
	t.Helper()
	if d := os.Getenv("DFKV_BIN_DIR"); d != "" {
		return d
	}
	dir := t.TempDir()
	for pkg, bin := range map[string]string{"server": "dfkv_server", "mds": "dfkv_mds"} {
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, bin), "./go/cmd/"+pkg)
		cmd.Dir = repoRoot
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", pkg, err, out)
		}
	}
	return dir
}

// promQuery evaluates expr now and returns the result vector.
func promQuery(t *testing.T, prom, expr string) ([]map[string]any, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+prom+"/api/v1/query?query="+url.QueryEscape(expr), nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string           `json:"resultType"`
			Result     []map[string]any `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 8<<20)).Decode(&r); err != nil {
		return nil, err
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("query %q: %s", expr, r.Error)
	}
	return r.Data.Result, nil
}

type alert struct {
	Labels   map[string]string `json:"labels"`
	State    string            `json:"state"`
	ActiveAt time.Time         `json:"activeAt"` // when it turned pending; it fires for: later
}

func promAlerts(t *testing.T, prom string) []alert {
	t.Helper()
	resp, err := http.Get("http://" + prom + "/api/v1/alerts")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var r struct {
		Data struct {
			Alerts []alert `json:"alerts"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		t.Fatal(err)
	}
	return r.Data.Alerts
}

// chromium renders url headless and returns the DOM; with shot set it also saves a PNG.
func chromium(t *testing.T, bin, profile, u, shot string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	args := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
		"--hide-scrollbars", "--user-data-dir=" + profile, "--window-size=1500,1000"}
	if shot != "" {
		args = append(args, "--screenshot="+shot)
	} else {
		args = append(args, "--dump-dom")
	}
	var out, errb bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, append(args, u)...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium %s: %v\n%s", u, err, errb.String())
	}
	return out.String()
}

var rowRE = regexp.MustCompile(`data-member="([^"]+)" data-state="([^"]+)"`)

func memberStates(dom string) map[string]string {
	out := map[string]string{}
	for _, m := range rowRE.FindAllStringSubmatch(dom, -1) {
		out[m[1]] = m[2]
	}
	return out
}

func TestOperatorView(t *testing.T) {
	promBin := tool(t, "prometheus")
	chromeBin := tool(t, "chromium", "chromium-browser", "google-chrome")
	bins := binaries(t)
	dir := t.TempDir()

	// --- MDS (embedded etcd) and three nodes with every optional layer on ---
	mdsMetrics := freeAddr(t)
	mds := start(t, "dfkv_mds", filepath.Join(bins, "dfkv_mds"), "--host", "127.0.0.1", "--listen", "0",
		"--addr-file", filepath.Join(dir, "mds.addr"), "--etcd", "embedded:"+filepath.Join(dir, "etcd"),
		"--etcd-client-addr", freeAddr(t), "--etcd-peer-addr", freeAddr(t), "--metrics-port", port(mdsMetrics),
		"--lease-ttl", "30s", "--status-poll", statusPoll.String(), "--log-level", "warn")
	mdsAddr := readAddrFile(t, mds, filepath.Join(dir, "mds.addr"))
	quotaFile := filepath.Join(dir, "quota")
	if err := os.WriteFile(quotaFile, []byte("ops-e2e 1073741824\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	type node struct {
		id, metrics, accessLog string
		p                      *proc
	}
	var nodes []*node
	for i := 1; i <= 3; i++ {
		n := &node{id: fmt.Sprintf("n%d", i), metrics: freeAddr(t), accessLog: filepath.Join(dir, fmt.Sprintf("access-n%d.log", i))}
		addrFile := filepath.Join(dir, n.id+".addr")
		n.p = start(t, n.id, filepath.Join(bins, "dfkv_server"), "--host", "127.0.0.1", "--port", "0", "--addr-file", addrFile,
			"--dir", filepath.Join(dir, n.id), "--cap", "64MiB", "--extent-size", "8MiB", "--max-msg", "1MiB", "--metrics-port", port(n.metrics),
			"--mds", mdsAddr, "--id", n.id, "--advertise", "127.0.0.1:0", "--weight", strconv.Itoa(i),
			"--ram-tier", "--ram-tier-bytes", "8MiB", "--read-coalesce", "--quota-file", quotaFile,
			"--access-log", n.accessLog, "--log-level", "warn")
		readAddrFile(t, n.p, addrFile)
		nodes = append(nodes, n)
	}

	// --- a registered client under light, bounded load ---
	ms, err := client.NewMDSMembership(client.MDSOptions{Endpoints: []string{mdsAddr}, Poll: 500 * time.Millisecond,
		Register: true, ClientID: "ops-e2e-client", Info: nil})
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(client.Options{Membership: ms, Namespace: []byte("ops"), Tenant: []byte("ops-e2e"), IOTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	waitFor(t, 20*time.Second, "client sees 3 members", func() (bool, string) {
		v := ms.View()
		n := 0
		if v != nil {
			n = len(v.Members)
		}
		return n == 3, fmt.Sprint(n, " members")
	})
	loadCtx, stopLoad := context.WithTimeout(context.Background(), 3*time.Minute)
	defer stopLoad()
	var loadWG sync.WaitGroup
	var loadErr error
	var loadMu sync.Mutex
	loadWG.Add(1)
	go func() {
		defer loadWG.Done()
		val := bytes.Repeat([]byte("v"), 8192)
		buf := make([]byte, len(val))
		tick := time.NewTicker(5 * time.Millisecond) // ~200 ops/s at most: light and bounded
		defer tick.Stop()
		for i := 0; i < 60000; i++ {
			select {
			case <-loadCtx.Done():
				return
			case <-tick.C:
			}
			k := []byte(fmt.Sprintf("secret-prompt-%d", (i&^3)%300)) // GETs read the key the last PUT wrote
			var err error
			switch i % 4 {
			case 0:
				err = c.Put(context.Background(), k, val)
			case 1, 2:
				if err = c.Get(context.Background(), k, buf); errors.Is(err, client.ErrNotFound) {
					err = nil
				}
			case 3:
				if err = c.Get(context.Background(), []byte(fmt.Sprintf("never-written-%d", i)), buf); errors.Is(err, client.ErrNotFound) {
					err = nil
				}
			}
			if err != nil && loadCtx.Err() == nil {
				loadMu.Lock()
				if loadErr == nil {
					loadErr = err
				}
				loadMu.Unlock()
			}
		}
	}()

	// --- Prometheus scraping all four processes, with the real rules (for: shortened) ---
	rules, err := os.ReadFile(filepath.Join(repoRoot, "docs/ops/prometheus/dfkv-rules.yml"))
	if err != nil {
		t.Fatal(err)
	}
	shortened := regexp.MustCompile(`(?m)^(\s+for: )\S+$`).ReplaceAll(rules, []byte("${1}"+alertFor.String()))
	if bytes.Equal(shortened, rules) {
		t.Fatal("no for: durations found in dfkv-rules.yml")
	}
	if err := os.WriteFile(filepath.Join(dir, "dfkv-rules.yml"), shortened, 0o644); err != nil {
		t.Fatal(err)
	}
	var targets []string
	for _, n := range nodes {
		targets = append(targets, `"`+n.metrics+`"`)
	}
	cfg := fmt.Sprintf(`global:
  scrape_interval: %s
  scrape_timeout: %s
  evaluation_interval: %s
rule_files: [dfkv-rules.yml]
scrape_configs:
  - job_name: dfkv_server
    static_configs: [{targets: [%s]}]
  - job_name: dfkv_mds
    static_configs: [{targets: ["%s"]}]
`, scrapeInterval, scrapeInterval*9/10, scrapeInterval, strings.Join(targets, ", "), mdsMetrics)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	prom := freeAddr(t)
	start(t, "prometheus", promBin, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "tsdb"), "--web.listen-address="+prom, "--log.level=warn")
	waitFor(t, 60*time.Second, "Prometheus scrapes 4 targets up", func() (bool, string) {
		r, err := promQuery(t, prom, `sum(up{job=~"dfkv_server|dfkv_mds"}) == 4`)
		return err == nil && len(r) == 1, fmt.Sprint(r, err)
	})

	// --- every dashboard panel's query returns data (RDMA-only ones are expected empty) ---
	expand := strings.NewReplacer("$__rate_interval", rateWindow, "$instance", ".*")
	type pq struct{ dash, panel, expr string }
	var pending []pq
	rdmaOnly := 0
	for _, d := range opsdash.All() {
		for _, p := range d.Panels() {
			for _, tg := range p.Targets {
				q := pq{d.UID, p.Title, expand.Replace(tg.Expr)}
				if p.RDMAOnly {
					r, err := promQuery(t, prom, q.expr)
					if err != nil || len(r) != 0 {
						t.Errorf("RDMA-only panel %s / %q: want an empty result on a TCP cluster, got %v %v", q.dash, q.panel, r, err)
					}
					rdmaOnly++
					continue
				}
				pending = append(pending, q)
			}
		}
	}
	total := len(pending)
	// Rates need two scrapes in their window and the recording rules a few evaluations:
	// poll until every query has answered with data at least once.
	waitFor(t, 60*time.Second, "every dashboard query returns data", func() (bool, string) {
		var still []pq
		for _, q := range pending {
			r, err := promQuery(t, prom, q.expr)
			if err != nil {
				t.Fatalf("%s / %q: %v", q.dash, q.panel, err)
			}
			if len(r) == 0 {
				still = append(still, q)
			}
		}
		pending = still
		var names []string
		for _, q := range still {
			names = append(names, q.dash+" / "+q.panel+": "+q.expr)
		}
		return len(still) == 0, strings.Join(names, "\n")
	})
	t.Logf("all %d dashboard queries returned data through Prometheus's HTTP API; %d RDMA-only queries empty as expected", total, rdmaOnly)

	// --- the status page shows the live members ---
	statusURL := "http://" + mdsMetrics + "/status"
	profile := filepath.Join(dir, "chromium")
	dom := chromium(t, chromeBin, profile, statusURL, "")
	if st := memberStates(dom); len(st) != 3 || st["n1"] != "up" || st["n2"] != "up" || st["n3"] != "up" {
		t.Fatalf("status page members: %v\n%s", st, dom)
	}
	if !strings.Contains(dom, "ops-e2e-client") || !strings.Contains(dom, `id="etcd">healthy`) {
		t.Fatalf("status page lacks the registered client or etcd health:\n%s", dom)
	}

	// --- kill n3: the page shows it down after one poll interval (while its 30 s lease
	// still keeps it in the ring); the alert fires ---
	for _, a := range promAlerts(t, prom) {
		if a.Labels["alertname"] == "DfkvNodeDown" {
			t.Fatalf("DfkvNodeDown before any node died: %+v", a)
		}
	}
	loadMu.Lock()
	if loadErr != nil {
		t.Fatalf("load failed on a healthy cluster: %v", loadErr)
	}
	loadMu.Unlock()
	nodes[2].p.kill()
	killed := time.Now()
	time.Sleep(statusPoll) // the page may serve scrapes up to one poll interval old
	dom = chromium(t, chromeBin, profile, statusURL, "")
	if st := memberStates(dom); st["n3"] != "down" || st["n1"] != "up" || st["n2"] != "up" {
		t.Fatalf("%v after the kill, the status page shows %v (want n3 down, n1 and n2 up)", time.Since(killed).Round(time.Millisecond), st)
	}
	t.Logf("status page showed n3 down %v after the kill (poll interval %v)", time.Since(killed).Round(time.Millisecond), statusPoll)
	art := os.Getenv("DFKV_OPS_ARTIFACTS")
	if art == "" {
		art = filepath.Join(repoRoot, "build", "ops-artifacts")
	}
	if err := os.MkdirAll(art, 0o755); err != nil {
		t.Fatal(err)
	}
	shot := filepath.Join(art, "mds-status.png")
	chromium(t, chromeBin, profile, statusURL, shot)
	if st, err := os.Stat(shot); err != nil || st.Size() < 10000 {
		t.Fatalf("screenshot %s: %v", shot, err)
	}
	fmt.Printf("status page screenshot (n3 killed): %s\n", shot)
	t.Logf("status page screenshot (n3 killed): %s", shot)

	// The alert turns pending at the first evaluation after a failed scrape and fires for:
	// later. Both are checked against the kill time: pending within a few scrape and
	// evaluation intervals, and firing observed (the page checks above took a few seconds).
	window := alertFor + 3*scrapeInterval + 10*time.Second
	var fired alert
	waitFor(t, window, "DfkvNodeDown firing for n3", func() (bool, string) {
		var got []string
		for _, a := range promAlerts(t, prom) {
			if a.Labels["alertname"] != "DfkvNodeDown" {
				continue
			}
			got = append(got, a.Labels["instance"]+"="+a.State)
			if a.Labels["instance"] != nodes[2].metrics {
				t.Fatalf("DfkvNodeDown for a live node: %+v", a)
			}
			if a.State == "firing" {
				fired = a
				return true, ""
			}
		}
		return false, strings.Join(got, ", ")
	})
	pendingAfter := fired.ActiveAt.Sub(killed)
	if pendingAfter < 0 || pendingAfter > 3*scrapeInterval+2*time.Second {
		t.Fatalf("DfkvNodeDown turned pending %v after the kill; want within 3 scrape intervals", pendingAfter)
	}
	t.Logf("DfkvNodeDown pending %v after the kill, firing from %v after it (for: %v; scrape and evaluation every %v)",
		pendingAfter.Round(time.Millisecond), (pendingAfter + alertFor).Round(time.Millisecond), alertFor, scrapeInterval)

	stopLoad()
	loadWG.Wait()
	if loadErr != nil {
		t.Logf("load after the kill (expected until clients drop n3): %v", loadErr)
	}

	// --- the access logs hold records but never a raw key ---
	for _, n := range nodes[:2] {
		n.p.cmd.Process.Signal(syscall.SIGTERM)
		<-n.p.exited
		b, err := os.ReadFile(n.accessLog)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(b, []byte(`"msg":"access"`)) || !bytes.Contains(b, []byte(`"key_hash":"`)) {
			t.Fatalf("%s access log has no records:\n%.2000s", n.id, b)
		}
		if bytes.Contains(b, []byte("secret-prompt")) || bytes.Contains(b, []byte("never-written")) {
			t.Fatalf("%s access log contains a raw key", n.id)
		}
	}
}
