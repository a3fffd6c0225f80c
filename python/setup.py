"""setuptools hooks: put ``libdfkv.so`` into the package, and ``dfkv-lmcache.pth`` at the root
of the wheel (site-packages). Everything else is declared in pyproject.toml.

``pip install ./python`` from a dfkv checkout builds ``libdfkv.so`` with the Go toolchain
(``go build -buildmode=c-shared`` of go/cmd/libdfkv, the flags of tools/build.sh) into
``dfkv/lib/`` of the package, where ``dfkv._lib`` finds it from any working directory. So a
plain install needs Go >= 1.26 and gcc (the verbs declarations are in the tree; no rdma-core
headers); without them it fails with one line naming the route that needs neither: the platform wheel, which
carries a prebuilt library (``tools/bazel build //python:wheel_linux``).

The build is skipped when the library is already there: ``$DFKV_PREBUILT_LIB`` names one to
copy in, or ``dfkv/lib/libdfkv.so`` exists in the source tree (flake.nix's python-dfkv puts
it there). Editable installs (``pip install -e``) build nothing: a development tree uses
tools/build.sh's ``build/libdfkv.so``, which ``dfkv._lib`` finds by walking up.

A ``.pth`` file must sit in site-packages itself, which pyproject's declarative options cannot
express; it runs ``_dfkv_lmcache_hook`` at interpreter start so LMCache's own adapter
discovery finds ``dfkv://`` remote URLs (docs/CONNECTORS.md §4).
"""

import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "dfkv-lmcache.pth"
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
LIB = "libdfkv.so"
WHEEL_ROUTE = ("install the platform wheel instead, which bundles a prebuilt libdfkv.so: "
               "tools/bazel build //python:wheel_linux && pip install <the .whl it names> "
               "(docs/BUILD.md)")


def _fail(why):
    # One line, which pip shows in its error output; no traceback.
    raise SystemExit(f"dfkv: cannot build {LIB}: {why}; {WHEEL_ROUTE}")


def _go_build(out_dir):
    """Build libdfkv.so (and copy dfkv.h) into out_dir the way tools/build.sh does."""
    out_dir = os.path.abspath(out_dir)  # go runs in the repository root
    src = os.path.join(REPO, "go", "cmd", "libdfkv")
    if not (os.path.isfile(os.path.join(REPO, "go.mod")) and os.path.isdir(src)):
        _fail(f"{REPO} is not a dfkv checkout (no go.mod, go/cmd/libdfkv)")
    go = shutil.which("go")
    if go is None:
        _fail("Go >= 1.26 is not on PATH (https://go.dev/dl)")
    try:
        with open(os.path.join(REPO, "VERSION")) as f:
            ver = f.read().strip()
    except OSError:
        ver = "0.1.0-dev"
    os.makedirs(out_dir, exist_ok=True)
    ld = (f"-X github.com/dfkv/dfkv/go/internal/version.Version={ver} "
          f"-extldflags=-Wl,--version-script={os.path.join(src, 'exports.map')}")
    cmd = [go, "build", "-trimpath", "-buildmode=c-shared", "-ldflags", ld,
           "-o", os.path.join(out_dir, LIB), "./go/cmd/libdfkv"]
    env = dict(os.environ, CGO_ENABLED="1")
    print(f"dfkv: building {LIB} with {go} (a few minutes the first time)", flush=True)
    try:
        r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    except subprocess.TimeoutExpired:
        _fail("go build did not finish within 30 minutes")
    if r.returncode != 0:
        err = r.stderr.strip()
        hint = ""
        if "gcc" in err or "C compiler" in err or "cgo" in err:
            hint = " (cgo needs a C compiler: install gcc)"
        last = err.splitlines()[-1] if err else f"exit {r.returncode}"
        _fail(f"go build failed{hint}: {last}")
    try:
        os.remove(os.path.join(out_dir, "libdfkv.h"))  # cgo's header; dfkv.h is the contract
    except FileNotFoundError:
        pass
    shutil.copyfile(os.path.join(src, "dfkv.h"), os.path.join(out_dir, "dfkv.h"))


class BuildPy(build_py):
    def run(self):
        super().run()
        self.copy_file(os.path.join(HERE, PTH), os.path.join(self.build_lib, PTH))
        if getattr(self, "editable_mode", False):
            return  # the source tree's build/libdfkv.so serves an editable install
        out = os.path.join(self.build_lib, "dfkv", "lib")
        prebuilt = os.environ.get("DFKV_PREBUILT_LIB")
        in_tree = os.path.join(HERE, "dfkv", "lib", LIB)
        if prebuilt:
            if not os.path.isfile(prebuilt):
                _fail(f"DFKV_PREBUILT_LIB={prebuilt} is not a file")
            os.makedirs(out, exist_ok=True)
            self.copy_file(prebuilt, os.path.join(out, LIB))
            header = os.path.join(REPO, "go", "cmd", "libdfkv", "dfkv.h")
            if os.path.isfile(header):
                self.copy_file(header, os.path.join(out, "dfkv.h"))
        elif os.path.isfile(in_tree):
            # package_data (dfkv/lib/*.so) copied it already
            print(f"dfkv: packaging the prebuilt {in_tree}", flush=True)
        else:
            _go_build(out)

    def get_outputs(self, include_bytecode=1):
        outs = super().get_outputs(include_bytecode) + [os.path.join(self.build_lib, PTH)]
        if not getattr(self, "editable_mode", False):
            lib_dir = os.path.join(self.build_lib, "dfkv", "lib")
            outs += [p for p in (os.path.join(lib_dir, f) for f in (LIB, "dfkv.h"))
                     if p not in outs and os.path.isfile(p)]
        return outs


cmdclass = {"build_py": BuildPy}
try:  # setuptools >= 70.1 has its own; older ones use the wheel package's
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:
    try:
        from wheel.bdist_wheel import bdist_wheel
    except ImportError:
        bdist_wheel = None
if bdist_wheel is not None:

    class BdistWheel(bdist_wheel):
        """A platform wheel (py3-none-<platform>): it carries a native libdfkv.so, but no
        extension module, so any CPython 3 on this platform can use it."""

        def finalize_options(self):
            super().finalize_options()
            self.root_is_pure = False

        def get_tag(self):
            _, _, plat = super().get_tag()
            return "py3", "none", plat

    cmdclass["bdist_wheel"] = BdistWheel

setup(cmdclass=cmdclass)
