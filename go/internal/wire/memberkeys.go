package wire

// MemberMetricsAddrKey is the Member.Config key under which a node registers the
// host:port of its metrics listener (/metrics, /readyz); the MDS's /status page scrapes it.
const MemberMetricsAddrKey = "metrics_addr"
