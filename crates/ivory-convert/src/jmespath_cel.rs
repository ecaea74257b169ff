//! Kyverno's JMESPath (`github.com/kyverno/go-jmespath`, the fork Kyverno v1.19.1 evaluates
//! `{{ }}` variables with) as CEL with the same result, for the subset below; anything else is
//! refused naming the construct.
//!
//! The expression is parsed by the `jmespath` crate; its AST is translated node by node into a
//! CEL expression yielding the JSON value the fork yields. The fork's rules the CEL keeps:
//!
//! * a field of an object lacking it is a "not found" error, which a projection, a filter, a
//!   pipe, `||`, a comparison or a function's argument turns into null, while a sub-expression
//!   (`a.b`, `a[0]`) and `&&`'s right side pass it on, up to the top where Kyverno's substitution
//!   fails: the CEL reads such a field with `c.f` (an error where the field is missing) at the
//!   top and with `'f' in c` below. A field of a non-object, an index of a non-list or out of
//!   range, is null;
//! * projections (`[*]`, `[]`, filters) give null on a non-list and drop null results; a
//!   flatten merges one level (`.flatten()`); a filter keeps the elements whose predicate is
//!   truthy (not null, false, "", [], {});
//! * `<`, `<=`, `>`, `>=` compare two numbers and are null otherwise (a string is never
//!   converted: `x > '8.0'` is always null); `==`/`!=` compare values deeply;
//! * `||` gives its left value unless falsy, `&&` its left value when falsy;
//! * `length(@)` counts a string's code points or a list's or object's entries and is an error on
//!   anything else, as `size()` is.
//!
//! Numbers are compared as doubles, as the fork holds every JSON number as a float64.

use jmespath::ast::{Ast, Comparator};

use super::error::ErrorKind;
use super::images::cel_string;

/// The fork's falsy values, as a CEL list for `in`.
const FALSY: &str = "[null, false, '', [], {}]";

/// What the translator needs from its caller.
pub(crate) struct Context<'a> {
    /// The CEL expression of the document the expression reads (`predicate`).
    pub(crate) root: &'a str,
    /// Called with each field read from the root document; an error refuses the expression
    /// (a name Kyverno reads from its admission context rather than the document).
    pub(crate) root_field: &'a dyn Fn(&str) -> Result<(), ErrorKind>,
}

/// `source` (the text inside `{{ }}`) as a CEL expression of its value on `ctx.root`: an
/// error where Kyverno's substitution fails, null where the fork's result is null.
pub(crate) fn to_cel(source: &str, ctx: &Context<'_>) -> Result<String, ErrorKind> {
    let ast = parse(source)?;
    let mut translator = Translator {
        source,
        ctx,
        fresh: 0,
    };
    Ok(translator.value(&ast, ctx.root, Mode::Strict)?.cel)
}

/// The expression's AST, or why the fork's grammar (which the crate's follows) refuses it.
pub(crate) fn parse(source: &str) -> Result<Ast, ErrorKind> {
    jmespath::parse(source).map_err(|e| {
        ErrorKind::Invalid(format!(
            "{{{{ {source} }}}}: not a JMESPath expression: {e}"
        ))
    })
}

/// Whether a missing field at this point is an error (passed up to Kyverno's substitution) or
/// null (swallowed by the construct around it).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Strict,
    Lenient,
}

/// What is known of a translated value's type, to state its truthiness briefly.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Any,
    /// true, false or null (an ordering comparison).
    BoolOrNull,
    /// true or false.
    Bool,
}

struct Cel {
    cel: String,
    kind: Kind,
}

impl Cel {
    fn any(cel: String) -> Self {
        Self {
            cel,
            kind: Kind::Any,
        }
    }

    /// The fork's truthiness of this value as a CEL boolean.
    fn truthy(&self) -> String {
        match self.kind {
            Kind::Bool => self.cel.clone(),
            Kind::BoolOrNull => format!("{} == true", self.cel),
            Kind::Any => format!("!({} in {FALSY})", self.cel),
        }
    }
}

struct Translator<'a> {
    source: &'a str,
    ctx: &'a Context<'a>,
    /// Counter for the names of bound values and comprehension variables.
    fresh: usize,
}

