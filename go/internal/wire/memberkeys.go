package wire

// MemberMetricsAddrKey is the Member.Config key under which a node registers the
// host:port of its metrics listener (/metrics, /readyz); the MDS's /status page scrapes it.
const MemberMetricsAddrKey = "metrics_addr"

// MemberKVEventsKey and MemberKVReplayKey are the Member.Config keys under which a node
// with --kv-events registers its KV-event PUB endpoint and its replay (ROUTER) endpoint,
// so routers find every node's stream through the MDS (docs/EVENTS.md).
const (
	MemberKVEventsKey = "kv_events"
	MemberKVReplayKey = "kv_events_replay"
)
