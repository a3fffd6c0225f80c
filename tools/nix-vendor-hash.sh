#!/usr/bin/env bash
# Prints the vendorHash that flake.nix's buildGoModule needs: the Nix NAR hash (SRI sha256)
# of the vendor tree `go mod vendor` makes, which is what buildGoModule's goModules
# derivation produces. Needs Go and Nix >= 2.4 (Debian: apt-get install nix-bin); no network
# beyond the Go module cache. Rerun after any change to go.mod, go.sum or the set of
# imported packages, and put the result into flake.nix.
#   tools/nix-vendor-hash.sh          print the hash
#   tools/nix-vendor-hash.sh --check  exit 1 when flake.nix holds a different one
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
command -v nix >/dev/null || { echo "tools/nix-vendor-hash.sh: nix is not installed (apt-get install nix-bin)"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go mod vendor -o "$tmp/vendor"
hash=$(nix --extra-experimental-features nix-command hash path "$tmp/vendor")
if [ "${1:-}" = --check ]; then
  have=$(sed -n 's/.*vendorHash = "\(sha256-[^"]*\)".*/\1/p' flake.nix)
  if [ "$have" != "$hash" ]; then
    echo "flake.nix vendorHash is ${have:-missing}; the vendor tree hashes to $hash"; exit 1
  fi
  echo "flake.nix vendorHash is current ($hash)"
else
  echo "$hash"
fi
