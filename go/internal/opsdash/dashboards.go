package opsdash

// Panel is one graph or figure. Exprs may use the dashboard variables $instance (regex of
// node instances) and $__rate_interval.
type Panel struct {
	Title   string
	Kind    string // "timeseries" (default) or "stat"
	Unit    string // Grafana unit id: percentunit, Bps, s, bytes, short, ops
	Targets []Target
	// RDMAOnly panels read families that only RDMA-enabled nodes export; they show
	// "no data" on TCP-only clusters (and the end-to-end test expects them empty).
	RDMAOnly    bool
	Description string
}

// Target is one query of a panel.
type Target struct {
	Expr   string
	Legend string
}

// Row groups panels under a heading.
type Row struct {
	Title  string
	Panels []Panel
}

// Dashboard is one Grafana dashboard.
type Dashboard struct {
	UID, Title, File string
	Description      string
	// InstanceVar adds the $instance variable (nodes from dfkv_server_build_info).
	InstanceVar, InstanceMulti bool
	Rows                       []Row
}

const (
	getOps   = `op=~"Get|BatchGet|SgGet"`
	nodeSel  = `instance=~"$instance"`
	rateWin  = `[$__rate_interval]`
	mdsGroup = `group=~".+"`
)

func ts(title, unit string, t ...Target) Panel { return Panel{Title: title, Unit: unit, Targets: t} }
func stat(title, unit string, t ...Target) Panel {
	return Panel{Title: title, Kind: "stat", Unit: unit, Targets: t}
}
func withDesc(p Panel, d string) Panel { p.Description = d; return p }
func q(expr, legend string) Target     { return Target{Expr: expr, Legend: legend} }

// All returns every dashboard, in file order.
func All() []Dashboard { return []Dashboard{Overview(), Node(), RDMA()} }

// Overview answers "is it healthy, is it helping": cluster-wide figures.
func Overview() Dashboard {
	return Dashboard{
		UID: "dfkv-overview", Title: "dfkv / cluster overview", File: "dfkv-overview.json",
		Description: "Health, hit rate, throughput and latency of a dfkv cluster; MDS ring and clients.",
		InstanceVar: true, InstanceMulti: true,
		Rows: []Row{
			{Title: "Health", Panels: []Panel{
				stat("Nodes up", "short", q(`sum(up{job="dfkv_server"})`, "up"), q(`count(up{job="dfkv_server"})`, "scraped")),
				stat("Nodes ready", "short", q(`sum(dfkv_server_ready{`+nodeSel+`})`, "ready"), q(`sum(dfkv_store_healthy{`+nodeSel+`})`, "stores healthy")),
				withDesc(stat("GET hit rate (5m)", "percentunit", q(`dfkv:cluster_get_hit_ratio:rate5m`, "hit rate")),
					"Recording rule from docs/ops/prometheus/dfkv-rules.yml: GET/BatchGet/SgGet answered Ok over Ok+NotFound."),
				stat("MDS with etcd", "short", q(`sum(dfkv_mds_etcd_up)`, "etcd up"), q(`count(dfkv_mds_etcd_up)`, "replicas")),
				stat("Ring members", "short", q(`max by (group) (dfkv_mds_group_members{`+mdsGroup+`})`, "{{group}}")),
				stat("Registered clients", "short", q(`max by (group) (dfkv_mds_group_clients{`+mdsGroup+`})`, "{{group}}")),
			}},
			{Title: "Is it helping", Panels: []Panel{
				ts("GET hit rate by node", "percentunit",
					q(`sum by (instance) (rate(dfkv_server_requests_total{`+getOps+`,status="Ok",`+nodeSel+`}`+rateWin+`)) / sum by (instance) (rate(dfkv_server_requests_total{`+getOps+`,status=~"Ok|NotFound",`+nodeSel+`}`+rateWin+`))`, "{{instance}}")),
				ts("Bytes served / stored", "Bps",
					q(`sum(rate(dfkv_server_sent_bytes_total{`+nodeSel+`}`+rateWin+`))`, "out (GET)"),
					q(`sum(rate(dfkv_server_received_bytes_total{`+nodeSel+`}`+rateWin+`))`, "in (PUT)")),
				ts("Requests by op", "ops",
					q(`sum by (op) (rate(dfkv_server_requests_total{`+nodeSel+`}`+rateWin+`))`, "{{op}}")),
				ts("Errors by status", "ops",
					q(`sum by (op, status) (rate(dfkv_server_requests_total{status!~"Ok|NotFound",`+nodeSel+`}`+rateWin+`)) or vector(0)`, "{{op}} {{status}}")),
			}},
			{Title: "Latency", Panels: []Panel{
				ts("p50 by op", "s",
					q(`histogram_quantile(0.5, sum by (op, le) (rate(dfkv_server_request_duration_seconds_bucket{`+nodeSel+`}`+rateWin+`)))`, "{{op}}")),
				ts("p99 by op", "s",
					q(`histogram_quantile(0.99, sum by (op, le) (rate(dfkv_server_request_duration_seconds_bucket{`+nodeSel+`}`+rateWin+`)))`, "{{op}}")),
			}},
			{Title: "Capacity", Panels: []Panel{
				ts("Capacity used by node", "percentunit",
					q(`dfkv_store_used_bytes{`+nodeSel+`} / dfkv_store_capacity_bytes{`+nodeSel+`}`, "{{instance}}")),
				ts("Evictions by node", "ops",
					q(`rate(dfkv_store_evictions_total{`+nodeSel+`}`+rateWin+`)`, "{{instance}}")),
				ts("Evicted bytes by node", "Bps",
					q(`rate(dfkv_store_evicted_bytes_total{`+nodeSel+`}`+rateWin+`)`, "{{instance}}")),
			}},
			{Title: "RAM tier", Panels: []Panel{
				ts("RAM tier hit rate", "percentunit",
					q(`sum by (instance) (rate(dfkv_ram_hits_total{`+nodeSel+`}`+rateWin+`)) / (sum by (instance) (rate(dfkv_ram_hits_total{`+nodeSel+`}`+rateWin+`)) + sum by (instance) (rate(dfkv_ram_misses_total{`+nodeSel+`}`+rateWin+`)))`, "{{instance}}")),
				ts("RAM tier promotions and evictions", "ops",
					q(`sum by (instance) (rate(dfkv_ram_promoted_total{`+nodeSel+`}`+rateWin+`))`, "promoted {{instance}}"),
					q(`sum by (instance) (rate(dfkv_ram_evictions_total{`+nodeSel+`}`+rateWin+`))`, "evicted {{instance}}")),
			}},
			{Title: "Membership (MDS)", Panels: []Panel{
				ts("Ring size", "short", q(`max by (group) (dfkv_mds_group_members{`+mdsGroup+`})`, "{{group}}")),
				ts("Ring epoch changes", "short", q(`sum by (group) (increase(dfkv_mds_group_epoch_changes_total{`+mdsGroup+`}[5m]))`, "{{group}}")),
				ts("Registered clients", "short", q(`max by (group) (dfkv_mds_group_clients{`+mdsGroup+`})`, "{{group}}")),
				ts("MDS requests by op", "ops", q(`sum by (op, status) (rate(dfkv_mds_requests_total`+rateWin+`))`, "{{op}} {{status}}")),
			}},
		},
	}
}

