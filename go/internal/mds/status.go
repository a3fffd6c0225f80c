package mds

import (
	"context"
	"errors"
	"fmt"
	"html/template"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/dfkv/dfkv/go/internal/wire"
	"github.com/dfkv/dfkv/go/ring"
)

// MetricsAddrKey is the member config key naming a node's metrics listener.
const MetricsAddrKey = wire.MemberMetricsAddrKey

// StatusConfig configures the /status page.
type StatusConfig struct {
	Service       *Service
	EtcdReady     func() error // the prober's cached answer; nil = not shown
	Groups        func() []string
	Version       string
	EtcdMode      string
	PollInterval  time.Duration // node scrapes are reused this long; the page refreshes at this rate (default 5s)
	ScrapeTimeout time.Duration // per node (default 2s)
	Logger        *slog.Logger
}

// StatusPage renders the cluster as a person reads it: one server-side HTML page, no
// script, refreshed by the browser every poll interval. Node figures come from scraping
// each member's /metrics and /readyz (at most once per interval, all nodes at once), so a
// killed node shows as down on the next refresh even while its lease is still alive.
type StatusPage struct {
	cfg    StatusConfig
	client *http.Client

	mu       sync.Mutex // serialises polls; held while one runs
	polledAt time.Time
	nodes    map[string]NodeStatus // by metrics address
}