impl Translator<'_> {
    fn refuse(&self, construct: &str) -> ErrorKind {
        ErrorKind::Unsupported(format!(
            "{{{{ {} }}}}: {construct} is not converted (translated: fields, [n], [*], [], \
             filters, |, ||, &&, !, comparisons, [a, b], literals, length())",
            self.source
        ))
    }

    fn name(&mut self, prefix: &str) -> String {
        self.fresh += 1;
        format!("{prefix}{}", self.fresh)
    }

    /// `body(v)` with `v` naming `value`: `value` itself when it is a plain identifier, else a
    /// fresh `cel.bind` (so a value is computed once however often the body reads it).
    fn bound(&mut self, value: &str, body: impl FnOnce(&mut Self, &str) -> String) -> String {
        if is_identifier(value) {
            return body(self, value);
        }
        let name = self.name("jp");
        let inner = body(self, &name);
        format!("cel.bind({name}, {value}, {inner})")
    }

    /// A name for `value`: itself when a plain identifier, else a fresh one to bind it to with
    /// [`wrap_bind`] (for bodies whose translation can fail, which [`Self::bound`] cannot take).
    fn bind_name<'v>(&mut self, value: &'v str) -> (String, Option<&'v str>) {
        if is_identifier(value) {
            (value.to_owned(), None)
        } else {
            (self.name("jp"), Some(value))
        }
    }

    fn value(&mut self, ast: &Ast, cur: &str, mode: Mode) -> Result<Cel, ErrorKind> {
        match ast {
            Ast::Identity { .. } => Ok(Cel::any(cur.to_owned())),
            Ast::Field { name, .. } => self.field(name, cur, mode),
            Ast::Index { idx, .. } => Ok(Cel::any(self.index(*idx, cur))),
            Ast::Literal { value, .. } => {
                let json = serde_json::to_value(&**value)
                    .map_err(|e| self.refuse(&format!("the literal ({e})")))?;
                Ok(Cel::any(json_literal(&json)))
            }
            Ast::Subexpr { offset, lhs, rhs } => {
                if self.source.as_bytes().get(*offset) == Some(&b'|') {
                    // A pipe: a missing field on either side is null, and the right side reads
                    // whatever the left gave.
                    let left = self.value(lhs, cur, Mode::Lenient)?;
                    return self.value(rhs, &left.cel, Mode::Lenient);
                }
                if !null_on_null(rhs) {
                    // A construct refused anywhere is named as such; what is left is a function.
                    self.value(rhs, cur, mode)?;
                    return Err(self.refuse("a function call after '.'"));
                }
                // A missing field on the left ends the sub-expression (an error passed up, or
                // null), and the right side gives null on null: reading it from null is the same.
                let left = self.value(lhs, cur, mode)?;
                self.value(rhs, &left.cel, mode)
            }
            Ast::Projection { lhs, rhs, .. } => self.projection(lhs, rhs, cur),
            Ast::Comparison {
                comparator,
                lhs,
                rhs,
                ..
            } => self.comparison(comparator, lhs, rhs, cur),
            Ast::Or { lhs, rhs, .. } => {
                let left = self.value(lhs, cur, Mode::Lenient)?;
                let right = self.value(rhs, cur, Mode::Lenient)?;
                Ok(Cel::any(self.bound(&left.cel, |_, v| {
                    let left = Cel {
                        cel: v.to_owned(),
                        kind: left.kind,
                    };
                    format!("({} ? {v} : {})", left.truthy(), right.cel)
                })))
            }
            Ast::And { lhs, rhs, .. } => {
                let left = self.value(lhs, cur, Mode::Lenient)?;
                // The fork returns the right side's own error: a missing field is passed on.
                let right = self.value(rhs, cur, mode)?;
                Ok(Cel::any(self.bound(&left.cel, |_, v| {
                    let left = Cel {
                        cel: v.to_owned(),
                        kind: left.kind,
                    };
                    format!("({} ? {} : {v})", left.truthy(), right.cel)
                })))
            }
            Ast::Not { node, .. } => {
                let inner = self.value(node, cur, Mode::Lenient)?;
                Ok(Cel {
                    cel: format!("!({})", inner.truthy()),
                    kind: Kind::Bool,
                })
            }
            Ast::MultiList { elements, .. } => {
                let (name, value) = self.bind_name(cur);
                let mut items = Vec::with_capacity(elements.len());
                for element in elements {
                    items.push(self.value(element, &name, Mode::Lenient)?.cel);
                }
                let list = format!("({name} == null ? null : dyn([{}]))", items.join(", "));
                Ok(Cel::any(wrap_bind(&name, value, list)))
            }
            Ast::Function { name, args, .. } => self.function(name, args, cur),
            Ast::Flatten { .. } | Ast::Condition { .. } => {
                // The parser only makes these as a projection's sides (handled there).
                Err(self.refuse("a flatten or filter outside a projection"))
            }
            Ast::ObjectValues { .. } => Err(self.refuse("the object wildcard '*'")),
            Ast::Slice { .. } => Err(self.refuse("a slice")),
            Ast::Expref { .. } => Err(self.refuse("an expression reference '&'")),
            Ast::MultiHash { .. } => Err(self.refuse("a multi-select hash")),
        }
    }

    fn field(&mut self, name: &str, cur: &str, mode: Mode) -> Result<Cel, ErrorKind> {
        if cur == self.ctx.root {
            (self.ctx.root_field)(name)?;
        }
        let select = |v: &str| {
            if super::images::is_cel_identifier(name) {
                format!("{v}.{name}")
            } else {
                format!("{v}[{}]", cel_string(name))
            }
        };
        Ok(Cel::any(self.bound(cur, |_, v| match mode {
            // A map lacking the field: CEL's own error, as the fork's "not found" at the top.
            Mode::Strict => format!("(type({v}) == map ? {} : null)", select(v)),
            Mode::Lenient => format!(
                "(type({v}) == map && {} in {v} ? {} : null)",
                cel_string(name),
                select(v)
            ),
        })))
    }

    fn index(&mut self, idx: i32, cur: &str) -> String {
        self.bound(cur, |_, v| {
            if idx >= 0 {
                format!("(type({v}) == list && size({v}) > {idx} ? {v}[{idx}] : null)")
            } else {
                let back = -i64::from(idx);
                format!(
                    "(type({v}) == list && size({v}) >= {back} ? {v}[size({v}) - {back}] : null)"
                )
            }
        })
    }

    /// `lhs[*].rhs`, `lhs[].rhs` (the parser's `Flatten` on the left) and `lhs[?pred].rhs` (a
    /// `Condition` on the right).
    fn projection(&mut self, lhs: &Ast, rhs: &Ast, cur: &str) -> Result<Cel, ErrorKind> {
        // The fork turns every error of a filter's or flatten's left side into null; only a
        // missing field (null here too) can happen without a function there.
        if has_function(lhs) {
            return Err(self.refuse("a function call on a projection's left side"));
        }
        let list = match lhs {
            Ast::Flatten { node, .. } => {
                let inner = self.value(node, cur, Mode::Lenient)?;
                self.bound(&inner.cel, |_, v| {
                    format!("(type({v}) == list ? dyn({v}.flatten()) : null)")
                })
            }
            _ => self.value(lhs, cur, Mode::Lenient)?.cel,
        };
        let element = self.name("e");
        let (predicate, then) = match rhs {
            Ast::Condition {
                predicate, then, ..
            } => (Some(&**predicate), &**then),
            other => (None, other),
        };
        let keep = match predicate {
            Some(p) => {
                let kept = self.value(p, &element, Mode::Lenient)?;
                if kept.cel == "null" || kept.cel == "false" {
                    // A predicate that never holds (an ordering against a string literal, say)
                    // keeps nothing: no pass over the list, whose cost would multiply.
                    return Ok(Cel::any(
                        self.bound(&list, |_, v| format!("(type({v}) == list ? [] : null)")),
                    ));
                }
                Some(kept.truthy())
            }
            None => None,
        };
        let mapped = match then {
            Ast::Identity { .. } => None,
            other => Some(self.value(other, &element, Mode::Lenient)?.cel),
        };
        let steps = match (keep, mapped) {
            // The predicate first: its error (a function's) is the fork's even on a null element.
            (Some(keep), None) => {
                format!(".filter({element}, {keep} ? {element} != null : false)")
            }
            (Some(keep), Some(mapped)) => format!(
                ".filter({element}, {keep}).map({element}, {mapped}).filter({element}, {element} != null)"
            ),
            (None, Some(mapped)) => {
                format!(".map({element}, {mapped}).filter({element}, {element} != null)")
            }
            (None, None) => format!(".filter({element}, {element} != null)"),
        };
        Ok(Cel::any(self.bound(&list, |_, v| {
            format!("(type({v}) == list ? dyn({v}{steps}) : null)")
        })))
    }

    fn comparison(
        &mut self,
        comparator: &Comparator,
        lhs: &Ast,
        rhs: &Ast,
        cur: &str,
    ) -> Result<Cel, ErrorKind> {
        let left = self.value(lhs, cur, Mode::Lenient)?;
        let right = self.value(rhs, cur, Mode::Lenient)?;
        let op = match comparator {
            Comparator::Equal => "==",
            Comparator::NotEqual => "!=",
            Comparator::LessThan => "<",
            Comparator::LessThanEqual => "<=",
            Comparator::GreaterThan => ">",
            Comparator::GreaterThanEqual => ">=",
        };
        if matches!(comparator, Comparator::Equal | Comparator::NotEqual) {
            return Ok(Cel {
                cel: format!("({} {op} {})", left.cel, right.cel),
                kind: Kind::Bool,
            });
        }
        let non_number_literal = |ast: &Ast| matches!(ast, Ast::Literal { value, .. } if !matches!(**value, jmespath::Variable::Number(_)));
        if (non_number_literal(lhs) && !has_function(rhs))
            || (non_number_literal(rhs) && !has_function(lhs))
        {
            // The fork orders numbers only: against a string, bool, list or null literal the
            // comparison is null whatever the other side holds.
            return Ok(Cel {
                cel: "null".to_owned(),
                kind: Kind::BoolOrNull,
            });
        }
        let cel = self.bound(&left.cel, |t, a| {
            t.bound(&right.cel, |_, b| {
                format!(
                    "({} && {} ? dyn(double({a}) {op} double({b})) : null)",
                    is_number(a),
                    is_number(b)
                )
            })
        });
        Ok(Cel {
            cel,
            kind: Kind::BoolOrNull,
        })
    }

    fn function(&mut self, name: &str, args: &[Ast], cur: &str) -> Result<Cel, ErrorKind> {
        match (name, args) {
            ("length", [arg]) => {
                // The fork checks the argument's type (string, array, object) and fails
                // otherwise, null included; CEL's size() has exactly those overloads.
                let arg = self.value(arg, cur, Mode::Lenient)?;
                Ok(Cel::any(format!("size({})", arg.cel)))
            }
            _ => Err(self.refuse(&format!("the function {name}()"))),
        }
    }
}

