#!/usr/bin/env python3
"""Import circles between the modules of each crate: `scripts/review/module-cycles.py [CRATE_DIR…]`.

A module's edges are the modules its non-test code names through `crate::…`, `super::…` or
`self::…` paths (in `use` trees, braces expanded, and in expressions). An edge to one of the
module's own ancestors or descendants is left out: a parent declares its children, and a child
may use what its parent defines. What remains must be acyclic; each strongly connected group
of two or more modules is printed, and the exit status is 1 when there is one.
"""

import pathlib
import re
import sys

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
# Test code may use anything: a `#[cfg(test)]` item at the top level ends a file's production code.
TEST_START = re.compile(r"^#\[cfg\(test\)\]", re.M)
COMMENT = re.compile(r"//[^\n]*")
USE = re.compile(r"\buse\s+((?:crate|super|self)\s*::[^;]*);", re.S)
PATH = re.compile(rf"\b((?:crate|super|self)(?:\s*::\s*{IDENT})+)")


def module_path(src: pathlib.Path, file: pathlib.Path) -> tuple:
    """`src/a/b.rs` and `src/a/b/mod.rs` are `("a", "b")`; `lib.rs`/`main.rs` the root."""
    parts = list(file.relative_to(src).with_suffix("").parts)
    if parts[-1] == "mod" or (len(parts) == 1 and parts[0] in ("lib", "main")):
        parts.pop()
    return tuple(parts)


def expand(tree: str) -> list:
    """`crate::{a::B, c::{d, e}}` → `crate::a::B`, `crate::c::d`, `crate::c::e`."""
    tree = re.sub(r"\s+", "", tree)
    brace = tree.find("{")
    if brace < 0:
        return [tree]
    prefix, depth, parts, start = tree[:brace], 0, [], brace + 1
    for i in range(brace, len(tree)):
        if tree[i] == "{":
            depth += 1
        elif tree[i] == "}":
            depth -= 1
            if depth == 0:
                parts.append(tree[start:i])
                break
        elif tree[i] == "," and depth == 1:
            parts.append(tree[start:i])
            start = i + 1
    out = []
    for part in filter(None, parts):
        out.extend(expand(prefix + part))
    return out


def resolve(current: tuple, path: str, modules: set):
    """The deepest known module a `crate::`/`super::`/`self::` path lands in."""
    segments = path.split("::")
    base = list(current)
    if segments[0] == "crate":
        base, segments = [], segments[1:]
    else:
        while segments and segments[0] in ("super", "self"):
            if segments[0] == "super" and base:
                base.pop()
            segments = segments[1:]
    target = tuple(base)
    for seg in segments:
        if target + (seg,) in modules:
            target += (seg,)
        else:
            break
    return target


def related(a: tuple, b: tuple) -> bool:
    return a[: len(b)] == b or b[: len(a)] == a


def cycles(src: pathlib.Path) -> list:
    files = {module_path(src, f): f for f in sorted(src.rglob("*.rs"))}
    modules = set(files) | {m[:i] for m in files for i in range(len(m))}
    edges = {m: set() for m in modules}
    for module, file in files.items():
        if file.name == "tests.rs" or "tests" in file.relative_to(src).parts[:-1]:
            continue
        text = file.read_text(encoding="utf-8")
        test = TEST_START.search(text)
        code = COMMENT.sub("", text[: test.start()] if test else text)
        paths = [p for tree in USE.findall(code) for p in expand(tree)]
        paths += [re.sub(r"\s+", "", p) for p in PATH.findall(USE.sub("", code))]
        for path in paths:
            target = resolve(module, path, modules)
            if not related(module, target):
                edges[module].add(target)
    return strongly_connected(edges)


def strongly_connected(edges: dict) -> list:
    """Tarjan's algorithm, iteratively; groups of two or more modules."""
    index, low, on_stack, stack, groups, counter = {}, {}, set(), [], [], [0]
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        groups.append(sorted(group))
            elif child not in index:
                index[child] = low[child] = counter[0]
                counter[0] += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(edges.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return groups


def main() -> int:
    root = pathlib.Path(__file__).resolve().parents[2]
    crates = [pathlib.Path(a) for a in sys.argv[1:]] or sorted((root / "crates").iterdir())
    found = 0
    for crate in crates:
        src = crate / "src"
        if not src.is_dir():
            continue
        for group in cycles(src):
            found += 1
            names = ", ".join("::".join(m) or "(crate root)" for m in group)
            print(f"{crate.name}: import circle among {names}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