// NewStatusPage validates cfg.
func NewStatusPage(cfg StatusConfig) (*StatusPage, error) {
	if cfg.Service == nil {
		return nil, errors.New("status: no service")
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = 5 * time.Second
	}
	if cfg.ScrapeTimeout <= 0 {
		cfg.ScrapeTimeout = 2 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Groups == nil {
		cfg.Groups = func() []string { return nil }
	}
	return &StatusPage{cfg: cfg, client: &http.Client{Timeout: cfg.ScrapeTimeout}, nodes: map[string]NodeStatus{}}, nil
}

// NodeStatus is what one scrape of a node says.
type NodeStatus struct {
	State        string // up, not ready, down, unknown
	Detail       string
	Capacity     float64
	Used         float64
	Objects      float64
	Healthy      bool
	GetHits      float64
	GetMisses    float64
	RAMHits      float64
	RAMMisses    float64
	RAMUsed      float64
	RAMArena     float64
	Connections  float64
	Evictions    float64
	IOErrors     float64
	ReceivedByte float64
	SentBytes    float64
}

// Node states shown on the page.
const (
	StateUp       = "up"
	StateNotReady = "not ready"
	StateDown     = "down"
	StateUnknown  = "unknown"
)

// scrape reads a node's /readyz and /metrics.
func (p *StatusPage) scrape(ctx context.Context, addr string) NodeStatus {
	get := func(path string) (int, []byte, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
		if err != nil {
			return 0, nil, err
		}
		resp, err := p.client.Do(req)
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
		return resp.StatusCode, b, err
	}
	code, body, err := get("/readyz")
	if err != nil {
		return NodeStatus{State: StateDown, Detail: shortErr(err)}
	}
	ns := NodeStatus{State: StateUp}
	if code != http.StatusOK {
		ns.State, ns.Detail = StateNotReady, strings.TrimSpace(string(body))
	}
	code, body, err = get("/metrics")
	if err != nil || code != http.StatusOK {
		if err == nil {
			err = fmt.Errorf("/metrics answered %d", code)
		}
		ns.Detail = strings.TrimSpace(ns.Detail + " metrics: " + shortErr(err))
		return ns
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		ns.Detail = strings.TrimSpace(ns.Detail + " metrics: " + shortErr(err))
		return ns
	}
	sum := func(name string, match func(labels map[string]string) bool) float64 {
		f := fams[name]
		if f == nil {
			return 0
		}
		var t float64
		for _, m := range f.GetMetric() {
			if match != nil && !match(labelMap(m)) {
				continue
			}
			t += metricValue(m)
		}
		return t
	}
	getOp := func(st string) func(map[string]string) bool {
		return func(l map[string]string) bool {
			return (l["op"] == "Get" || l["op"] == "BatchGet" || l["op"] == "SgGet") && l["status"] == st
		}
	}
	ns.Capacity = sum("dfkv_store_capacity_bytes", nil)
	ns.Used = sum("dfkv_store_used_bytes", nil)
	ns.Objects = sum("dfkv_store_objects", nil)
	ns.Healthy = sum("dfkv_store_healthy", nil) > 0
	ns.GetHits = sum("dfkv_server_requests_total", getOp("Ok"))
	ns.GetMisses = sum("dfkv_server_requests_total", getOp("NotFound"))
	ns.RAMHits = sum("dfkv_ram_hits_total", nil)
	ns.RAMMisses = sum("dfkv_ram_misses_total", nil)
	ns.RAMUsed = sum("dfkv_ram_used_bytes", nil)
	ns.RAMArena = sum("dfkv_ram_arena_bytes", nil)
	ns.Connections = sum("dfkv_server_connections", nil)
	ns.Evictions = sum("dfkv_store_evictions_total", nil)
	ns.IOErrors = sum("dfkv_store_io_errors_total", nil)
	ns.ReceivedByte = sum("dfkv_server_received_bytes_total", nil)
	ns.SentBytes = sum("dfkv_server_sent_bytes_total", nil)
	return ns
}

func labelMap(m *dto.Metric) map[string]string {
	out := make(map[string]string, len(m.GetLabel()))
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

func metricValue(m *dto.Metric) float64 {
	switch {
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Untyped != nil:
		return m.GetUntyped().GetValue()
	}
	return 0
}

func shortErr(err error) string {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "timed out"
	}
	var oe *net.OpError
	if errors.As(err, &oe) {
		return oe.Err.Error()
	}
	return err.Error()
}

// poll scrapes every address (all at once) unless the last poll is younger than the
// interval, and returns the results.
func (p *StatusPage) poll(ctx context.Context, addrs []string) map[string]NodeStatus {
	p.mu.Lock()
	defer p.mu.Unlock()
	fresh := time.Since(p.polledAt) < p.cfg.PollInterval
	var missing []string
	for _, a := range addrs {
		if _, ok := p.nodes[a]; !ok || !fresh {
			missing = append(missing, a)
		}
	}
	if len(missing) > 0 {
		ctx, cancel := context.WithTimeout(ctx, p.cfg.ScrapeTimeout)
		defer cancel()
		res := make([]NodeStatus, len(missing))
		var wg sync.WaitGroup
		for i, a := range missing {
			wg.Add(1)
			go func() { defer wg.Done(); res[i] = p.scrape(ctx, a) }()
		}
		wg.Wait()
		if !fresh {
			p.nodes = make(map[string]NodeStatus, len(addrs))
			p.polledAt = time.Now()
		}
		for i, a := range missing {
			p.nodes[a] = res[i]
		}
	}
	out := make(map[string]NodeStatus, len(addrs))
	for _, a := range addrs {
		out[a] = p.nodes[a]
	}
	return out
}

// ---- view model ----

type statusView struct {
	Now           string
	Version       string
	EtcdMode      string
	EtcdOK        bool
	EtcdDetail    string
	ShowEtcd      bool
	LeaseTTL      string
	Refresh       int
	PollInterval  string
	Groups        []groupView
	Errors        []string
	TotalMembers  int
	TotalUp       int
	TotalClients  int
	TotalCapacity string
	TotalUsed     string
}

type groupView struct {
	Name          string
	MembersEpoch  string
	TopologyEpoch string
	Members       []memberView
	Clients       []clientView
	Err           string
	ClientsErr    string
}

type memberView struct {
	ID, Addr, MetricsAddr, Version string
	Weight                         uint32
	Share                          string
	Eligible                       bool
	State, StateClass, Detail      string
	Capacity, Used, UsedPct        string
	UsedFrac                       float64
	Objects, HitRate, RAM          string
	Connections                    string
	Rails                          []string
	Config                         string
}

type clientView struct {
	ID, Host, PID, Registered, Info string
}

// ServeHTTP renders the page.
func (p *StatusPage) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*p.cfg.ScrapeTimeout+p.cfg.Service.cfg.CallTimeout)
	defer cancel()
	v := p.view(ctx)
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if err := statusTmpl.Execute(w, v); err != nil {
		p.cfg.Logger.Debug("status page write", "err", err)
	}
}

