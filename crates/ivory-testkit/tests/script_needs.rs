//! Every documented command works on its own on a fresh machine (issue 29): each script declares
//! what it runs, and each suite script declares what its tests run.
//!
//! A script declares its needs with `scripts/lib/needs.sh` (`needs_pkgs CMD:PACKAGE…`,
//! `needs_tools NAME…`, `needs_cmds CMD…`), which installs them. This test reads those declarations
//! and the invocations:
//!
//! - in `scripts/**/*.sh`: the command word of every simple command (after assignments and
//!   `nice`/`exec`/`setsid`…), `.tools/bin` tools (`"$TOOLS/crane"`), and scripts run (`bash x.sh`);
//! - in the Rust sources: `Command::new("…")`, `Command::new(CONST)` with `const CONST: &str = "…"`,
//!   `tool("…")` and `.tools/bin/…` (tools), and the scripts a test runs (`"scripts/demo.sh"`).
//!
//! and fails when a script runs a command it does not declare, or a suite script (`scripts/test.sh`,
//! `scripts/e2e.sh`, `scripts/bench.sh`) does not declare a command its tests, or the scripts they run,
//! run. `IVORY_SCRIPT_NEEDS_DEBUG=1 cargo test -p ivory-testkit --test script_needs -- --nocapture`
//! prints what was read (`=scripts/x.sh` also the commands of x.sh as split). What every Debian
//! machine with the Rust toolchain has is listed in [`BUILTINS`] and [`ESSENTIAL`]; which script
//! runs which sources is [`SUITES`].

#![allow(clippy::unwrap_used)] // a test: a panic is the report

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Bash builtins: a script runs them without any package.
const BUILTINS: &[&str] = &[
    ".",
    ":",
    "[",
    "[[",
    "alias",
    "bg",
    "break",
    "builtin",
    "caller",
    "cd",
    "command",
    "compgen",
    "continue",
    "declare",
    "echo",
    "eval",
    "exec",
    "exit",
    "export",
    "false",
    "getopts",
    "hash",
    "jobs",
    "kill",
    "let",
    "local",
    "mapfile",
    "printf",
    "pushd",
    "popd",
    "pwd",
    "read",
    "readarray",
    "readonly",
    "return",
    "set",
    "shift",
    "shopt",
    "source",
    "test",
    "trap",
    "true",
    "type",
    "typeset",
    "ulimit",
    "umask",
    "unset",
    "wait",
];

/// The commands of Debian's essential packages (bash, coreutils, util-linux, findutils, grep, sed,
/// mawk, tar, gzip, diffutils, dpkg, libc-bin, debianutils, hostname) and of the Rust toolchain
/// (rust-toolchain.toml): every machine that builds ivory has them. Anything else a script or a
/// test runs must be declared. (`kill` is not here: a program that runs it runs procps' /bin/kill.)
const ESSENTIAL: &[&str] = &[
    "awk",
    "base64",
    "basename",
    "bash",
    "cat",
    "chmod",
    "chown",
    "cmp",
    "cp",
    "cut",
    "date",
    "dd",
    "df",
    "diff",
    "dirname",
    "dpkg",
    "dpkg-query",
    "du",
    "env",
    "expr",
    "find",
    "getent",
    "grep",
    "gzip",
    "head",
    "hostname",
    "id",
    "install",
    "ldd",
    "ln",
    "ls",
    "mkdir",
    "mktemp",
    "mv",
    "nice",
    "nohup",
    "readlink",
    "realpath",
    "rm",
    "rmdir",
    "sed",
    "seq",
    "setsid",
    "sh",
    "sha256sum",
    "sleep",
    "sort",
    "stat",
    "tail",
    "tar",
    "tee",
    "timeout",
    "touch",
    "tr",
    "uname",
    "uniq",
    "wc",
    "which",
    "xargs",
    "cargo",
    "rustc",
    "rustup",
];

