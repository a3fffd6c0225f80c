#!/usr/bin/env python3
"""Generates python/dfkv/_abi.py (ctypes declarations of the C ABI) from dfkv.h.

go/cmd/libdfkv/dfkv.h is the contract; the binding's prototypes, option structs and
constants are derived from it so that they cannot drift apart.

  tools/gen_ctypes.py            rewrite python/dfkv/_abi.py
  tools/gen_ctypes.py --check    fail (exit 1, with a diff) when the checked-in file is stale
  --header PATH --out PATH       other files (the guard tests use scratch copies)

The parser understands exactly the C subset dfkv.h uses and refuses anything else with the
line it could not read, so a header change that needs a new rule fails here instead of
producing a wrong binding: comments; #ifndef/#ifdef/#define/#endif (with `__cplusplus`
blocks dropped and `#define NAME <integer expression>` turned into constants); `#include`;
`typedef struct name* handle;` (opaque handles: void*); `typedef struct name {...} name;`
(ctypes.Structure); function prototypes over void, char, int, the <stdint.h> integer types,
size_t, handles and the structs, with any number of `*` and `const`. Stdlib only.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent
HEADER = ROOT / "go" / "cmd" / "libdfkv" / "dfkv.h"
OUT = ROOT / "python" / "dfkv" / "_abi.py"

# C scalar type -> ctypes name. Pointers to char are strings (c_char_p); pointers to void
# are addresses (c_void_p); other pointers are POINTER(...).
SCALARS = {
    "void": None,
    "char": "c_char",
    "int": "c_int",
    "unsigned": "c_uint",
    "int8_t": "c_int8",
    "uint8_t": "c_uint8",
    "int16_t": "c_int16",
    "uint16_t": "c_uint16",
    "int32_t": "c_int32",
    "uint32_t": "c_uint32",
    "int64_t": "c_int64",
    "uint64_t": "c_uint64",
    "size_t": "c_size_t",
}

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


class HeaderError(Exception):
    """The header uses C this generator does not understand."""


def strip_comments(src: str) -> str:
    # Keep newlines inside block comments so that error messages name the right line.
    src = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), src, flags=re.S)
    return re.sub(r"//[^\n]*", "", src)


def preprocess(src: str) -> Tuple[List[Tuple[int, str]], Dict[str, str]]:
    """Returns the code lines outside dropped conditionals (with line numbers) and the
    #define'd integer constants (name -> expression text)."""
    lines: List[Tuple[int, str]] = []
    defines: Dict[str, str] = {}
    active = [True]  # conditional stack
    for no, raw in enumerate(strip_comments(src).split("\n"), 1):
        line = raw.strip()
        if not line.startswith("#"):
            if all(active) and line:
                lines.append((no, line))
            continue
        d = line[1:].split(None, 1)
        word, rest = (d[0], d[1].strip() if len(d) > 1 else "") if d else ("", "")
        if word == "ifdef" and rest == "__cplusplus":
            active.append(False)  # the extern "C" { ... } lines
        elif word == "ifndef":
            active.append(True)  # the include guard (any other use would need real evaluation)
        elif word == "ifdef":
            raise HeaderError(f"line {no}: #ifdef {rest}: only #ifdef __cplusplus is understood")
        elif word == "endif":
            if len(active) == 1:
                raise HeaderError(f"line {no}: #endif without #if")
            active.pop()
        elif word == "include":
            if not re.fullmatch(r"<(stddef|stdint)\.h>", rest):
                raise HeaderError(f"line {no}: unexpected #include {rest}")
        elif word == "define":
            if not all(active):
                continue
            m = re.fullmatch(rf"({IDENT})(?:\s+(.*))?", rest)
            if not m:
                raise HeaderError(f"line {no}: cannot read #define {rest!r}")
            name, value = m.group(1), (m.group(2) or "").strip()
            if not value:
                continue  # the include guard
            defines[name] = int_expr(value, no)
        else:
            raise HeaderError(f"line {no}: unsupported directive #{word}")
    if len(active) != 1:
        raise HeaderError("unterminated #if block")
    return lines, defines


