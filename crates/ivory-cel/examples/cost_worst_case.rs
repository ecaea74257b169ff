//! Prints the wall time of evaluations that spend the whole per-evaluation cost limit, to
//! find the worst case one evaluation can take: `cargo run --release -p ivory-cel --example
//! cost_worst_case`.

use ivory_cel::{Activation, NoHost, Scope, compile};
use serde_json::json;

fn main() {
    let scope = Scope::new(["object"]);
    let long = "a".repeat(200_000);
    let object = json!({
        "items": (0..1_000_000).collect::<Vec<_>>(),
        "strings": (0..100_000).map(|i| format!("s{i}")).collect::<Vec<_>>(),
        "long": long,
        "nested": (0..2000).map(|i| json!({"name": format!("n{i}"), "env": [{"name": "A"}, {"name": "B"}]})).collect::<Vec<_>>(),
    });
    let cases = [
        "lists.range(400).all(a, lists.range(400).all(b, lists.range(400).all(c, a + b + c >= 0)))",
        "object.items.all(x, x >= 0)",
        "object.items.map(x, x + 1).size() > 0",
        "object.items.filter(x, x % 2 == 0).size() > 0",
        "object.strings.all(s, s.matches('^s[0-9]+$'))",
        "object.strings.all(s, s.startsWith('s') && s.size() > 0 && s != 'x')",
        "object.strings.map(s, s.upperAscii() + '-' + s).size() > 0",
        "lists.range(100000).all(i, !object.long.contains('b'))",
        "lists.range(100000).all(i, object.long.split('b').size() == 1)",
        "object.nested.all(n, object.nested.exists(m, m.name == n.name + 'x'))",
        "lists.range(1000).all(i, object.strings.exists(s, s == 'none'))",
        "lists.range(1000).all(i, 'none' in object.strings)",
    ];
    let mut act = Activation::new(&NoHost);
    act.bind_json("object", &object);
    for src in cases {
        let program = match compile(src, &scope) {
            Ok(p) => p,
            Err(e) => {
                println!("refused      {src}: {e}");
                continue;
            }
        };
        // Warm the conversion of `object` and the regex cache.
        let _ = program.evaluate(&act);
        let runs = 5;
        let mut worst = std::time::Duration::ZERO;
        let mut outcome = String::new();
        for _ in 0..runs {
            let start = ivory_clock::now();
            let result = program.evaluate(&act);
            worst = worst.max(start.elapsed());
            outcome = match result {
                Ok(v) => format!("ok {v:?}"),
                Err(e) => e.to_string().chars().take(60).collect(),
            };
        }
        println!(
            "{:>9.2} ms  estimate {:>15}  {src}\n             -> {outcome}",
            worst.as_secs_f64() * 1e3,
            program.estimated_cost()
        );
    }
}
