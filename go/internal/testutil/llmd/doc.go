// Package llmd is a test stand-in for llm-d's kv-cache indexer: a ZMQ SUB that binds (as the
// indexer deploys) and an index of (model, block hash) -> pods kept from the KV events it
// receives, decoding as strictly as llm-d's kvevents pool does. llm-d's own Go module is not
// served by this project's module proxy, so its wire expectations are written down here from
// its source, once, for the kvevents unit test and the e2e test with a real dfkv_server.
package llmd