func (p *StatusPage) view(ctx context.Context) *statusView {
	v := &statusView{
		Now: time.Now().UTC().Format("2006-01-02 15:04:05 UTC"), Version: p.cfg.Version, EtcdMode: p.cfg.EtcdMode,
		LeaseTTL: p.cfg.Service.LeaseTTL().String(), PollInterval: p.cfg.PollInterval.String(),
		Refresh: max(1, int(math.Round(p.cfg.PollInterval.Seconds()))),
	}
	if p.cfg.EtcdReady != nil {
		v.ShowEtcd = true
		if err := p.cfg.EtcdReady(); err != nil {
			v.EtcdDetail = err.Error()
		} else {
			v.EtcdOK = true
		}
	}
	groups := append([]string{DefaultGroup}, p.cfg.Groups()...)
	sort.Strings(groups)
	groups = slices.Compact(groups)
	type gdata struct {
		topo    *wire.Topology
		clients []wire.ClientInfo
		err     error
		cerr    error
	}
	data := make([]gdata, len(groups))
	var addrs []string
	for i, g := range groups {
		data[i].topo, data[i].err = p.cfg.Service.Topology(ctx, g)
		data[i].clients, data[i].cerr = p.cfg.Service.Clients(ctx, g)
		if data[i].topo != nil {
			for _, m := range data[i].topo.Members {
				if a := memberMetricsAddr(&m); a != "" {
					addrs = append(addrs, a)
				}
			}
		}
	}
	nodes := p.poll(ctx, addrs)
	var capTotal, usedTotal float64
	for i, g := range groups {
		gv := groupView{Name: g}
		d := data[i]
		if d.err != nil {
			gv.Err = d.err.Error()
		}
		if d.cerr != nil {
			gv.ClientsErr = d.cerr.Error()
		}
		if d.topo != nil {
			gv.MembersEpoch = fmt.Sprintf("%016x", d.topo.MembersEpoch)
			gv.TopologyEpoch = fmt.Sprintf("%016x", d.topo.TopologyEpoch)
			shares := map[string]float64{}
			var rn []ring.Node
			for _, m := range d.topo.Members {
				if m.Eligible {
					rn = append(rn, ring.Node{ID: m.ID, Weight: m.Weight})
				}
			}
			if rg, err := ring.New(rn); err == nil {
				shares = rg.Shares()
			}
			for _, m := range d.topo.Members {
				mv := memberView{ID: m.ID, Addr: m.Addr, Version: m.Version, Weight: m.Weight, Eligible: m.Eligible,
					MetricsAddr: memberMetricsAddr(&m), Share: "–"}
				if s, ok := shares[m.ID]; ok {
					mv.Share = fmt.Sprintf("%.1f%%", 100*s)
				}
				var cfg []string
				for _, kv := range m.Config {
					if kv.Key != MetricsAddrKey {
						cfg = append(cfg, kv.Key+"="+configValue(kv))
					}
				}
				mv.Config = strings.Join(cfg, " ")
				for _, r := range m.Rails {
					mv.Rails = append(mv.Rails, fmt.Sprintf("%s: %s (tier %d, port state %d)", r.Device, r.State(), r.Tier, r.PortState))
				}
				fillNode(&mv, m.Eligible, nodes, &capTotal, &usedTotal, v)
				gv.Members = append(gv.Members, mv)
			}
			v.TotalMembers += len(d.topo.Members)
		}
		for _, c := range d.clients {
			var info []string
			for _, kv := range c.Info {
				info = append(info, kv.Key+"="+kv.Value)
			}
			reg := "–"
			if c.RegisteredUnixMS > 0 {
				reg = time.UnixMilli(int64(c.RegisteredUnixMS)).UTC().Format("2006-01-02 15:04:05")
			}
			gv.Clients = append(gv.Clients, clientView{ID: c.ID, Host: c.Hostname, PID: fmt.Sprint(c.PID), Registered: reg, Info: strings.Join(info, " ")})
		}
		sort.Slice(gv.Clients, func(a, b int) bool { return gv.Clients[a].ID < gv.Clients[b].ID })
		v.TotalClients += len(d.clients)
		v.Groups = append(v.Groups, gv)
	}
	v.TotalCapacity, v.TotalUsed = humanBytes(capTotal), humanBytes(usedTotal)
	return v
}

