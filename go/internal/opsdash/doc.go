// Package opsdash defines dfkv's Grafana dashboards as Go values: the panels, their
// PromQL and units. docs/ops/grafana/*.json is rendered from it (go run
// ./go/internal/opsdash/gen); a test fails when the checked-in JSON is stale, and the
// observability end-to-end test evaluates every panel's query against a real Prometheus.
package opsdash
