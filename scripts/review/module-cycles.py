#!/usr/bin/env python3
"""Import circles between the modules of each crate: `scripts/review/module-cycles.py [CRATE_DIR…]`.

A module's edges are the modules its non-test code names through `crate::…`, `super::…` or
`self::…` paths, or paths from one of its child modules (in `use` trees, braces expanded, and in
expressions). A name is followed to the module that defines it, as a reader does: through the
re-exports (`pub use`, `pub(crate) use`, globs included) of the modules on its way, so a circle
that passes through a parent's re-export is still a circle. An edge to one of the module's own
ancestors or descendants is left out: a parent declares its children, and a child may use what
its parent defines. What remains must be acyclic; each strongly connected group of two or more
modules is printed, and the exit status is 1 when there is one.
"""

import pathlib
import re
import sys

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
# Test code may use anything: a `#[cfg(test)]` item at the top level ends a file's production code.
TEST_START = re.compile(r"^#\[cfg\(test\)\]", re.M)
COMMENT = re.compile(r"//[^\n]*")
USE = re.compile(r"\b(pub\s*(?:\([^)]*\)\s*)?)?use\s+([^;]*);", re.S)
PATH = re.compile(rf"\b((?:crate|super|self)(?:\s*::\s*{IDENT})+)")
# An item a module defines itself, by name.
DEFINES = r"\b(?:fn|struct|enum|trait|type|const|static|mod|union|macro_rules!)\s+{}\b"


def module_path(src: pathlib.Path, file: pathlib.Path) -> tuple:
    """`src/a/b.rs` and `src/a/b/mod.rs` are `("a", "b")`; `lib.rs`/`main.rs` the root."""
    parts = list(file.relative_to(src).with_suffix("").parts)
    if parts[-1] == "mod" or (len(parts) == 1 and parts[0] in ("lib", "main")):
        parts.pop()
    return tuple(parts)


def expand(tree: str) -> list:
    """`crate::{a::B, c::{d, e as f}}` → `crate::a::B`, `crate::c::d`, `crate::c::e@f` (`@` marks a
    rename)."""
    tree = re.sub(r"\s+", "", re.sub(r"\s+as\s+", "@", tree))
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


def anchor(current: tuple, segments: list, modules: set):
    """Where a path starts: `crate::`, `super::`/`self::` from `current`, or one of `current`'s
    child modules (a 2018 relative path); `None` for another crate's path."""
    base = list(current)
    if segments[0] == "crate":
        return [], segments[1:]
    if segments[0] in ("super", "self"):
        while segments and segments[0] in ("super", "self"):
            if segments[0] == "super" and base:
                base.pop()
            segments = segments[1:]
        return base, segments
    if tuple(base) + (segments[0],) in modules:
        return base, segments
    return None


class Crate:
    """One crate's modules, their production code and their re-exports."""

    def __init__(self, src: pathlib.Path):
        self.src = src
        self.files = {module_path(src, f): f for f in sorted(src.rglob("*.rs"))}
        self.modules = set(self.files) | {m[:i] for m in self.files for i in range(len(m))}
        self.code = {}
        # module -> name -> path (the module it was written in, its `::` segments)
        self.reexports = {m: {} for m in self.modules}
        # module -> [(module it was written in, segments of the glob's module)]
        self.globs = {m: [] for m in self.modules}
        for module, file in self.files.items():
            text = file.read_text(encoding="utf-8")
            test = TEST_START.search(text)
            self.code[module] = COMMENT.sub("", text[: test.start()] if test else text)
            for public, tree in USE.findall(self.code[module]):
                if public:
                    for path in expand(tree):
                        self._reexport(module, path)

    def _reexport(self, module: tuple, path: str):
        path, _, alias = path.partition("@")
        segments = path.split("::")
        if segments[-1] == "*":
            self.globs[module].append(segments[:-1])
        elif segments[-1] != "self":
            self.reexports[module][alias or segments[-1]] = segments

    def resolve(self, current: tuple, path: str, seen=frozenset()):
        """The module that defines what a path names, following re-exports (or the deepest
        module on the path when the name is not found); `None` when it leaves the crate."""
        start = anchor(current, path.split("::"), self.modules)
        if start is None:
            return None
        base, rest = start
        target = tuple(base)
        while rest and target + (rest[0],) in self.modules:
            target, rest = target + (rest[0],), rest[1:]
        if not rest:
            return target
        return self.lookup(target, rest[0], seen) or target

    def lookup(self, module: tuple, name: str, seen=frozenset()):
        """The module that defines `name` as seen from `module`: the module itself, or where
        its re-export (named or glob) leads; `None` when `module` has no such name."""
        if (module, name) in seen:
            return None
        seen = seen | {(module, name)}
        if re.search(DEFINES.format(re.escape(name)), self.code.get(module, "")):
            return module
        if name in self.reexports.get(module, {}):
            return self.resolve(module, "::".join(self.reexports[module][name]), seen)
        for glob in self.globs.get(module, []):
            inner = self.resolve(module, "::".join(glob), seen)
            found = inner is not None and self.lookup(inner, name, seen)
            if found:
                return found
        return None

    def edges(self) -> dict:
        edges = {m: set() for m in self.modules}
        for module, file in self.files.items():
            if file.name == "tests.rs" or "tests" in file.relative_to(self.src).parts[:-1]:
                continue
            code = self.code[module]
            paths = [p for _, tree in USE.findall(code) for p in expand(tree)]
            paths += [re.sub(r"\s+", "", p) for p in PATH.findall(USE.sub("", code))]
            for path in paths:
                path = path.partition("@")[0]
                target = self.resolve(module, path)
                if target is not None and not related(module, target):
                    edges[module].add(target)
        return edges


def related(a: tuple, b: tuple) -> bool:
    return a[: len(b)] == b or b[: len(a)] == a


def cycles(src: pathlib.Path) -> list:
    return strongly_connected(Crate(src).edges())


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