def int_expr(value: str, no: int) -> str:
    """A #define value as a Python expression: integer literals (u/l suffixes dropped),
    parentheses, <<, >>, |, &, ~ and + only."""
    tokens = re.findall(r"\s*(0[xX][0-9a-fA-F]+|\d+|<<|>>|[()|&~+])([uUlL]*)", value)
    if "".join(t + s for t, s in tokens).replace(" ", "") != value.replace(" ", ""):
        raise HeaderError(f"line {no}: #define value {value!r} is not an integer expression")
    expr = " ".join(t for t, _ in tokens).replace("( ", "(").replace(" )", ")")
    try:
        eval(compile(expr, "<define>", "eval"), {"__builtins__": {}})  # tokens checked above
    except (SyntaxError, TypeError, ValueError) as e:
        raise HeaderError(f"line {no}: #define value {value!r}: {e}") from None
    return expr


class Type:
    """A C type: its one base name and its pointer depth (const never changes a ctypes type)."""

    def __init__(self, base: str, stars: int):
        self.base, self.stars = base, stars

    def ctypes(self, handles: set, structs: Dict[str, str]) -> Optional[str]:
        """The ctypes spelling; None for void. char* is c_char_p, void* is c_void_p, a
        handle is c_void_p, other pointers are POINTER(...)."""
        base, stars = self.base, self.stars
        if base in handles:
            inner = "c_void_p"  # the handle typedef is itself a pointer
        elif base == "void":
            if stars == 0:
                return None
            inner, stars = "c_void_p", stars - 1
        elif base == "char" and stars:
            inner, stars = "c_char_p", stars - 1
        elif base in structs:
            inner = structs[base]
        elif base in SCALARS:
            inner = SCALARS[base]
        else:
            raise HeaderError(f"unknown type {base}")
        for _ in range(stars):
            inner = f"POINTER({inner})"
        return inner


def parse_type(text: str, no: int) -> Type:
    """'const void* const* const' -> Type('void', 2): const never changes the ctypes type."""
    words = re.findall(rf"{IDENT}|\*", text)
    if "".join(words).replace("const", "") != re.sub(r"\s+", "", text).replace("const", ""):
        raise HeaderError(f"line {no}: cannot read type {text!r}")
    if any(w in ("struct", "union", "enum", "signed", "long", "short", "float", "double") for w in words):
        raise HeaderError(f"line {no}: type {text!r} is outside the supported subset")
    names = [w for w in words if w not in ("const", "*")]
    if len(names) != 1:
        raise HeaderError(f"line {no}: cannot read type {text!r}")
    return Type(names[0], words.count("*"))


def split_decl(decl: str, no: int) -> Tuple[Type, str]:
    """'const char* members' -> (Type, 'members')."""
    m = re.fullmatch(rf"(.*?[\s*])({IDENT})", decl.strip())
    if not m:
        raise HeaderError(f"line {no}: cannot read declaration {decl!r}")
    return parse_type(m.group(1), no), m.group(2)


class Header:
    def __init__(self) -> None:
        self.defines: Dict[str, str] = {}
        self.handles: List[str] = []
        self.structs: List[Tuple[str, List[Tuple[Type, str]]]] = []
        self.functions: List[Tuple[str, Type, List[Tuple[Type, str]]]] = []


def parse(src: str) -> Header:
    lines, defines = preprocess(src)
    h = Header()
    h.defines = defines
    # Join the code into statements ending in ';', keeping each one's first line number.
    # A ';' inside braces (struct fields) does not end a statement; `extern "C" {` and its
    # `}` are inside the dropped __cplusplus blocks.
    stmts: List[Tuple[int, str]] = []
    cur, start, depth = "", 0, 0
    for no, line in lines:
        for ch in line + " ":
            if not cur.strip():
                start = no
            if ch == ";" and depth == 0:
                stmts.append((start, cur.strip()))
                cur = ""
                continue
            depth += {"{": 1, "}": -1}.get(ch, 0)
            if depth < 0:
                raise HeaderError(f"line {no}: unbalanced '}}'")
            cur += ch
    if cur.strip():
        raise HeaderError(f"line {start}: statement without ';': {cur.strip()[:60]!r}")
    for no, s in stmts:
        m = re.fullmatch(rf"typedef\s+struct\s+({IDENT})\s*\*\s*({IDENT})", s)
        if m:
            h.handles.append(m.group(2))
            continue
        m = re.fullmatch(rf"typedef\s+struct\s+({IDENT})\s*\{{(.*)\}}\s*({IDENT})", s, flags=re.S)
        if m:
            if m.group(1) != m.group(3):
                raise HeaderError(f"line {no}: struct tag {m.group(1)} differs from its typedef {m.group(3)}")
            fields = [split_decl(f, no) for f in m.group(2).split(";") if f.strip()]
            h.structs.append((m.group(3), fields))
            continue
        m = re.fullmatch(rf"(.*?[\s*])({IDENT})\s*\((.*)\)", s, flags=re.S)
        if m and not s.startswith("typedef"):
            ret = parse_type(m.group(1), no)
            params = m.group(3).strip()
            args = [] if params in ("", "void") else [split_decl(p, no) for p in params.split(",")]
            h.functions.append((m.group(2), ret, args))
            continue
        raise HeaderError(f"line {no}: cannot read {s[:80]!r}")
    if not h.functions:
        raise HeaderError("no function prototypes found")
    return h