// Node answers "what is this node doing": one node's disks, tenants, tier and protections.
func Node() Dashboard {
	return Dashboard{
		UID: "dfkv-node", Title: "dfkv / node detail", File: "dfkv-node.json",
		Description: "One dfkv_server: storage devices, RAM tier, read coalescing, tenants and quotas, connections.",
		InstanceVar: true,
		Rows: []Row{
			{Title: "Storage devices", Panels: []Panel{
				ts("Device throughput", "Bps",
					q(`rate(dfkv_store_read_bytes_total{`+nodeSel+`}`+rateWin+`)`, "read {{engine}}"),
					q(`rate(dfkv_store_written_bytes_total{`+nodeSel+`}`+rateWin+`)`, "written {{engine}}")),
				ts("Device operations", "ops",
					q(`rate(dfkv_store_reads_total{`+nodeSel+`}`+rateWin+`)`, "reads {{engine}}"),
					q(`rate(dfkv_store_writes_total{`+nodeSel+`}`+rateWin+`)`, "writes {{engine}}")),
				ts("I/O errors and corrupt reads", "ops",
					q(`rate(dfkv_store_io_errors_total{`+nodeSel+`}`+rateWin+`)`, "I/O errors"),
					q(`rate(dfkv_store_corrupt_reads_total{`+nodeSel+`}`+rateWin+`)`, "corrupt reads")),
				ts("Slab occupancy", "bytes",
					q(`dfkv_store_used_bytes{`+nodeSel+`}`, "used"),
					q(`dfkv_store_capacity_bytes{`+nodeSel+`}`, "capacity")),
				ts("Objects stored", "short", q(`dfkv_store_objects{`+nodeSel+`}`, "objects")),
			}},
			{Title: "RAM tier and coalescing", Panels: []Panel{
				ts("RAM arena", "bytes",
					q(`dfkv_ram_used_bytes{`+nodeSel+`}`, "used"),
					q(`dfkv_ram_live_bytes{`+nodeSel+`}`, "live"),
					q(`dfkv_ram_arena_bytes{`+nodeSel+`}`, "arena")),
				ts("RAM tier backpressure", "ops",
					q(`rate(dfkv_ram_backpressure_waits_total{`+nodeSel+`}`+rateWin+`)`, "waits"),
					q(`rate(dfkv_ram_bypassed_total{`+nodeSel+`}`+rateWin+`)`, "bypassed")),
				ts("RAM slots in flight", "short",
					q(`dfkv_ram_pinned_slots{`+nodeSel+`}`, "pinned"),
					q(`dfkv_ram_backlog{`+nodeSel+`}`, "backlog")),
				ts("Read coalescing", "ops",
					q(`rate(dfkv_read_coalesce_leaders_total{`+nodeSel+`}`+rateWin+`)`, "leaders"),
					q(`rate(dfkv_read_coalesce_coalesced_total{`+nodeSel+`}`+rateWin+`)`, "coalesced"),
					q(`rate(dfkv_read_coalesce_timeouts_total{`+nodeSel+`}`+rateWin+`)`, "timeouts")),
			}},
			{Title: "Tenants", Panels: []Panel{
				ts("Quota used by tenant", "bytes", q(`dfkv_quota_used_bytes{`+nodeSel+`}`, "{{tenant}}")),
				ts("Quota fill by tenant", "percentunit", q(`dfkv_quota_used_bytes{`+nodeSel+`} / (dfkv_quota_limit_bytes{`+nodeSel+`} > 0)`, "{{tenant}}")),
				ts("Quota rejections by tenant", "ops", q(`rate(dfkv_quota_rejected_total{`+nodeSel+`}`+rateWin+`)`, "{{tenant}}")),
			}},
			{Title: "Requests and connections", Panels: []Panel{
				ts("Requests by op and status", "ops", q(`sum by (op, status) (rate(dfkv_server_requests_total{`+nodeSel+`}`+rateWin+`))`, "{{op}} {{status}}")),
				ts("p99 by op", "s", q(`histogram_quantile(0.99, sum by (op, le) (rate(dfkv_server_request_duration_seconds_bucket{`+nodeSel+`}`+rateWin+`)))`, "{{op}}")),
				ts("Open connections", "short", q(`dfkv_server_connections{`+nodeSel+`}`, "open")),
				ts("Connections accepted / refused", "ops",
					q(`rate(dfkv_server_connections_accepted_total{`+nodeSel+`}`+rateWin+`)`, "accepted"),
					q(`sum by (reason) (rate(dfkv_server_connections_rejected_total{`+nodeSel+`}`+rateWin+`)) or vector(0)`, "refused {{reason}}")),
				ts("Invalid frames", "ops", q(`sum by (reason) (rate(dfkv_server_invalid_frames_total{`+nodeSel+`}`+rateWin+`)) or vector(0)`, "{{reason}}")),
				ts("Process memory", "bytes", q(`process_resident_memory_bytes{job="dfkv_server",`+nodeSel+`}`, "RSS")),
			}},
		},
	}
}

