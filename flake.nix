{
  description = "dfkv: distributed KV cache for LLM inference";

  # The only input, pinned to one nixos-unstable commit (2026-09-22) so that `nix develop`
  # gives the same toolchain every time; flake.lock records the same rev with its narHash.
  # Why this one and how to move it: docs/BUILD.md, "Nix: the pinned nixpkgs". `nix develop`
  # / `nix build` fetch it; evaluating the flake's structure does not.
  inputs.nixpkgs.url = "github:NixOS/nixpkgs/6774f7bc253789b113a4f39285dc0fa100abeacc";

  outputs = { self, nixpkgs }:
    let
      systems = [ "x86_64-linux" "aarch64-linux" ];
      forAll = f: nixpkgs.lib.genAttrs systems (system: f nixpkgs.legacyPackages.${system});
      # go.mod needs Go >= 1.26: named explicitly, so a bump of nixpkgs' default `go` cannot
      # change the toolchain under us.
      goFor = pkgs: pkgs.go_1_26;
      version = nixpkgs.lib.fileContents ./VERSION;
    in
    {
      devShells = forAll (pkgs: {
        # Everything both routes need: Go (>= 1.26, go.mod), Bazel (tools/bazel uses it as the
        # "real Bazel >= 7 on PATH", online mode), the pinned flatc, gcc/binutils for cgo,
        # the C ABI test and the glibc check, Python with the test packages, and the other
        # systems tools/bench compares against.
        default = pkgs.mkShell {
          packages = with pkgs; [
            (goFor pkgs)
            bazel_7
            gazelle
            flatbuffers # flatc; tools/gen.sh --check fails loudly if its version != go.mod's
            gcc
            binutils
            cmake
            ninja
            (python3.withPackages (ps: with ps; [ pytest numpy pip ]))
            etcd
            redis
            memcached
          ];
          shellHook = ''
            export DFKV_BAZEL_MODE=host   # tools/bazel: use this Bazel, never the chroot fallback
          '';
        };
      });

      packages = forAll (pkgs:
        let
          # The Go binaries and libdfkv.so from the plain Go route (tools/build.sh's flags).
          # vendorHash: the NAR hash of the `go mod vendor` tree (what buildGoModule's
          # goModules derivation produces), computed with Debian's nix-bin 2.8 by
          # tools/nix-vendor-hash.sh; rerun it after any go.mod/go.sum/import change.
          dfkv = (pkgs.buildGoModule.override { go = goFor pkgs; }) {
            pname = "dfkv";
            inherit version;
            src = nixpkgs.lib.cleanSource ./.;
            vendorHash = "sha256-W8VuwTGH/n35DiYofqP1RVlIM6+kjPiH6eXEiAnh3XQ=";
            subPackages = [ "go/cmd/server" "go/cmd/mds" "go/cmd/dfkvctl" "go/cmd/bench" ];
            env.CGO_ENABLED = "0";
            ldflags = [ "-X github.com/dfkv/dfkv/go/internal/version.Version=${version}" ];
            doCheck = false; # the tests need real binaries and sockets: run tools/test.sh
            nativeBuildInputs = [ pkgs.gcc ];
            postBuild = ''
              CGO_ENABLED=1 go build -trimpath -buildmode=c-shared \
                -ldflags "-X github.com/dfkv/dfkv/go/internal/version.Version=${version} -extldflags=-Wl,--version-script=$PWD/go/cmd/libdfkv/exports.map" \
                -o libdfkv.so ./go/cmd/libdfkv
            '';
            postInstall = ''
              mv $out/bin/server $out/bin/dfkv_server
              mv $out/bin/mds $out/bin/dfkv_mds
              mv $out/bin/bench $out/bin/dfkv_bench
              install -Dm755 libdfkv.so $out/lib/libdfkv.so
              install -Dm644 go/cmd/libdfkv/dfkv.h $out/include/dfkv.h
            '';
            meta = {
              description = "dfkv: distributed KV cache for LLM inference (server, MDS, CLI, bench, libdfkv.so)";
              platforms = nixpkgs.lib.platforms.linux;
              mainProgram = "dfkv_server";
            };
          };
          # The Python package with libdfkv.so inside (found first by dfkv._lib).
          python-dfkv = pkgs.python3Packages.buildPythonPackage {
            pname = "dfkv";
            inherit version;
            pyproject = true;
            src = nixpkgs.lib.cleanSource ./python;
            build-system = [ pkgs.python3Packages.setuptools ];
            preBuild = ''
              mkdir -p dfkv/lib
              cp ${dfkv}/lib/libdfkv.so ${dfkv}/include/dfkv.h dfkv/lib/
            '';
            pythonImportsCheck = [ "dfkv" ];
          };
        in
        {
          inherit dfkv python-dfkv;
          default = dfkv;
        });
    };
}