func fillNode(mv *memberView, eligible bool, nodes map[string]NodeStatus, capTotal, usedTotal *float64, v *statusView) {
	mv.Capacity, mv.Used, mv.UsedPct, mv.Objects, mv.HitRate, mv.RAM, mv.Connections = "–", "–", "", "–", "–", "–", "–"
	if mv.MetricsAddr == "" {
		mv.State, mv.StateClass, mv.Detail = StateUnknown, "unknown", "node registered no metrics address"
		return
	}
	ns := nodes[mv.MetricsAddr]
	mv.State, mv.Detail = ns.State, ns.Detail
	switch ns.State {
	case StateUp:
		mv.StateClass = "up"
		if !eligible {
			mv.State, mv.StateClass = "up, not eligible", "warn"
		}
		v.TotalUp++
	case StateNotReady:
		mv.StateClass = "warn"
	default:
		mv.StateClass = "down"
		return
	}
	if !ns.Healthy {
		mv.StateClass = "warn"
		mv.Detail = strings.TrimSpace(mv.Detail + " store unhealthy")
	}
	*capTotal += ns.Capacity
	*usedTotal += ns.Used
	mv.Capacity, mv.Used = humanBytes(ns.Capacity), humanBytes(ns.Used)
	if ns.Capacity > 0 {
		mv.UsedFrac = min(1, ns.Used/ns.Capacity)
		mv.UsedPct = fmt.Sprintf("%.0f%%", 100*mv.UsedFrac)
		if ns.Used > 0 && mv.UsedFrac < 0.005 {
			mv.UsedPct = "<1%"
		}
	}
	mv.Objects = fmt.Sprintf("%.0f", ns.Objects)
	if t := ns.GetHits + ns.GetMisses; t > 0 {
		mv.HitRate = fmt.Sprintf("%.1f%% of %.0f", 100*ns.GetHits/t, t)
	}
	if ns.RAMArena > 0 {
		mv.RAM = humanBytes(ns.RAMUsed) + " / " + humanBytes(ns.RAMArena)
		if t := ns.RAMHits + ns.RAMMisses; t > 0 {
			mv.RAM += fmt.Sprintf(", %.0f%% hits", 100*ns.RAMHits/t)
		}
	}
	mv.Connections = fmt.Sprintf("%.0f", ns.Connections)
}

// configValue shows byte-sized config values (capacity, max_msg, *_bytes) in binary units.
func configValue(kv wire.KV) string {
	if kv.Key == "capacity" || kv.Key == "max_msg" || strings.HasSuffix(kv.Key, "_bytes") {
		if n, err := strconv.ParseInt(kv.Value, 10, 64); err == nil && n > 0 {
			return humanBytes(float64(n))
		}
	}
	return kv.Value
}

func memberMetricsAddr(m *wire.Member) string {
	for _, kv := range m.Config {
		if kv.Key == MetricsAddrKey {
			return kv.Value
		}
	}
	return ""
}

func humanBytes(b float64) string {
	const unit = 1024
	if b < unit {
		return fmt.Sprintf("%.0f B", b)
	}
	div, exp := float64(unit), 0
	for n := b / unit; n >= unit && exp < 5; n /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", b/div, "KMGTPE"[exp])
}

