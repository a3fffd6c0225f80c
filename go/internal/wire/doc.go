// Package wire is the dfkv data-plane protocol: fixed-size request/response prefixes
// (FlatBuffers structs from schema/wire.fbs, read and written in place), raw payloads that
// follow them, the batch sub-frames, the control tables (Hello, Stats) and the limits every
// decoder enforces. Encoders never allocate on the hot path; decoders never panic on input.
//
// Frame shapes (all integers little-endian):
//
//	single op   request:  RequestHeader(64) [payload]          response: ResponseHeader(32) [payload]
//	batch op    request:  RequestHeader(64) N x (BatchItem(40) [value for BatchPut])
//	            response: ResponseHeader(32, count=N) N x (BatchResult(24) [value for BatchGet hits])
//	sg op       request:  RequestHeader(64, count=S) S x u64 segment length [value for SgPut]
//	            response: ResponseHeader(32) [value for SgGet]
//
// Replies on one connection come strictly in request order, so a client may pipeline.
package wire
