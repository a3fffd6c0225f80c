"""The dfkv release version for the Bazel graph (x_defs, wheel and tarball names).

Must equal VERSION and python/dfkv/_version.py: //bazel:version_test checks it.
"""

DFKV_VERSION = "0.1.0"

# The Go binaries' -X stamp, as tools/build.sh does it.
GO_X_DEFS = {"github.com/dfkv/dfkv/go/internal/version.Version": DFKV_VERSION}
