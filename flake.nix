{
  description = "dfkv: distributed KV cache for LLM inference (development shell)";

  # Completed by the build-graph work; evaluates without fetching anything beyond nixpkgs.
  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-unstable";

  outputs = { self, nixpkgs }:
    let
      systems = [ "x86_64-linux" "aarch64-linux" ];
      forAll = f: nixpkgs.lib.genAttrs systems (s: f nixpkgs.legacyPackages.${s});
    in {
      devShells = forAll (pkgs: {
        default = pkgs.mkShell {
          packages = with pkgs; [ go gcc cmake ninja python3 python3Packages.pytest python3Packages.numpy ];
        };
      });
    };
}