/// Whether `ast` gives null (and no error) when applied to null: what may follow a '.'.
fn null_on_null(ast: &Ast) -> bool {
    match ast {
        Ast::Field { .. } | Ast::Index { .. } | Ast::Identity { .. } | Ast::MultiList { .. } => {
            true
        }
        Ast::Subexpr { lhs, .. } => null_on_null(lhs),
        Ast::Projection { lhs, .. } => match &**lhs {
            Ast::Flatten { node, .. } => null_on_null(node),
            other => null_on_null(other),
        },
        _ => false,
    }
}

fn has_function(ast: &Ast) -> bool {
    match ast {
        Ast::Function { .. } => true,
        Ast::Identity { .. }
        | Ast::Field { .. }
        | Ast::Index { .. }
        | Ast::Literal { .. }
        | Ast::Slice { .. } => false,
        Ast::Subexpr { lhs, rhs, .. }
        | Ast::Projection { lhs, rhs, .. }
        | Ast::Comparison { lhs, rhs, .. }
        | Ast::And { lhs, rhs, .. }
        | Ast::Or { lhs, rhs, .. } => has_function(lhs) || has_function(rhs),
        Ast::Condition {
            predicate, then, ..
        } => has_function(predicate) || has_function(then),
        Ast::Flatten { node, .. }
        | Ast::Not { node, .. }
        | Ast::ObjectValues { node, .. }
        | Ast::Expref { ast: node, .. } => has_function(node),
        Ast::MultiList { elements, .. } => elements.iter().any(has_function),
        Ast::MultiHash { elements, .. } => elements.iter().any(|kv| has_function(&kv.value)),
    }
}

