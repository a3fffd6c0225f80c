// Package version holds the dfkv software version, stamped at link time with
// -ldflags "-X github.com/dfkv/dfkv/go/internal/version.Version=...".
package version

// Version is the dfkv release this binary was built from.
var Version = "0.1.0-dev"
