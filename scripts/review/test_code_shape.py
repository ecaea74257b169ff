"""Tests of code-shape.py: `python3 -m unittest discover -s scripts/review` (scripts/test.sh)."""

import importlib.util
import pathlib
import unittest

_SPEC = importlib.util.spec_from_file_location(
    "code_shape", pathlib.Path(__file__).with_name("code-shape.py")
)
code_shape = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(code_shape)


def body(lines: int) -> str:
    return "".join(f"    let _x{i} = {i};\n" for i in range(lines))


class FunctionLengths(unittest.TestCase):
    def test_lengths_run_from_fn_to_its_closing_brace(self):
        text = "fn short() {\n}\n\npub(crate) async fn long(a: u8) -> u8 {\n" + body(10) + "    a\n}\n"
        self.assertEqual(
            [(name, length) for name, _, length in code_shape.functions(text)],
            [("short", 2), ("long", 13)],
        )

    def test_braces_in_strings_chars_and_comments_do_not_count(self):
        text = (
            'fn f() {\n    let s = "}}}";\n    let r = r#"{"#;\n    let c = \'}\';\n'
            "    // }\n    /* } */\n}\nfn g() {\n}\n"
        )
        self.assertEqual(
            [(name, length) for name, _, length in code_shape.functions(text)],
            [("f", 7), ("g", 2)],
        )

    def test_raw_byte_strings_are_strings(self):
        text = 'fn f() {\n    let t = br#"{"token":""#;\n    let u = br"}";\n}\nfn g() {\n}\n'
        self.assertEqual(
            [(name, length) for name, _, length in code_shape.functions(text)],
            [("f", 4), ("g", 2)],
        )

    def test_declarations_without_a_body_are_not_functions(self):
        text = "trait T {\n    fn declared(&self) -> u8;\n    fn given(&self) -> u8 {\n        1\n    }\n}\n"
        self.assertEqual([name for name, _, _ in code_shape.functions(text)], ["given"])

    def test_lifetimes_are_not_char_literals(self):
        text = "fn f<'a>(x: &'a str) -> &'a str {\n    x\n}\nfn g() {\n}\n"
        self.assertEqual(
            [(name, length) for name, _, length in code_shape.functions(text)],
            [("f", 3), ("g", 2)],
        )


class StringErrors(unittest.TestCase):
    def test_string_results_are_found_and_typed_ones_are_not(self):
        code = "fn a() -> Result<u8, String> {\n}\nfn b() -> Result<Vec<u8>, MyError> {\n}\n"
        self.assertEqual(len(list(code_shape.string_results(code))), 1)

    def test_the_error_is_the_last_top_level_argument(self):
        found = [
            "fn a() -> Result<BTreeMap<String, String>, String> {}",
            "fn b() -> std::result::Result<Vec<Value>, String> {}",
            "fn c(x: &[(&str, Result<bool, String>)]) {}",
            "fn d() -> Result<Box<dyn Fn(u8) -> u8>, String> {}",
            "fn e() -> Result<[u8; 32], String> {}",
        ]
        typed = [
            "fn a() -> Result<BTreeMap<String, String>> {}",
            "fn b() -> Result<BTreeMap<String, String>, MyError> {}",
            "fn c() -> Result<(u8, String), E> {}",
            "fn d() -> Result<Vec<String>> {}",
            "fn e() -> Result<HashMap<String, Vec<String>>> {}",
            "fn f() -> Result<[String; 2], E> {}",
            "fn g() -> Result<Box<dyn Fn(u8) -> String>, E> {}",
            "fn h() -> ParseResult<String> {}",
            "fn i(b: u8) -> bool { Result < b; String > b }",
        ]
        for code in found:
            self.assertEqual(len(list(code_shape.string_results(code))), 1, code)
        for code in typed:
            self.assertEqual(list(code_shape.string_results(code)), [], code)

    def test_value_parsers_are_named_by_their_attribute(self):
        text = '#[arg(long, value_parser = parse_duration)]\n#[arg(value_parser(cli::parse_size))]\n'
        self.assertEqual(code_shape.VALUE_PARSER.findall(text), ["parse_duration", "parse_size"])


if __name__ == "__main__":
    unittest.main()
