#!/usr/bin/env python3
"""Production code kept small and typed: `scripts/review/code-shape.py [--write-baseline]`.

Three rules over every crate's production code (a file's code before its top-level
`#[cfg(test)]`; `tests.rs` files and `tests/` folders are test code):

- no function longer than 150 lines (from its `fn` line to its closing brace);
- no file whose production code is longer than 800 lines;
- no `Result<_, String>` except in a clap value parser (a function a `value_parser` names):
  errors are typed (`thiserror`), so a caller can tell them apart and a field path travels.

What broke a rule when the rule came is listed in `scripts/review/code-shape.baseline`, with
its size then. A listed item may shrink, never grow, and is removed once it keeps the rule (the
script says so), so the list only gets shorter. Exit status 1 on any finding.
"""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
BASELINE = ROOT / "scripts" / "review" / "code-shape.baseline"
MAX_FN_LINES = 150
MAX_FILE_LINES = 800

TEST_START = re.compile(r"^#\[cfg\(test\)\]", re.M)
FN = re.compile(r"^[ \t]*(?:pub(?:\([^)]*\))?\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?fn\s+([A-Za-z_][A-Za-z0-9_]*)", re.M)
RESULT_OPEN = re.compile(r"Result\s*<")
VALUE_PARSER = re.compile(r"value_parser\s*[=(]\s*(?:[A-Za-z_][A-Za-z0-9_]*::)*([A-Za-z_][A-Za-z0-9_]*)")


def production_files():
    """(path relative to the repository, production text) of every crate source file."""
    for src in sorted((ROOT / "crates").glob("*/src")):
        for file in sorted(src.rglob("*.rs")):
            parts = file.relative_to(src).parts
            if file.name == "tests.rs" or "tests" in parts[:-1]:
                continue
            text = file.read_text(encoding="utf-8")
            test = TEST_START.search(text)
            yield file.relative_to(ROOT).as_posix(), text[: test.start()] if test else text


def starts_word(text: str, i: int) -> bool:
    """Whether `text[i]` begins a word (no identifier character before it)."""
    return i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")


def blank_literals(text: str) -> str:
    """`text` with comments, strings and char literals blanked (newlines kept), so braces
    inside them are not counted."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "r" and re.match(r'r#*"', text[i:]) and starts_word(text, i - 1 if text[i - 1 : i] == "b" else i):
            hashes = re.match(r'r(#*)"', text[i:]).group(1)
            end = text.find('"' + hashes, i + len(hashes) + 2)
            j = n if end < 0 else end + 1 + len(hashes)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "'" and re.match(r"'(?:\\.|\\u\{[0-9a-fA-F]+\}|[^\\'])'", text[i:]):
            m = re.match(r"'(?:\\.|\\u\{[0-9a-fA-F]+\}|[^\\'])'", text[i:])
            out.append(" " * len(m.group(0)))
            i += len(m.group(0))
        else:
            out.append(c)
            i += 1
    return "".join(out)


def generic_args(code: str, i: int):
    """The top-level arguments of the generic list opened just before `i` (`<` already read),
    split at commas outside nested `<>`, `()` and `[]`; `None` when it does not close before a
    `{`, `}` or a `;` outside brackets (then it was no type: a comparison)."""
    args, depth, start = [], 0, i
    while i < len(code):
        c = code[i]
        if c in "{}" or (c == ";" and depth == 0):
            return None
        if code.startswith("->", i):
            i += 2  # a return arrow inside `Fn(..) -> T` is no closing bracket
            continue
        if c in "<([":
            depth += 1
        elif c in ")]":
            depth -= 1
        elif c == ">" and depth == 0:
            return args + [code[start:i].strip()]
        elif c == ">":
            depth -= 1
        elif c == "," and depth == 0:
            args.append(code[start:i].strip())
            start = i + 1
        i += 1
    return None


def string_results(code: str):
    """Offsets of every `Result<..., String>` in `code` (literals blanked): a `Result` whose
    last top-level generic argument is `String`. `Result<BTreeMap<String, String>>` (a
    one-argument alias) and `Result<(u8, String), E>` are not string errors."""
    for m in RESULT_OPEN.finditer(code):
        args = generic_args(code, m.end())
        if args and len(args) >= 2 and args[-1] == "String":
            yield m.start()


def functions(text: str):
    """(name, first line, number of lines) of every function with a body."""
    code = blank_literals(text)
    for m in FN.finditer(code):
        brace = code.find("{", m.end())
        semi = code.find(";", m.end())
        if brace < 0 or (0 <= semi < brace):
            continue  # a declaration without a body (trait method, extern)
        depth, i = 0, brace
        while i < len(code):
            if code[i] == "{":
                depth += 1
            elif code[i] == "}":
                depth -= 1
                if depth == 0:
                    break
            i += 1
        first = code.count("\n", 0, m.start()) + 1
        last = code.count("\n", 0, i) + 1
        yield m.group(1), first, last - first + 1


def findings():
    """{key: size} of everything that breaks a rule; key names the file and item."""
    files = list(production_files())
    parsers = {name for _, text in files for name in VALUE_PARSER.findall(text)}
    found = {}
    for path, text in files:
        lines = text.count("\n") + 1
        if lines > MAX_FILE_LINES:
            found[f"file {path}"] = lines
        for name, first, length in functions(text):
            if length > MAX_FN_LINES:
                found[f"fn {path}::{name}"] = length
        code = blank_literals(text)
        owners = sorted((first, name) for name, first, _ in functions(text))
        for start in string_results(code):
            line = code.count("\n", 0, start) + 1
            owner = next((name for first, name in reversed(owners) if first <= line), "")
            if owner in parsers:
                continue
            key = f"string-error {path}::{owner or 'item'}"
            found[key] = found.get(key, 0) + 1
    return found


def read_baseline() -> dict:
    if not BASELINE.exists():
        return {}
    out = {}
    for line in BASELINE.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            size, key = line.split(" ", 1)
            out[key] = int(size)
    return out


def main() -> int:
    found = findings()
    if sys.argv[1:] == ["--write-baseline"]:
        body = "".join(f"{size} {key}\n" for key, size in sorted(found.items()))
        BASELINE.write_text(
            "# scripts/review/code-shape.py: what broke a rule when it came, with its size then\n"
            "# (lines, or `Result<_, String>` count). Shrinks only; never add a line.\n" + body,
            encoding="utf-8",
        )
        return 0
    baseline = read_baseline()
    bad = 0
    for key, size in sorted(found.items()):
        allowed = baseline.get(key)
        if allowed is None:
            bad += 1
            print(f"code-shape: new: {key} ({size}); limits: functions {MAX_FN_LINES} lines, "
                  f"files {MAX_FILE_LINES}, no Result<_, String> outside clap value parsers")
        elif size > allowed:
            bad += 1
            print(f"code-shape: grew: {key} ({allowed} -> {size}); split it rather than grow it")
    for key in sorted(set(baseline) - set(found)):
        bad += 1
        print(f"code-shape: now keeps the rule, remove its line from {BASELINE.name}: {key}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
