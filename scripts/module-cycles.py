#!/usr/bin/env python3
"""Prints the dependency circles between a crate's modules, and exits 1 when there is one.

Usage: scripts/module-cycles.py CRATE_SRC_DIR...   (e.g. api/src agent/src cli/src)
       scripts/module-cycles.py --self-test      (finds the circles of a small made-up crate)

A module is a file (`foo.rs` or `foo/mod.rs` is module `foo`). Module A depends on module B when
A's code outside its `#[cfg(test)]` part names a path into B: `crate::b::...`, `super::...`,
or `self::...` (in `use` declarations or inline). A path is resolved to the longest module
prefix that exists, so `crate::db::nodes::list` is module `db::nodes`, and `crate::db::Db` is
module `db`; a child module named without a prefix (`converge::spawn`) counts too. An edge from
a module to one of its own ancestors (`super::Error`) is the module tree itself and is not
counted; every other edge is, a parent's use of its children (a facade re-exporting them) too.
"""

import re
import sys
from pathlib import Path

PATH = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+|::\{)")
USE_GROUP = re.compile(r"\buse\s+(crate|super|self)::([^;]*);", re.S)


def modules(src: Path) -> dict:
    """Module path (tuple) -> file."""
    found = {}
    for file in sorted(src.rglob("*.rs")):
        parts = list(file.relative_to(src).with_suffix("").parts)
        if parts[-1] in ("mod", "lib", "main"):
            parts = parts[:-1]
        found[tuple(parts)] = file
    return found


def strip(text: str) -> str:
    """The code without comments, string literals and the `#[cfg(test)]` part."""
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    cut = text.find("#[cfg(test)]")
    return text if cut < 0 else text[:cut]


def expand(group: str) -> list:
    """`a::{b, c::d}` -> ['a::b', 'a::c::d'] (one level of braces is enough here)."""
    group = re.sub(r"\s+", "", group)
    m = re.match(r"^(.*?)\{(.*)\}$", group)
    if not m:
        return [group]
    prefix, inner = m.groups()
    items, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
            continue
        depth += ch == "{"
        depth -= ch == "}"
        cur += ch
    items.append(cur)
    out = []
    for item in items:
        if item:
            out.extend(expand(prefix + item))
    return out


def resolve(here: tuple, root: str, rest: list, known: dict) -> tuple:
    if root == "crate":
        base = ()
    elif root == "self":
        base = here
    else:  # super, possibly repeated
        base = here[:-1]
        while rest and rest[0] == "super":
            base = base[:-1]
            rest = rest[1:]
    path = base + tuple(rest)
    for n in range(len(path), -1, -1):
        if path[:n] in known:
            return path[:n]
    return ()


def edges(known: dict) -> dict:
    graph = {m: set() for m in known}
    for module, file in known.items():
        # A file's own module is `module`, but `super` in `foo/mod.rs` refers to foo's parent.
        here = module
        code = strip(file.read_text())
        paths = []
        for root, group in USE_GROUP.findall(code):
            paths.extend((root, p) for p in expand(group))
        code = USE_GROUP.sub("", code)
        for root, rest in PATH.findall(code):
            paths.append((root, rest.lstrip(":")))
        for root, rest in paths:
            parts = [p for p in rest.split("::") if p and p not in ("*", "self")]
            target = resolve(here, root, parts, known)
            if target != module:
                graph[module].add(target)
        # A child module named without a prefix (`converge::spawn`, `use converge::Outcome`).
        for child in known:
            if len(child) == len(module) + 1 and child[:-1] == module:
                if re.search(r"(?<![:\w])" + re.escape(child[-1]) + r"::", code):
                    graph[module].add(child)
    return graph


def related(a: tuple, b: tuple) -> bool:
    """Whether `b` is an ancestor of `a`: a child using what its parent declares for all its
    children (an error type, a shared helper) is the module tree itself, not a dependency."""
    return len(b) < len(a) and a[: len(b)] == b


def circles(graph: dict) -> list:
    """Tarjan's strongly connected components of more than one module."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if related(v, w):
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def name(module: tuple) -> str:
    return "::".join(module) or "(crate root)"


def self_test() -> int:
    """A made-up crate with one circle through a child module and a `use` group, one facade
    (parent and children using each other: not a circle) and one clean chain."""
    import tempfile

    files = {
        "lib.rs": "pub mod a; pub mod b; pub mod c; pub mod d;",
        "a.rs": "use crate::{b::thing, c};\n// crate::d::nothing (a comment)\n",
        "b/mod.rs": "mod inner;\npub use inner::thing;\n",
        "b/inner.rs": "pub fn thing() { super::helper(); crate::a::go(); }\n",
        "c.rs": "pub fn go() {}\n",
        "d.rs": "#[cfg(test)]\nmod tests { use crate::a; }\n",
    }
    with tempfile.TemporaryDirectory() as dir:
        for name, text in files.items():
            path = Path(dir, name)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        found = circles(edges(modules(Path(dir))))
    want = [[("a",), ("b",), ("b", "inner")]]
    if found != want:
        print(f"self-test: found {found}, want {want}")
        return 1
    print("self-test: the made-up crate's one circle found, nothing else")
    return 0


def main() -> int:
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    failed = False
    for src in sys.argv[1:]:
        known = modules(Path(src))
        found = circles(edges(known))
        print(f"{src}: {len(known)} modules, {len(found)} circle(s)")
        for comp in found:
            failed = True
            print("  " + " <-> ".join(name(m) for m in comp))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
