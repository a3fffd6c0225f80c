// Package metrics serves a daemon's HTTP observability endpoints (/metrics in the
// Prometheus text format, /healthz, /readyz) on a bounded listener, and holds helpers shared
// by every dfkv_* metric family.
package metrics