/// Which sources each suite script runs: `scripts/test.sh` runs `cargo test --workspace` (every crate
/// but ivory-e2e, whose tests need its `e2e` feature), `scripts/e2e.sh` runs
/// `cargo test -p ivory-e2e --features e2e`, `scripts/bench.sh` runs ivory-bench (`benches/src`).
/// The e2e tests and ivory-bench use the testkit's harnesses.
const SUITES: &[(&str, &[&str], &[&str])] = &[
    // (script, source folders, folders excluded)
    (
        "scripts/test.sh",
        &["crates", "benches/tests", "benches/benches"],
        &["crates/ivory-e2e"],
    ),
    (
        "scripts/e2e.sh",
        &["crates/ivory-e2e", "crates/ivory-testkit/src"],
        &[],
    ),
    (
        "scripts/bench.sh",
        &["benches/src", "crates/ivory-testkit/src"],
        &[],
    ),
];

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The files the check reads, by path relative to the repository root.
#[derive(Clone)]
struct Repo {
    files: BTreeMap<String, String>,
}

impl Repo {
    fn load() -> Repo {
        let root = repo_root();
        let mut files = BTreeMap::new();
        for dir in ["scripts", "crates", "benches", "deploy"] {
            walk(&root, &root.join(dir), &mut files);
        }
        Repo { files }
    }

    fn text(&self, path: &str) -> &str {
        self.files
            .get(path)
            .unwrap_or_else(|| panic!("{path} is missing"))
    }
}

fn walk(root: &Path, dir: &Path, files: &mut BTreeMap<String, String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            if name != "target" && !name.starts_with('.') {
                walk(root, &path, files);
            }
        } else if name.ends_with(".sh") || name.ends_with(".rs") {
            let rel = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            files.insert(rel, std::fs::read_to_string(&path).unwrap());
        }
    }
}

// --- shell ---------------------------------------------------------------------------------