/// `body` with `name` bound to `value` when [`Translator::bind_name`] chose a fresh name.
fn wrap_bind(name: &str, value: Option<&str>, body: String) -> String {
    match value {
        Some(value) => format!("cel.bind({name}, {value}, {body})"),
        None => body,
    }
}

fn is_number(v: &str) -> String {
    format!("(type({v}) == double || type({v}) == int || type({v}) == uint)")
}

fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A JSON value as a CEL literal; numbers as doubles, as the fork reads them.
fn json_literal(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::Null => "null".to_owned(),
        serde_json::Value::Bool(b) => b.to_string(),
        serde_json::Value::Number(n) => {
            let f = n.as_f64().unwrap_or(f64::NAN);
            format!("{f:?}")
        }
        serde_json::Value::String(s) => cel_string(s),
        serde_json::Value::Array(items) => {
            let items: Vec<String> = items.iter().map(json_literal).collect();
            format!("dyn([{}])", items.join(", "))
        }
        serde_json::Value::Object(map) => {
            let entries: Vec<String> = map
                .iter()
                .map(|(k, v)| format!("{}: {}", cel_string(k), json_literal(v)))
                .collect();
            format!("dyn({{{}}})", entries.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ivory_cel::{Activation, NoHost, Scope};
    use serde_json::Value;

    fn any_field(_: &str) -> Result<(), ErrorKind> {
        Ok(())
    }

    const CTX: Context<'static> = Context {
        root: "predicate",
        root_field: &any_field,
    };

    /// The CEL's value on `document`, or its error's text.
    fn evaluate(cel: &str, document: &Value) -> Result<Value, String> {
        let program = ivory_cel::compile(cel, &Scope::new(["predicate"]))
            .unwrap_or_else(|e| panic!("{cel}: {e}"));
        let mut act = Activation::new(&NoHost);
        act.bind_json("predicate", document);
        program.evaluate_json(&act).map_err(|e| e.to_string())
    }

    /// JSON equality with numbers compared as doubles (the fork's float64, CEL's int or double).
    fn same(a: &Value, b: &Value) -> bool {
        match (a, b) {
            (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
            (Value::Array(x), Value::Array(y)) => {
                x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same(x, y))
            }
            (Value::Object(x), Value::Object(y)) => {
                x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
            }
            _ => a == b,
        }
    }

    /// Every row of `fixtures/jmespath/table.json` (Kyverno v1.19.1's own JMESPath, written by
    /// `scripts/jmespath-oracle`): the translation gives Kyverno's value, or an error where
    /// Kyverno's substitution fails.
    #[test]
    fn translations_agree_with_kyvernos_jmespath() {
        let table: Value =
            serde_json::from_str(include_str!("../../../fixtures/jmespath/table.json")).unwrap();
        let rows = table["rows"].as_array().unwrap();
        assert!(rows.len() > 500, "{}", rows.len());
        let mut failures = Vec::new();
        for row in rows {
            let expression = row["expression"].as_str().unwrap();
            let document = &row["document"];
            let cel = to_cel(expression, &CTX).unwrap_or_else(|e| panic!("{expression}: {e}"));
            let got = evaluate(&cel, document);
            let agrees = match (row.get("error"), &got) {
                (Some(_), Err(_)) => true,
                (None, Ok(value)) => same(value, &row["result"]),
                _ => false,
            };
            if !agrees {
                failures.push(format!(
                    "{expression} on {document}: Kyverno {}, CEL {got:?}\n  {cel}",
                    row.get("error").unwrap_or(&row["result"])
                ));
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }
}
