//! Static checks cel-rust does not do (it has no type checker): undeclared identifiers and
//! unknown functions. Also records `variables.NAME` references and called functions, and
//! rewrites `matches` to the library's regex-caching implementation.

use std::collections::{BTreeMap, BTreeSet};

use cel::IdedExpr;
use cel::common::ast::{CallExpr, EntryExpr, Expr, IdedEntryExpr, LiteralValue, operators};

use crate::library::{Library, MATCHES_CACHED};
use crate::{CompileError, Scope};

/// Name of the lazily-evaluated policy variables map.
const VARIABLES: &str = "variables";

#[derive(Debug, Default)]
pub(crate) struct Analysis {
    pub variable_refs: Vec<String>,
    pub dynamic_variables: bool,
    pub functions: BTreeSet<String>,
    /// The declared variables the expression reads (`object`, `images`, `variables`, ...):
    /// what its value can depend on besides its function calls.
    pub globals: BTreeSet<String>,
    /// String literals passed directly as arguments, by called function.
    pub literal_args: BTreeMap<String, BTreeSet<String>>,
    /// Each call of a namespaced function (`resource.Get`), its arguments in order: the
    /// string literal, or `None` for any other expression.
    pub namespaced_calls: BTreeMap<String, Vec<Vec<Option<String>>>>,
    /// Deepest nesting of the tree, as the interpreter recurses through it.
    pub max_depth: usize,
}

pub(crate) fn analyze(
    expr: &mut IdedExpr,
    scope: &Scope,
    lib: &Library,
) -> Result<Analysis, CompileError> {
    let mut walker = Walker {
        scope,
        lib,
        bound: Vec::new(),
        depth: 0,
        out: Analysis::default(),
    };
    walker.walk(expr)?;
    Ok(walker.out)
}

struct Walker<'s> {
    scope: &'s Scope,
    lib: &'s Library,
    /// Comprehension variables in scope, innermost last.
    bound: Vec<String>,
    depth: usize,
    out: Analysis,
}

