"""The generated ctypes declarations (dfkv/_abi.py, from tools/gen_ctypes.py) agree with what
the C compiler makes of dfkv.h: every struct's size, alignment and field offsets/sizes, and
every #define'd constant. The expectations come from the compiler, not from the generator.
(Freshness of the generated file is tools/gen_ctypes.py --check, run by tools/test.sh.)"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess

import pytest
from conftest import HEADER

from dfkv import _abi

STRUCTS = {name: getattr(_abi, name) for name in _abi.__all__
           if isinstance(getattr(_abi, name), type) and issubclass(getattr(_abi, name), ctypes.Structure)}
CONSTS = {name: getattr(_abi, name) for name in _abi.__all__ if isinstance(getattr(_abi, name), int)}


def c_name(cls: type) -> str:
    """The C typedef a generated class stands for (named in its docstring)."""
    m = re.search(r"``(dfkv_[a-z0-9_]+)``", cls.__doc__ or "")
    assert m, f"{cls.__name__} does not name its C struct"
    return m.group(1)


def compile_and_run(tmp_path, body: list) -> list:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("no C compiler (cc/gcc) on PATH: tools/test.sh installs gcc")
    src = tmp_path / "probe.c"
    src.write_text("\n".join(['#include <stdio.h>', '#include <stddef.h>', f'#include "{HEADER}"',
                              "int main(void) {", *body, "return 0; }"]))
    exe = tmp_path / "probe"
    subprocess.run([cc, "-std=c11", "-Wall", "-Werror", "-o", str(exe), str(src)], check=True)
    return subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()


def test_generated_module_has_the_option_struct():
    # The binding builds dfkv_client_options_v2; an empty STRUCTS would make the layout test vacuous.
    assert "ClientOptionsV2" in STRUCTS and c_name(STRUCTS["ClientOptionsV2"]) == "dfkv_client_options_v2"


@pytest.mark.parametrize("name", sorted(STRUCTS))
def test_struct_layout_matches_c(tmp_path, name):
    cls = STRUCTS[name]
    cn = c_name(cls)
    fields = [f for f, _ in cls._fields_]
    body = [f'printf("%zu %zu\\n", sizeof({cn}), _Alignof({cn}));']
    body += [f'printf("%zu %zu\\n", offsetof({cn}, {f}), sizeof((({cn}*)0)->{f}));' for f in fields]
    nums = list(map(int, compile_and_run(tmp_path, body)))
    assert (nums[0], nums[1]) == (ctypes.sizeof(cls), ctypes.alignment(cls)), f"{cn}: size/alignment"
    got = {f: (getattr(cls, f).offset, getattr(cls, f).size) for f in fields}
    want = {f: (nums[2 + 2 * i], nums[3 + 2 * i]) for i, f in enumerate(fields)}
    assert got == want


def test_struct_fields_are_the_header_fields():
    # Field names and order come from the header text (the compiler checks offsets above).
    text = re.sub(r"/\*.*?\*/", "", HEADER.read_text(), flags=re.S)
    for name, cls in STRUCTS.items():
        cn = c_name(cls)
        m = re.search(r"typedef struct " + cn + r"\s*\{(.*?)\}", text, flags=re.S)
        assert m, cn
        names = re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*;", m.group(1))
        assert [f for f, _ in cls._fields_] == names


def test_constants_match_c(tmp_path):
    assert {"ABI_VERSION", "CLIENT_OPT_REGISTER_WITH_MDS", "CLIENT_OPT_RDMA"} <= set(CONSTS)
    names = sorted(CONSTS)
    out = compile_and_run(tmp_path, [f'printf("%llu\\n", (unsigned long long)(DFKV_{n}));' for n in names])
    assert dict(zip(names, map(int, out))) == CONSTS


def test_prototypes_cover_header():
    # Every function the header declares has a prototype, and nothing more.
    code = re.sub(r"/\*.*?\*/", "", HEADER.read_text(), flags=re.S)
    declared = re.findall(r"\b(dfkv_[a-z0-9_]+)\s*\(", code)
    assert list(dict.fromkeys(declared)) == list(_abi.PROTOTYPES)
