{
  # Stand-in for nixpkgs (unreachable here): just enough to evaluate dfkv's flake outputs.
  outputs = { self }:
    let
      lib = {
        genAttrs = names: f: builtins.listToAttrs (map (n: { name = n; value = f n; }) names);
        fileContents = p: builtins.replaceStrings [ "\n" ] [ "" ] (builtins.readFile p);
        cleanSource = p: p;
        fakeHash = "sha256-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";
        platforms.linux = [ "x86_64-linux" "aarch64-linux" ];
      };
      mk = system: name: extra: derivation ({ inherit name system; builder = "/bin/sh"; args = [ "-c" "echo stub > $out" ]; } // extra);
      pkgsFor = system:
        let drv = n: mk system n { }; in
        {
          go_1_26 = drv "go-1.26"; bazel_7 = drv "bazel"; gazelle = drv "gazelle"; flatbuffers = drv "flatbuffers";
          gcc = drv "gcc"; binutils = drv "binutils"; cmake = drv "cmake"; ninja = drv "ninja";
          etcd = drv "etcd"; redis = drv "redis"; memcached = drv "memcached";
          python3 = { withPackages = f: builtins.seq (f { pytest = 1; numpy = 1; pip = 1; }) (drv "python3-env"); };
          mkShell = a: builtins.seq (builtins.length a.packages) (mk system "shell" { shellHook = a.shellHook; });
          # a functor with .override, as nixpkgs' buildGoModule (flake.nix overrides its go)
          buildGoModule = let f = {
            __functor = _: a: mk system "${a.pname}-${a.version}" { vendorHash = a.vendorHash; postInstall = a.postInstall; };
            override = o: builtins.seq o.go f;
          }; in f;
          python3Packages = {
            setuptools = drv "setuptools";
            buildPythonPackage = a: mk system "python-${a.pname}-${a.version}" { preBuild = a.preBuild; };
          };
        };
    in { inherit lib; legacyPackages = lib.genAttrs [ "x86_64-linux" "aarch64-linux" ] pkgsFor; };
}