impl Walker<'_> {
    fn is_bound(&self, name: &str) -> bool {
        self.bound.iter().any(|b| b == name)
    }

    /// `variables` as a top-level (not shadowed) identifier.
    fn is_variables(&self, e: &IdedExpr) -> bool {
        matches!(&e.expr, Expr::Ident(n) if n == VARIABLES && !self.is_bound(VARIABLES))
    }

    fn add_variable_ref(&mut self, name: &str) {
        self.out.globals.insert(VARIABLES.to_owned());
        if !self.out.variable_refs.iter().any(|r| r == name) {
            self.out.variable_refs.push(name.to_owned());
        }
    }

    /// Walks the keys and values of a map literal or the fields of a struct literal.
    fn walk_entries(&mut self, entries: &mut [IdedEntryExpr]) -> Result<(), CompileError> {
        entries
            .iter_mut()
            .try_for_each(|entry| match &mut entry.expr {
                EntryExpr::MapEntry(me) => {
                    self.walk(&mut me.key)?;
                    self.walk(&mut me.value)
                }
                EntryExpr::StructField(sf) => self.walk(&mut sf.value),
            })
    }

    fn walk(&mut self, e: &mut IdedExpr) -> Result<(), CompileError> {
        if self.depth >= crate::MAX_AST_DEPTH {
            return Err(CompileError::TooDeep(crate::MAX_AST_DEPTH));
        }
        self.depth += 1;
        self.out.max_depth = self.out.max_depth.max(self.depth);
        let result = self.walk_inner(e);
        self.depth -= 1;
        result
    }

    fn walk_inner(&mut self, e: &mut IdedExpr) -> Result<(), CompileError> {
        if matches!(e.expr, Expr::Select(_)) {
            return self.walk_select(e);
        }
        match &mut e.expr {
            Expr::Unspecified | Expr::Literal(_) | Expr::Select(_) => Ok(()),
            Expr::Ident(name) => self.check_ident(name),
            Expr::Call(call) => self.walk_call(call),
            Expr::Comprehension(c) => {
                self.walk(&mut c.iter_range)?;
                self.walk(&mut c.accu_init)?;
                let pushed = 2 + usize::from(c.iter_var2.is_some());
                self.bound.push(c.iter_var.clone());
                if let Some(v2) = &c.iter_var2 {
                    self.bound.push(v2.clone());
                }
                self.bound.push(c.accu_var.clone());
                let res = self
                    .walk(&mut c.loop_cond)
                    .and_then(|_| self.walk(&mut c.loop_step))
                    .and_then(|_| self.walk(&mut c.result));
                self.bound.truncate(self.bound.len() - pushed);
                res
            }
            Expr::List(list) => list.elements.iter_mut().try_for_each(|el| self.walk(el)),
            Expr::Map(map) => self.walk_entries(&mut map.entries),
            Expr::Struct(st) => {
                if !self.lib.has_type(&st.type_name) {
                    return Err(CompileError::UndeclaredReference(st.type_name.clone()));
                }
                self.walk_entries(&mut st.entries)
            }
        }
    }

    fn walk_select(&mut self, e: &mut IdedExpr) -> Result<(), CompileError> {
        if let Expr::Select(select) = &e.expr
            && self.is_variables(&select.operand)
        {
            if !self.scope.contains(VARIABLES) {
                return Err(CompileError::UndeclaredReference(VARIABLES.to_owned()));
            }
            let field = select.field.clone();
            self.add_variable_ref(&field);
            return Ok(());
        }
        if let Some(segments) = e.expr_qualified_segments() {
            if self.depth + segments.len() > crate::MAX_AST_DEPTH {
                return Err(CompileError::TooDeep(crate::MAX_AST_DEPTH));
            }
            return self.check_qualified(&segments);
        }
        match &mut e.expr {
            Expr::Select(select) => self.walk(&mut select.operand),
            _ => Ok(()),
        }
    }

    fn check_ident(&mut self, name: &str) -> Result<(), CompileError> {
        if self.is_bound(name) {
            return Ok(());
        }
        if self.scope.contains(name) {
            self.out.globals.insert(name.to_owned());
        }
        if name == VARIABLES && self.scope.contains(name) {
            // `variables` used as a whole value: its keys are not known statically.
            self.out.dynamic_variables = true;
        }
        if self.scope.contains(name) || self.lib.has_type(name) {
            Ok(())
        } else {
            Err(CompileError::UndeclaredReference(name.to_owned()))
        }
    }

    /// `a.b.c`: the root must be declared, unless some prefix names a type.
    fn check_qualified(&mut self, segments: &[String]) -> Result<(), CompileError> {
        let root = &segments[0];
        if root == VARIABLES && !self.is_bound(root) && segments.len() >= 2 {
            if !self.scope.contains(VARIABLES) {
                return Err(CompileError::UndeclaredReference(VARIABLES.to_owned()));
            }
            self.add_variable_ref(&segments[1]);
            return Ok(());
        }
        if self.is_bound(root) || self.scope.contains(root) {
            return self.check_ident(root);
        }
        let is_type = (1..=segments.len()).any(|n| self.lib.has_type(&segments[..n].join(".")));
        if is_type {
            Ok(())
        } else {
            Err(CompileError::UndeclaredReference(root.clone()))
        }
    }

    fn walk_call(&mut self, call: &mut CallExpr) -> Result<(), CompileError> {
        // variables["x"], variables[?"x"], variables.?x
        if matches!(
            call.func_name.as_str(),
            operators::INDEX | operators::OPT_INDEX | operators::OPT_SELECT
        ) && call.target.is_none()
            && call.args.len() == 2
            && self.is_variables(&call.args[0])
        {
            match &call.args[1].expr {
                Expr::Literal(LiteralValue::String(s)) => {
                    let name = s.inner().to_owned();
                    self.add_variable_ref(&name);
                }
                _ => {
                    self.out.globals.insert(VARIABLES.to_owned());
                    self.out.dynamic_variables = true;
                }
            }
            return self.walk(&mut call.args[1]);
        }
        if call.func_name == "matches" {
            call.func_name = MATCHES_CACHED.to_owned();
            self.out.functions.insert("matches".to_owned());
        }
        if is_operator(&call.func_name) {
            return call.args.iter_mut().try_for_each(|a| self.walk(a));
        }
        let namespaced = call
            .target
            .as_deref()
            .and_then(|t| qualified_segments(&t.expr))
            // As at runtime, a namespaced function wins over a declared variable of the same
            // root name; only comprehension variables shadow it.
            .filter(|segs| !self.is_bound(&segs[0]))
            .map(|segs| format!("{}.{}", segs.join("."), call.func_name))
            .filter(|qualified| self.lib.knows_function(qualified, false));
        let literals: BTreeSet<String> = call
            .args
            .iter()
            .filter_map(|a| match &a.expr {
                Expr::Literal(LiteralValue::String(s)) => Some(s.inner().to_owned()),
                _ => None,
            })
            .collect();
        if !literals.is_empty() {
            let name = namespaced.clone().unwrap_or_else(|| call.func_name.clone());
            self.out
                .literal_args
                .entry(name)
                .or_default()
                .extend(literals);
        }
        match namespaced {
            Some(qualified) => {
                let positional = call
                    .args
                    .iter()
                    .map(|a| match &a.expr {
                        Expr::Literal(LiteralValue::String(s)) => Some(s.inner().to_owned()),
                        _ => None,
                    })
                    .collect();
                self.out
                    .namespaced_calls
                    .entry(qualified.clone())
                    .or_default()
                    .push(positional);
                self.out.functions.insert(qualified);
            }
            None => {
                let member = call.target.is_some();
                if !self.lib.knows_function(&call.func_name, member) {
                    return Err(CompileError::UnknownFunction(call.func_name.clone()));
                }
                if let Some(target) = call.target.as_deref_mut() {
                    self.walk(target)?;
                }
            }
        }
        if call.func_name != MATCHES_CACHED {
            self.out.functions.insert(call.func_name.clone());
        }
        call.args.iter_mut().try_for_each(|a| self.walk(a))
    }
}

/// Operators (`_+_`, `@in`, `!_`, ...) are not names a user can misspell.
fn is_operator(name: &str) -> bool {
    !name.starts_with(|c: char| c.is_ascii_alphabetic())
}

fn qualified_segments(e: &Expr) -> Option<Vec<String>> {
    let mut segments = Vec::new();
    let mut cur = e;
    loop {
        match cur {
            Expr::Ident(n) => {
                segments.push(n.clone());
                segments.reverse();
                return Some(segments);
            }
            Expr::Select(s) if !s.test => {
                segments.push(s.field.clone());
                cur = &s.operand.expr;
            }
            _ => return None,
        }
    }
}

trait QualifiedSegments {
    fn expr_qualified_segments(&self) -> Option<Vec<String>>;
}

impl QualifiedSegments for IdedExpr {
    /// Segments of a select chain ending in an identifier (`has(a.b)` tests its operand).
    fn expr_qualified_segments(&self) -> Option<Vec<String>> {
        match &self.expr {
            Expr::Select(s) if s.test => qualified_segments(&s.operand.expr),
            other => qualified_segments(other),
        }
    }
}