/// The simple commands of a shell script, each as its words. Single-quoted text is dropped (awk and
/// jq programs), double-quoted text is one word, `$(…)` and `(…)` are commands of their own,
/// comments, heredoc bodies, arithmetic and case patterns are skipped. A segment that continues a
/// command after a `$(…)` starts with "\0" and names no command.
fn segments(src: &str) -> Vec<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Ctx {
        Sub,
        Paren,
        Dq,
        Param,
    }
    struct Lexer {
        segs: Vec<Vec<String>>,
        seg: Vec<String>,
        word: String,
        pattern: bool,
    }
    impl Lexer {
        fn end_word(&mut self) {
            if self.word.is_empty() {
                return;
            }
            let word = std::mem::take(&mut self.word);
            let first = self.seg.first().map(String::as_str);
            if word == "esac" && self.seg.is_empty() {
                self.pattern = false;
            }
            let opens_case = first == Some("case") && word == "in";
            self.seg.push(word);
            if opens_case {
                self.end_seg();
                self.pattern = true;
            }
        }
        fn end_seg(&mut self) {
            self.end_word();
            if !self.seg.is_empty() {
                self.segs.push(std::mem::take(&mut self.seg));
            }
        }
    }
    let c: Vec<char> = src.chars().collect();
    let at = |i: usize| c.get(i).copied().unwrap_or('\0');
    let mut lx = Lexer {
        segs: vec![],
        seg: vec![],
        word: String::new(),
        pattern: false,
    };
    let mut stack: Vec<Ctx> = vec![];
    let mut heredocs: Vec<String> = vec![];
    let mut i = 0;
    while i < c.len() {
        let ch = c[i];
        let top = stack.last().copied();
        // `$(`, `$((` and `${` open the same way in every context but single quotes.
        if ch == '$' && at(i + 1) == '(' && at(i + 2) == '(' {
            i += 1;
            let mut depth = 0;
            while i < c.len() {
                match c[i] {
                    '(' => depth += 1,
                    ')' => depth -= 1,
                    _ => {}
                }
                i += 1;
                if depth == 0 {
                    break;
                }
            }
            lx.word.push('0');
            continue;
        }
        if ch == '$' && at(i + 1) == '(' {
            lx.end_seg();
            stack.push(Ctx::Sub);
            i += 2;
            continue;
        }
        if ch == '$' && at(i + 1) == '{' {
            lx.word.push('$');
            stack.push(Ctx::Param);
            i += 2;
            continue;
        }
        match top {
            Some(Ctx::Dq) => {
                match ch {
                    '"' => {
                        stack.pop();
                    }
                    '\\' => {
                        lx.word.push('_');
                        i += 1;
                    }
                    c if c.is_whitespace() || ";|&()<>{}`".contains(c) => lx.word.push('_'),
                    c => lx.word.push(c),
                }
                i += 1;
                continue;
            }
            Some(Ctx::Param) => {
                match ch {
                    '}' => {
                        stack.pop();
                    }
                    '"' => stack.push(Ctx::Dq),
                    '\'' => {
                        i += 1;
                        while i < c.len() && c[i] != '\'' {
                            i += 1;
                        }
                    }
                    _ => lx.word.push('_'),
                }
                i += 1;
                continue;
            }
            _ => {}
        }
        match ch {
            '\\' => {
                if at(i + 1) != '\n' {
                    lx.word.push(at(i + 1));
                }
                i += 2;
                continue;
            }
            '\'' => {
                i += 1;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                lx.word.push('Q');
            }
            '"' => stack.push(Ctx::Dq),
            '#' if lx.word.is_empty() => {
                while i < c.len() && c[i] != '\n' {
                    i += 1;
                }
                continue;
            }
            '<' if at(i + 1) == '<' && at(i + 2) == '<' => {
                // A here-string: a word, not a heredoc.
                lx.word.push_str("<<<");
                i += 3;
                continue;
            }
            '<' if at(i + 1) == '<' => {
                // A heredoc: its body, up to the terminator line, is skipped at the next newline.
                i += 2;
                if at(i) == '-' {
                    i += 1;
                }
                let mut term = String::new();
                while i < c.len() && !c[i].is_whitespace() && !";|&".contains(c[i]) {
                    if c[i] != '\'' && c[i] != '"' {
                        term.push(c[i]);
                    }
                    i += 1;
                }
                heredocs.push(term);
                continue;
            }
            '(' if lx.word.ends_with('=') => {
                // An array's elements are words, not commands.
                let mut depth = 1;
                i += 1;
                while i < c.len() && depth > 0 {
                    match c[i] {
                        '(' => depth += 1,
                        ')' => depth -= 1,
                        '\'' => {
                            i += 1;
                            while i < c.len() && c[i] != '\'' {
                                i += 1;
                            }
                        }
                        _ => {}
                    }
                    i += 1;
                }
                lx.word.push('A');
                continue;
            }
            '(' => {
                lx.end_seg();
                stack.push(Ctx::Paren);
            }
            ')' => {
                if lx.pattern || !matches!(top, Some(Ctx::Sub | Ctx::Paren)) {
                    // The end of a case pattern.
                    lx.word.clear();
                    lx.seg.clear();
                    lx.pattern = false;
                } else {
                    lx.end_seg();
                    stack.pop();
                    lx.seg.push("\0".into());
                }
            }
            ';' => {
                lx.end_seg();
                if at(i + 1) == ';' {
                    lx.pattern = true;
                    i += 1;
                }
            }
            '|' if lx.pattern => lx.end_word(),
            // `>&2`, `2>&1`, `&>file`: redirections.
            '&' if lx.word.ends_with(['>', '<']) || at(i + 1) == '>' => lx.word.push('&'),
            '|' | '&' | '`' => lx.end_seg(),
            // `{ …; }` groups; `{}` (find -exec) is a word.
            '{' if lx.word.is_empty() && at(i + 1).is_whitespace() => lx.end_seg(),
            '}' if lx.word.is_empty() => lx.end_seg(),
            '\n' => {
                lx.end_seg();
                for term in std::mem::take(&mut heredocs) {
                    loop {
                        i += 1;
                        let end = (i..c.len()).find(|&j| c[j] == '\n').unwrap_or(c.len());
                        let line: String = c[i..end].iter().collect();
                        i = end;
                        if line.trim_start_matches('\t') == term || i >= c.len() {
                            break;
                        }
                    }
                }
            }
            c if c.is_whitespace() => lx.end_word(),
            c => lx.word.push(c),
        }
        i += 1;
    }
    lx.end_seg();
    lx.segs
}