def class_name(c_name: str) -> str:
    """dfkv_client_options_v2 -> ClientOptionsV2."""
    n = c_name[5:] if c_name.startswith("dfkv_") else c_name
    return "".join(p[:1].upper() + p[1:] for p in n.split("_"))


def const_name(c_name: str) -> str:
    return c_name[5:] if c_name.startswith("DFKV_") else c_name


def render(h: Header, header_rel: str) -> str:
    handles = set(h.handles)
    structs = {name: class_name(name) for name, _ in h.structs}
    used = set()

    def ct(t: Type) -> str:
        s = t.ctypes(handles, structs)
        if s is None:
            return "None"
        used.update(re.findall(r"\b(c_[a-z0-9_]+|POINTER)\b", s))
        return s

    body: List[str] = []
    body.append("# Constants (#define).")
    for name, expr in h.defines.items():
        body.append(f"{const_name(name)} = {expr}")
    for name, fields in h.structs:
        body += ["", "", f"class {structs[name]}(Structure):",
                 f'    """``{name}`` from dfkv.h, field for field."""', "", "    _fields_ = ["]
        for t, fname in fields:
            body.append(f'        ("{fname}", {ct(t)}),')
        body.append("    ]")
    body += ["", "", "# name -> (restype, argtypes), every function of dfkv.h in header order.",
             "PROTOTYPES = {"]
    for name, ret, args in h.functions:
        names = ", ".join(a for _, a in args)
        body.append(f"    # {name}({names})")
        body.append(f'    "{name}": ({ct(ret)}, [{", ".join(ct(t) for t, _ in args)}]),')
    body.append("}")
    struct_list = ", ".join(f'"{structs[n]}"' for n, _ in h.structs)
    const_list = ", ".join(f'"{const_name(n)}"' for n in h.defines)
    imports = ", ".join(sorted(used | {"Structure"}))
    head = [
        f'"""ctypes declarations of the dfkv C ABI, generated from {header_rel} by',
        "tools/gen_ctypes.py. Do not edit: change the header and rerun the generator",
        '(tools/gen_ctypes.py --check, run by tools/test.sh, fails while this file is stale)."""',
        "",
        f"from ctypes import {imports}",
        "",
        f"__all__ = [{const_list}, {struct_list}, \"PROTOTYPES\"]",
        "",
    ]
    return "\n".join(head + body) + "\n"


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="fail when --out differs from what --header produces")
    ap.add_argument("--header", type=Path, default=HEADER)
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args(argv)
    try:
        header_rel = str(a.header.resolve().relative_to(ROOT))
    except ValueError:
        header_rel = "go/cmd/libdfkv/dfkv.h"  # a scratch copy: name the file it stands for
    try:
        text = render(parse(a.header.read_text()), header_rel)
    except HeaderError as e:
        print(f"gen_ctypes.py: {a.header}: {e}", file=sys.stderr)
        return 1
    if a.check:
        have = a.out.read_text() if a.out.is_file() else ""
        if have != text:
            sys.stdout.writelines(difflib.unified_diff(
                have.splitlines(True), text.splitlines(True), str(a.out), "generated from " + str(a.header)))
            print(f"gen_ctypes.py: {a.out} is stale; run tools/gen_ctypes.py", file=sys.stderr)
            return 1
        print(f"gen_ctypes.py: {a.out.name} is up to date with {a.header.name}")
        return 0
    a.out.write_text(text)
    print(f"gen_ctypes.py: wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
