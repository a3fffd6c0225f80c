// Package fb holds the FlatBuffers code generated from schema/*.fbs by tools/gen.sh with
// the pinned flatc. Do not edit the *_generated.go files; edit the schemas and regenerate.
// fb_test.go fails when the checked-in code is stale.
package fb