var statusTmpl = template.Must(template.New("status").Funcs(template.FuncMap{
	"pct": func(f float64) string { return fmt.Sprintf("%.0f", 100*f) },
}).Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="refresh" content="{{.Refresh}}">
<title>dfkv cluster status</title>
<style>
body{font:15px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;margin:24px;color:#1d2330;background:#f6f7f9}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 8px}h3{font-size:15px;margin:18px 0 6px;color:#444}
.sub{color:#5b6475;font-size:13px}
.cards{display:flex;gap:12px;margin:16px 0;flex-wrap:wrap}
.card{background:#fff;border:1px solid #dde1e7;border-radius:8px;padding:10px 16px;min-width:140px}
.card b{display:block;font-size:22px}.card span{color:#5b6475;font-size:12px;text-transform:uppercase;letter-spacing:.04em}
table{border-collapse:collapse;background:#fff;border:1px solid #dde1e7;width:100%}
th,td{padding:7px 10px;border-bottom:1px solid #e8ebef;text-align:left;vertical-align:top;font-size:14px}
th{background:#eef1f5;font-weight:600;font-size:13px}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.badge{display:inline-block;padding:1px 9px;border-radius:10px;font-weight:600;font-size:13px}
.up{background:#d9f2e0;color:#116b2c}.down{background:#fbd9d7;color:#9c1c13}.warn{background:#fdefc8;color:#7a5200}.unknown{background:#e4e6ea;color:#444}
tr.row-down td{background:#fff4f3}
.bar{background:#e8ebef;border-radius:4px;height:8px;width:110px;margin-top:4px}.bar i{display:block;height:8px;border-radius:4px;background:#3b7dd8}
.mono{font-family:ui-monospace,"DejaVu Sans Mono",monospace;font-size:13px}.nowrap{white-space:nowrap}.muted{color:#5b6475;font-size:12px}
</style></head><body>
<h1>dfkv cluster status</h1>
<div class="sub">dfkv_mds {{.Version}} · {{.Now}} · refreshes every {{.Refresh}} s (nodes polled at most every {{.PollInterval}}) · lease TTL {{.LeaseTTL}}</div>
<div class="cards">
<div class="card"><span>etcd{{if .EtcdMode}} ({{.EtcdMode}}){{end}}</span>{{if .ShowEtcd}}{{if .EtcdOK}}<b><span class="badge up" id="etcd">healthy</span></b>{{else}}<b><span class="badge down" id="etcd">down</span></b><div class="muted">{{.EtcdDetail}}</div>{{end}}{{else}}<b>–</b>{{end}}</div>
<div class="card"><span>nodes up</span><b id="nodes-up">{{.TotalUp}} / {{.TotalMembers}}</b></div>
<div class="card"><span>clients</span><b>{{.TotalClients}}</b></div>
<div class="card"><span>capacity used</span><b>{{.TotalUsed}}</b><div class="muted">of {{.TotalCapacity}} (nodes up)</div></div>
</div>
{{range .Groups}}
<h2>Group <span class="mono">{{.Name}}</span></h2>
<div class="sub">members epoch <span class="mono">{{.MembersEpoch}}</span> · topology epoch <span class="mono">{{.TopologyEpoch}}</span>{{if .Err}} · <span class="badge down">{{.Err}}</span>{{end}}</div>
<h3>Ring ({{len .Members}} members)</h3>
{{if .Members}}<table id="members-{{.Name}}">
<tr><th>member</th><th>state</th><th>address</th><th>weight</th><th>share</th><th>version</th><th>used / capacity</th><th>objects</th><th>GET hit rate</th><th>RAM tier</th><th>conns</th></tr>
{{range .Members}}<tr class="{{if eq .StateClass "down"}}row-down{{end}}" data-member="{{.ID}}" data-state="{{.State}}">
<td><b>{{.ID}}</b>{{if .Config}}<div class="muted">{{.Config}}</div>{{end}}{{range .Rails}}<div class="muted">rail {{.}}</div>{{end}}</td>
<td><span class="badge {{.StateClass}}">{{.State}}</span>{{if .Detail}}<div class="muted">{{.Detail}}</div>{{end}}</td>
<td class="mono">{{.Addr}}{{if .MetricsAddr}}<div class="muted">metrics {{.MetricsAddr}}</div>{{end}}</td>
<td class="num">{{.Weight}}</td><td class="num">{{.Share}}</td><td class="mono nowrap">{{.Version}}</td>
<td>{{.Used}} / {{.Capacity}}{{if .UsedPct}} ({{.UsedPct}})<div class="bar"><i style="width:{{pct .UsedFrac}}%"></i></div>{{end}}</td>
<td class="num">{{.Objects}}</td><td>{{.HitRate}}</td><td>{{.RAM}}</td><td class="num">{{.Connections}}</td></tr>
{{end}}</table>{{else}}<p class="muted">No members registered.</p>{{end}}
<h3>Registered clients ({{len .Clients}})</h3>
{{if .ClientsErr}}<p><span class="badge down">{{.ClientsErr}}</span></p>{{end}}
{{if .Clients}}<table><tr><th>client</th><th>host</th><th>pid</th><th>registered (UTC)</th><th>info</th></tr>
{{range .Clients}}<tr><td class="mono">{{.ID}}</td><td>{{.Host}}</td><td class="num">{{.PID}}</td><td>{{.Registered}}</td><td class="muted">{{.Info}}</td></tr>{{end}}
</table>{{else}}<p class="muted">No registered clients (unregistered clients may still be reading).</p>{{end}}
{{end}}
</body></html>
`))