// RDMA is the per-rail view. Its families come with the RDMA transport; until a node
// exports them every panel shows "no data".
func RDMA() Dashboard {
	rd := func(title, unit string, t ...Target) Panel {
		p := ts(title, unit, t...)
		p.RDMAOnly = true
		p.Description = "Needs RDMA-enabled nodes (dfkv_rdma_* families); empty on TCP-only clusters."
		return p
	}
	return Dashboard{
		UID: "dfkv-rdma", Title: "dfkv / RDMA rails", File: "dfkv-rdma.json",
		Description: "Per-rail RDMA traffic and health. Panels show no data until the nodes run the RDMA transport.",
		InstanceVar: true, InstanceMulti: true,
		Rows: []Row{
			{Title: "Rails", Panels: []Panel{
				rd("Rail throughput", "Bps",
					q(`sum by (instance, rail) (rate(dfkv_rdma_sent_bytes_total{`+nodeSel+`}`+rateWin+`))`, "out {{instance}} {{rail}}"),
					q(`sum by (instance, rail) (rate(dfkv_rdma_received_bytes_total{`+nodeSel+`}`+rateWin+`))`, "in {{instance}} {{rail}}")),
				rd("Rail port state", "short", q(`dfkv_rdma_rail_up{`+nodeSel+`}`, "{{instance}} {{rail}}")),
				rd("Work-request errors", "ops", q(`sum by (instance, rail) (rate(dfkv_rdma_wr_errors_total{`+nodeSel+`}`+rateWin+`))`, "{{instance}} {{rail}}")),
				rd("Queue pairs", "short", q(`dfkv_rdma_queue_pairs{`+nodeSel+`}`, "{{instance}} {{rail}}")),
			}},
			{Title: "Transport mix", Panels: []Panel{
				ts("Open TCP connections by node", "short", q(`dfkv_server_connections{`+nodeSel+`}`, "{{instance}}")),
			}},
		},
	}
}