/// What a script runs and declares.
#[derive(Default, Debug)]
struct Script {
    /// External commands run (not builtins, not its functions).
    commands: BTreeSet<String>,
    /// `.tools/bin` tools run.
    tools: BTreeSet<String>,
    /// Other scripts run, as written (resolved by [`resolve`]).
    scripts: BTreeSet<String>,
    /// `needs_pkgs` commands and `needs_cmds`.
    declared: BTreeSet<String>,
    /// `needs_tools`.
    declared_tools: BTreeSet<String>,
    /// For Rust sources: the file that runs each command or tool.
    origin: BTreeMap<String, String>,
}

fn is_assignment(word: &str) -> bool {
    let name_end = word
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(word.len());
    name_end > 0
        && !word.starts_with(|c: char| c.is_ascii_digit())
        && (word[name_end..].starts_with('=') || word[name_end..].starts_with("+="))
}

/// The functions a script defines (`name() {`).
fn functions(src: &str) -> BTreeSet<String> {
    src.lines()
        .filter_map(|line| {
            let line = line.trim_start();
            let line = line.strip_prefix("function ").unwrap_or(line);
            let end = line.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'))?;
            (end > 0 && line[end..].trim_start().starts_with("()")).then(|| line[..end].to_owned())
        })
        .collect()
}

/// A `.tools/bin` tool named by a command word (`"$TOOLS/crane"`, `.tools/bin/cosign2`).
fn tool_of(word: &str) -> Option<String> {
    let rest = word
        .rsplit_once(".tools/bin/")
        .map(|(_, r)| r)
        .or_else(|| word.strip_prefix("$TOOLS/bin/"))
        .or_else(|| word.strip_prefix("$TOOLS/"))?;
    let name: String = rest
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .collect();
    (!name.is_empty() && name.len() == rest.len()).then_some(name)
}

fn parse_script(src: &str, lib_functions: &BTreeSet<String>) -> Script {
    let own = functions(src);
    let mut s = Script::default();
    for seg in segments(src) {
        let mut words = seg.iter().map(String::as_str).peekable();
        while let Some(w) = words.next() {
            match w {
                "\0" | "for" | "case" | "select" | "[" | "[[" | "test" | "command" | "type"
                | "hash" | "esac" => break,
                "if" | "then" | "else" | "elif" | "do" | "done" | "fi" | "while" | "until"
                | "!" | "time" | "exec" | "setsid" | "sudo" | "$SUDO" | "builtin" => continue,
                "nice" | "env" | "timeout" => {
                    while let Some(next) = words.peek() {
                        if next.starts_with('-')
                            || next.chars().all(|c| c.is_ascii_digit())
                            || is_assignment(next)
                        {
                            words.next();
                        } else {
                            break;
                        }
                    }
                    continue;
                }
                "needs_pkgs" => {
                    s.declared.extend(words.map(|spec| {
                        spec.split_once(':')
                            .unwrap_or_else(|| panic!("needs_pkgs {spec}: not CMD:PACKAGE"))
                            .0
                            .to_owned()
                    }));
                    break;
                }
                "needs_cmds" => {
                    s.declared.extend(words.map(str::to_owned));
                    break;
                }
                "needs_tools" => {
                    s.declared_tools.extend(words.map(str::to_owned));
                    break;
                }
                "bash" | "sh" => {
                    if let Some(next) = words.peek().filter(|n| n.ends_with(".sh")) {
                        s.scripts.insert((*next).to_owned());
                    }
                    break;
                }
                _ => {}
            }
            if is_assignment(w) {
                continue;
            }
            if w.starts_with(['<', '>'])
                || w.trim_start_matches(|c: char| c.is_ascii_digit())
                    .starts_with(['<', '>'])
            {
                // A redirection; a bare operator takes the next word.
                if w.trim_end_matches(['<', '>', '&'])
                    .chars()
                    .all(|c| c.is_ascii_digit())
                {
                    words.next();
                }
                continue;
            }
            if let Some(tool) = tool_of(w) {
                s.tools.insert(tool);
            } else if w.ends_with(".sh") {
                s.scripts.insert(w.to_owned());
            } else if !(w.starts_with(['-', '$', '_'])
                || w == "Q"
                || w.contains('/')
                || own.contains(w)
                || lib_functions.contains(w)
                || BUILTINS.contains(&w)
                || ESSENTIAL.contains(&w))
            {
                s.commands.insert(w.to_owned());
            }
            break;
        }
    }
    s
}

