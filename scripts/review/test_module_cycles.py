"""Tests of module-cycles.py: `python3 -m unittest discover -s scripts/review` (scripts/test.sh).

Each case writes a small crate and asks for its circles, so the gate is proven on the shapes
it must see (a circle through a re-export, a glob, a rename) and on those it must leave alone.
"""

import importlib.util
import pathlib
import tempfile
import unittest

_SPEC = importlib.util.spec_from_file_location(
    "module_cycles", pathlib.Path(__file__).with_name("module-cycles.py")
)
module_cycles = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(module_cycles)


def circles(files: dict) -> list:
    """The import circles of a crate made of `files` (path under src/ → text)."""
    with tempfile.TemporaryDirectory() as root:
        src = pathlib.Path(root) / "src"
        for path, text in files.items():
            (src / path).parent.mkdir(parents=True, exist_ok=True)
            (src / path).write_text(text, encoding="utf-8")
        return module_cycles.cycles(src)


class ModuleCycles(unittest.TestCase):
    def test_a_direct_circle_is_found(self):
        found = circles({
            "lib.rs": "mod a;\nmod b;\n",
            "a.rs": "use crate::b::Beta;\npub struct Alpha;\n",
            "b.rs": "pub struct Beta;\nfn f() -> crate::a::Alpha { todo!() }\n",
        })
        self.assertEqual(found, [[("a",), ("b",)]])

    def test_a_circle_through_the_roots_reexport_is_found(self):
        # `crate::Alpha` names the root, an ancestor of both; a reader opens a.rs.
        found = circles({
            "lib.rs": "mod a;\nmod b;\npub use a::Alpha;\n",
            "a.rs": "use crate::b::Beta;\npub struct Alpha;\n",
            "b.rs": "use crate::Alpha;\npub struct Beta;\n",
        })
        self.assertEqual(found, [[("a",), ("b",)]])

    def test_a_circle_through_a_parents_crate_visible_reexport_is_found(self):
        # The shape ivory-cel had: a sibling reached through `library/mod.rs`'s `pub(crate) use`.
        found = circles({
            "lib.rs": "mod activation;\nmod library;\n",
            "activation.rs": "pub struct Query;\nfn f() { crate::library::query(); }\n",
            "library/mod.rs": "mod resources;\npub(crate) use resources::query;\n",
            "library/resources.rs": "use crate::activation::Query;\npub fn query() {}\n",
        })
        self.assertEqual(found, [[("activation",), ("library", "resources")]])

    def test_glob_and_renamed_reexports_are_followed(self):
        glob = circles({
            "lib.rs": "mod a;\nmod b;\nmod c;\npub use c::*;\n",
            "c.rs": "pub use crate::a::Alpha;\n",
            "a.rs": "use crate::b::Beta;\npub struct Alpha;\n",
            "b.rs": "use crate::Alpha;\npub struct Beta;\n",
        })
        self.assertEqual(glob, [[("a",), ("b",)]])
        renamed = circles({
            "lib.rs": "mod a;\nmod b;\npub use a::{Alpha as First};\n",
            "a.rs": "use crate::b::Beta;\npub struct Alpha;\n",
            "b.rs": "use crate::First;\npub struct Beta;\n",
        })
        self.assertEqual(renamed, [[("a",), ("b",)]])

    def test_one_way_dependencies_and_parents_are_no_circle(self):
        found = circles({
            "lib.rs": "mod a;\nmod b;\npub use a::Alpha;\npub struct Root;\n",
            "a.rs": "use crate::b::Beta;\nuse crate::Root;\npub struct Alpha;\n",
            "b.rs": "use super::Root;\nuse other_crate::Alpha;\npub struct Beta;\n",
        })
        self.assertEqual(found, [])

    def test_test_code_is_left_out(self):
        found = circles({
            "lib.rs": "mod a;\nmod b;\n",
            "a.rs": "use crate::b::Beta;\npub struct Alpha;\n",
            "b.rs": "pub struct Beta;\n#[cfg(test)]\nmod tests {\n    use crate::a::Alpha;\n}\n",
        })
        self.assertEqual(found, [])

    def test_a_reexport_loop_ends(self):
        found = circles({
            "lib.rs": "mod a;\nmod b;\n",
            "a.rs": "pub use crate::b::Loop;\n",
            "b.rs": "pub use crate::a::Loop;\n",
        })
        self.assertEqual(found, [[("a",), ("b",)]])


if __name__ == "__main__":
    unittest.main()
