// Package ops is the operator-view end-to-end test (build tag "ops"; tools/test.sh runs it
// in a step of its own after installing Debian's prometheus and chromium): a real
// Prometheus scrapes a real 3-node cluster and its MDS under light load; every Grafana
// panel's query (go/internal/opsdash) must return data, the node-down alert of
// docs/ops/prometheus/dfkv-rules.yml must fire when a node is killed, and the MDS /status
// page, rendered by headless Chromium, must show the members and the killed node as down.
//
//	go test -tags ops -v ./go/e2e/ops/
package ops