/// The script a script runs: `scripts/e2e/build.sh`, `"$HERE/cluster.sh"`, `"$(dirname "$0")/x.sh"`
/// all resolve by their longest literal tail.
fn resolve(repo: &Repo, from: &str, written: &str) -> String {
    let parts: Vec<&str> = written.split('/').collect();
    let literal = parts
        .iter()
        .rposition(|p| p.contains('$') || p.starts_with('_'))
        .map_or(0, |k| k + 1);
    let tail = parts[literal..].join("/");
    let tail = tail.as_str();
    let dir = Path::new(from)
        .parent()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    for candidate in [tail.to_owned(), format!("{dir}/{tail}")] {
        if repo.files.contains_key(&candidate) {
            return candidate;
        }
    }
    let found: Vec<&String> = repo
        .files
        .keys()
        .filter(|p| p.ends_with(&format!("/{tail}")))
        .collect();
    match found.as_slice() {
        [one] => (*one).clone(),
        _ => panic!("{from} runs {written}: no single script matches"),
    }
}

// --- Rust ----------------------------------------------------------------------------------

/// The string literals of a Rust source, outside `//` comments (naive: no escapes, one line).
fn literals(src: &str) -> Vec<(&str, &str)> {
    let mut out = vec![];
    for line in src.lines().filter(|l| !l.trim_start().starts_with("//")) {
        let parts: Vec<&str> = line.split('"').collect();
        for k in (1..parts.len().saturating_sub(1)).step_by(2) {
            out.push((parts[k - 1], parts[k]));
        }
    }
    out
}

/// What the Rust sources under `dirs` run: commands, `.tools/bin` tools and scripts.
fn parse_rust(repo: &Repo, dirs: &[&str], excluded: &[&str]) -> Script {
    let in_dirs = |path: &str| {
        dirs.iter().any(|d| path.starts_with(&format!("{d}/")))
            && !excluded.iter().any(|d| path.starts_with(&format!("{d}/")))
    };
    let sources: Vec<(&String, &String)> = repo
        .files
        .iter()
        // This file names commands as test data only.
        .filter(|(p, _)| p.ends_with(".rs") && in_dirs(p) && !p.ends_with("/script_needs.rs"))
        .collect();
    // `const NAME: &str = "value";` anywhere in the sources (REGISTRY_BINARY, REDIS_BINARY).
    let mut consts = BTreeMap::new();
    for (_, src) in &sources {
        for line in src.lines() {
            let Some((_, rest)) = line.split_once("const ") else {
                continue;
            };
            let Some((name, value)) = rest.split_once(": &str = \"") else {
                continue;
            };
            if let Some(value) = value.strip_suffix("\";") {
                consts.insert(name.trim().to_owned(), value.to_owned());
            }
        }
    }
    let mut s = Script::default();
    for (path, src) in &sources {
        for (before, lit) in literals(src) {
            if before.ends_with("Command::new(") {
                if !ESSENTIAL.contains(&lit) {
                    s.commands.insert(lit.to_owned());
                    s.origin.entry(lit.to_owned()).or_insert(path.to_string());
                }
            } else if before.ends_with("tool(") {
                s.tools.insert(lit.to_owned());
                s.origin.entry(lit.to_owned()).or_insert(path.to_string());
            } else if let Some(tool) = tool_of(lit) {
                s.origin.entry(tool.clone()).or_insert(path.to_string());
                s.tools.insert(tool);
            } else if lit.ends_with(".sh")
                && let Some(k) = lit.find("scripts/").or_else(|| lit.find("deploy/"))
            {
                assert!(
                    repo.files.contains_key(&lit[k..]),
                    "{path} runs {lit}: missing"
                );
                s.scripts.insert(lit[k..].to_owned());
            }
        }
        for (k, _) in src.match_indices("Command::new(") {
            let arg: String = src[k + "Command::new(".len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if let Some(value) = consts.get(&arg) {
                s.commands.insert(value.clone());
                s.origin.entry(value.clone()).or_insert(path.to_string());
            }
        }
    }
    s
}

// --- the check -----------------------------------------------------------------------------

/// The tools each builder script builds, from needs.sh's `needs_tool_builder` table.
fn builders(repo: &Repo) -> BTreeMap<String, String> {
    let lib = repo.text("scripts/lib/needs.sh");
    let mut built_by = BTreeMap::new();
    for line in lib.lines() {
        let Some((names, rest)) = line.split_once(") echo ") else {
            continue;
        };
        let builder = format!("scripts/{}", rest.trim_end_matches(" ;;").trim());
        for name in names.split('|') {
            built_by.insert(name.trim().to_owned(), builder.clone());
        }
    }
    assert!(
        built_by.contains_key("crane"),
        "needs_tool_builder's table not found"
    );
    built_by
}

/// Every problem found, one line each.
fn check(repo: &Repo) -> Vec<String> {
    let lib_functions = functions(repo.text("scripts/lib/needs.sh"));
    let built_by = builders(repo);
    let scripts: BTreeMap<&str, Script> = repo
        .files
        .iter()
        .filter(|(p, _)| p.ends_with(".sh"))
        .map(|(p, src)| (p.as_str(), parse_script(src, &lib_functions)))
        .collect();
    let mut problems = vec![];
    let undeclared = |who: &str,
                      what: &str,
                      cmds: &BTreeSet<String>,
                      tools: &BTreeSet<String>,
                      s: &Script| {
        let mut found = vec![];
        for cmd in cmds.difference(&s.declared) {
            found.push(format!(
                "{who} runs `{cmd}`{what} but does not declare it (needs_pkgs {cmd}:<Debian package>, or needs_cmds)"
            ));
        }
        for tool in tools.difference(&s.declared_tools) {
            if built_by.get(tool).map(String::as_str) != Some(who) {
                found.push(format!(
                    "{who} runs .tools/bin/{tool}{what} but does not declare it (needs_tools {tool})"
                ));
            }
        }
        found
    };

    // Each script in scripts/ declares what it runs itself, through the helper.
    for (path, s) in &scripts {
        if !path.starts_with("scripts/") || path.starts_with("scripts/lib/") {
            continue;
        }
        if std::env::var_os("IVORY_SCRIPT_NEEDS_DEBUG").is_some() {
            eprintln!("{path}: {s:?}");
        }
        let src = repo.text(path);
        if src.starts_with("#!") && !src.contains("\nneeds_done") {
            problems.push(format!(
                "{path} does not use scripts/lib/needs.sh (no needs_done)"
            ));
        }
        problems.extend(undeclared(path, "", &s.commands, &s.tools, s));
    }

    // Each suite script declares what its tests run, and what the scripts they run run.
    for (suite, dirs, excluded) in SUITES {
        let rust = parse_rust(repo, dirs, excluded);
        let mut commands: BTreeMap<String, String> = rust
            .commands
            .iter()
            .map(|c| (c.clone(), format!(" (in {})", rust.origin[c])))
            .collect();
        let mut tools: BTreeMap<String, String> = rust
            .tools
            .iter()
            .map(|t| (t.clone(), format!(" (in {})", rust.origin[t])))
            .collect();
        let mut todo: Vec<String> = rust.scripts.iter().cloned().collect();
        let mut seen = BTreeSet::new();
        while let Some(path) = todo.pop() {
            if !seen.insert(path.clone()) {
                continue;
            }
            let s = &scripts[path.as_str()];
            for c in &s.commands {
                commands
                    .entry(c.clone())
                    .or_insert_with(|| format!(" (in {path}, which its tests run)"));
            }
            for t in &s.tools {
                tools
                    .entry(t.clone())
                    .or_insert_with(|| format!(" (in {path}, which its tests run)"));
            }
            todo.extend(s.scripts.iter().map(|w| resolve(repo, &path, w)));
        }
        let s = &scripts[*suite];
        if std::env::var_os("IVORY_SCRIPT_NEEDS_DEBUG").is_some() {
            eprintln!(
                "{suite}: runs {commands:?} {tools:?}; declares {:?} {:?}",
                s.declared, s.declared_tools
            );
        }
        for (cmd, via) in &commands {
            let what = via.as_str();
            problems.extend(undeclared(
                suite,
                what,
                &BTreeSet::from([cmd.clone()]),
                &BTreeSet::new(),
                s,
            ));
        }
        for (tool, via) in &tools {
            let what = via.as_str();
            problems.extend(undeclared(
                suite,
                what,
                &BTreeSet::new(),
                &BTreeSet::from([tool.clone()]),
                s,
            ));
        }
    }
    problems
}

#[test]
fn every_script_declares_what_it_and_its_tests_run() {
    let repo = Repo::load();
    if let Some(path) = std::env::var("IVORY_SCRIPT_NEEDS_DEBUG")
        .ok()
        .filter(|p| p.ends_with(".sh"))
    {
        for seg in segments(repo.text(&path)) {
            eprintln!("{seg:?}");
        }
    }
    let problems = check(&repo);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The check sees what issue 29 was about: e2e.sh without htpasswd, which the tests' registry
/// harness runs (crates/ivory-testkit/src/registry.rs).
#[test]
fn a_need_removed_from_a_script_is_reported() {
    let mut repo = Repo::load();
    let e2e = repo.files.get_mut("scripts/e2e.sh").unwrap();
    assert!(e2e.contains(" htpasswd:apache2-utils"), "{e2e}");
    *e2e = e2e.replace(" htpasswd:apache2-utils", "");
    let problems = check(&repo);
    assert!(
        problems
            .iter()
            .any(|p| p.starts_with("scripts/e2e.sh runs `htpasswd`")),
        "{problems:#?}"
    );

    // And a command a script runs without declaring it.
    let mut repo = Repo::load();
    let demo = repo.files.get_mut("scripts/demo.sh").unwrap();
    *demo = demo.replace("needs_pkgs curl:curl jq:jq", "needs_pkgs curl:curl");
    let problems = check(&repo);
    assert!(
        problems
            .iter()
            .any(|p| p.starts_with("scripts/demo.sh runs `jq`")),
        "{problems:#?}"
    );
    assert!(
        !problems.iter().any(|p| p.starts_with("scripts/test.sh")),
        "test.sh declares jq itself: {problems:#?}"
    );
}

/// The lexer finds the commands of the shapes the scripts use, and nothing in strings, comments,
/// awk programs, heredocs or case patterns.
#[test]
fn shell_commands_are_found_where_bash_runs_them() {
    let src = r#"#!/usr/bin/env bash
# curl in a comment
x="$(jq -r .a f)" # htpasswd
CGO_ENABLED=0 nice -n 10 go build ./x
echo "redis-server; openssl | ss" >&2
awk '
  { system("notacommand") }
' f
cat >f <<EOF
notacommand either
EOF
case "$1" in
  crane | cosign) git status ;;
  *) echo "$(dirname "$0")" ;;
esac
f() { ss -Htan; }
"$TOOLS/crane" version
[ -x a ] || { openssl version; }
for t in a b; do python3 -c 'x'; done
"#;
    let s = parse_script(src, &BTreeSet::new());
    let want: BTreeSet<String> = ["jq", "go", "git", "ss", "openssl", "python3"]
        .map(String::from)
        .into();
    assert_eq!(s.commands, want);
    assert_eq!(s.tools, BTreeSet::from(["crane".to_owned()]));
}
