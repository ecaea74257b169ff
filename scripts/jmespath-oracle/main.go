// Command jmespath-oracle writes fixtures/jmespath/table.json: what Kyverno v1.19.1's own
// JMESPath (pkg/engine/jmespath over github.com/kyverno/go-jmespath, with Kyverno's functions
// registered) answers for each expression on each document below. It is the oracle that
// ivory-convert's JMESPath-to-CEL translation is tested against (the test
// `translations_agree_with_kyvernos_jmespath` in crates/ivory-convert/src/jmespath_cel.rs). Run from
// the repository root:
//
//	(cd scripts/jmespath-oracle && go run .) > fixtures/jmespath/table.json
//
// A row's document is the attestation's predicate, which Kyverno merges into its JSON context
// before it substitutes a condition's `{{ expression }}`; any error (a missing field at the
// top, a function given the wrong type) fails the substitution, so the table keeps only that
// an error happened, and its text.
package main

import (
	"encoding/json"
	"os"
	"runtime"
	"strings"

	"github.com/kyverno/kyverno/pkg/config"
	kjmespath "github.com/kyverno/kyverno/pkg/engine/jmespath"
)

type row struct {
	Expression string `json:"expression"`
	Document   any    `json:"document"`
	// Kyverno's result, when it had one (null is a result).
	Result any `json:"result"`
	// Kyverno's error, when the search failed.
	Error string `json:"error,omitempty"`
}

// group pairs every expression with every document.
type group struct {
	expressions []string
	documents   []string
}

var groups = []group{
	// other/verify-image-cve-2022-42889 and its parts: a filter projection with a default.
	{
		expressions: []string{
			"components[?name=='commons-text'].version || 'none'",
			"components[?name=='commons-text'].version",
			"components[?name=='commons-text']",
			"components[?name!='commons-text'].name",
		},
		documents: []string{
			`{"components": [{"name": "commons-text", "version": "1.9"}, {"name": "x", "version": "2"}]}`,
			`{"components": [{"name": "commons-text", "version": "1.10.0"}, {"name": "commons-text", "version": "1.5"}]}`,
			`{"components": [{"name": "x", "version": "2"}]}`,
			`{"components": []}`,
			`{}`,
			`{"components": null}`,
			`{"components": "commons-text"}`,
			`{"components": {"name": "commons-text", "version": "1.9"}}`,
			`{"components": [null, "commons-text", 3, [], {"name": "commons-text"}]}`,
			`{"components": [{"name": "commons-text", "version": null}, {"name": "commons-text", "version": 1.5}]}`,
			`{"components": [{"name": "commons-text", "version": ["1.9"]}, {"name": "commons-text", "version": {"v": 1}}]}`,
			`{"components": [{"name": "commons-text", "version": ""}, {"name": "commons-text", "version": false}]}`,
		},
	},
	// tekton/verify-tekton-taskrun-vuln-scan: nested flattens, a filter comparing a number with
	// a string, a pipe into length(@).
	{
		expressions: []string{
			"matches[].vulnerability[].cvss[?metrics.impactScore > '8.0'][] | length(@)",
			"matches[].vulnerability[].cvss[?metrics.impactScore > `8`][] | length(@)",
			"matches[].vulnerability[].cvss[?metrics.impactScore > `8.0`][]",
			"matches[].vulnerability[].cvss[]",
			"matches[].vulnerability",
			"matches[].vulnerability[]",
			"matches[].vulnerability[].cvss",
		},
		documents: []string{
			`{"matches": [{"vulnerability": {"cvss": [{"metrics": {"impactScore": 9.1}}, {"metrics": {"impactScore": 5}}]}}]}`,
			`{"matches": [{"vulnerability": [{"cvss": [{"metrics": {"impactScore": 8}}]}, {"cvss": [{"metrics": {"impactScore": 8.5}}]}]}]}`,
			`{"matches": [{"vulnerability": {"cvss": [{"metrics": {"impactScore": "9.1"}}, {"metrics": {}}, {}, null, 7]}}]}`,
			`{"matches": [{"vulnerability": {"cvss": {"metrics": {"impactScore": 9.1}}}}, {"vulnerability": null}, {}]}`,
			`{"matches": [[{"vulnerability": {"cvss": [{"metrics": {"impactScore": 9.5}}]}}], "x"]}`,
			`{"matches": []}`,
			`{"matches": {"vulnerability": {"cvss": []}}}`,
			`{"matches": "none"}`,
			`{}`,
		},
	},
	// `||`, `&&` and `!` with each falsy value, truthy look-alikes, and missing fields.
	{
		expressions: []string{"a || 'default'", "a && 'then'", "!a", "a || b || c", "a.x || a"},
		documents: []string{
			`{"a": null}`, `{"a": false}`, `{"a": ""}`, `{"a": []}`, `{"a": {}}`,
			`{"a": 0}`, `{"a": "0"}`, `{"a": [null]}`, `{"a": {"k": null}}`, `{"a": true}`, `{"a": "false"}`,
			`{}`, `{"b": [], "c": "c"}`, `{"a": {"x": ""}}`,
		},
	},
	// Comparisons: numbers with numbers, strings, nulls; equality of every kind.
	{
		expressions: []string{
			"a < b", "a <= b", "a > b", "a >= b", "a == b", "a != b",
			"a > '1'", "a == '1'", "a == `1`", "a > `1`",
		},
		documents: []string{
			`{"a": 1, "b": 2}`, `{"a": 2, "b": 2.0}`, `{"a": 2.5, "b": 2}`, `{"a": "1", "b": "2"}`,
			`{"a": 1, "b": "2"}`, `{"a": null, "b": 1}`, `{"a": [1, 2], "b": [1, 2.0]}`,
			`{"a": {"k": [1]}, "b": {"k": [1]}}`, `{"a": {"k": 1}, "b": {"k": 2}}`, `{"a": true, "b": true}`,
			`{"a": 1}`, `{"b": 1}`, `{}`, `{"a": "1"}`,
		},
	},
	// Filters with every comparison, on a list of mixed elements.
	{
		expressions: []string{
			"l[?v > `1`].v", "l[?v >= `1`].v", "l[?v < `2`]", "l[?v <= `2`].v", "l[?v == `1`].v",
			"l[?v != `1`].v", "l[?v]", "l[?!v]", "l[?v == 'x' || v == `2`].v", "l[?v && w].w",
			"l[?v > `1`] | length(@)", "l[?@ == `3`]", "l[?v == `1`].w.z",
		},
		documents: []string{
			`{"l": [{"v": 1}, {"v": 2, "w": "w"}, {"v": 2.5, "w": {"z": 1}}, {"v": "x"}, {"v": null}, {}, null, 3, {"v": 1, "w": {"z": 7}}]}`,
			`{"l": []}`, `{"l": {"v": 1}}`, `{}`, `{"l": "v"}`,
		},
	},
	// Projections, flattens and indexes, nested, over non-lists, nulls inside lists.
	{
		expressions: []string{
			"a[*].b", "a[*].b[*].c", "a[].b", "a[][]", "a[]", "a[*]", "a[*][*]", "a[*].b[0]",
			"a[0]", "a[-1]", "a[5]", "a[0].b", "a[0][1]", "a[*].b | [0]", "a | [0]", "a[].b[]",
			"a[*].\"b-c\"", "a[?b].b | length(@)",
		},
		documents: []string{
			`{"a": [{"b": [{"c": 1}, {"c": 2}, {"d": 3}], "b-c": "q"}, {"b": []}, {"b": null}, {}, null, "s", [1, [2]], {"b": [[{"c": 4}]]}]}`,
			`{"a": [[1, 2], 3, [[4]], null, []]}`,
			`{"a": []}`, `{"a": {"b": 1}}`, `{"a": "abc"}`, `{"a": null}`, `{}`,
		},
	},
	// Paths, pipes and length(@) at the top: a missing field is an error only where it is
	// not under a projection, a pipe, `||` or a function's argument.
	{
		expressions: []string{
			"a.b", "a.b.c", "a[0].b", "a | b", "a | length(@)", "length(a)", "length(@)",
			"a.b || 'x'", "(a || b).c", "@.a", "a | b | c",
		},
		documents: []string{
			`{"a": {"b": "héllo"}}`, `{"a": {"b": {"c": [1, 2]}}}`, `{"a": {"c": 1}}`, `{"a": [{"b": 1}]}`,
			`{"a": [{"c": 1}]}`, `{"a": []}`, `{"a": 7}`, `{"a": null}`, `{}`, `{"b": {"c": 5}}`,
		},
	},
	// Multi-select lists and literals.
	{
		expressions: []string{"[a, b]", "a[*].[b, c]", "`[1, \"x\", null]`", "`{\"k\": 1}`", "'it\\'s'", "a[?b == `null`]"},
		documents:   []string{`{"a": [{"b": 1}, {"c": 2}, null], "b": null}`, `{"a": "x"}`, `{}`},
	},
}

func main() {
	jp := kjmespath.New(config.NewDefaultConfiguration(false))
	var rows []row
	for _, g := range groups {
		for _, expression := range g.expressions {
			for _, document := range g.documents {
				var doc any
				if err := json.Unmarshal([]byte(document), &doc); err != nil {
					fail("document " + document + ": " + err.Error())
				}
				r := row{Expression: expression, Document: doc}
				result, err := jp.Search(expression, doc)
				if err != nil {
					r.Error = err.Error()
				} else {
					r.Result = result
				}
				rows = append(rows, r)
			}
		}
	}
	out := map[string]any{
		"provenance": "generated by scripts/jmespath-oracle with Kyverno v1.19.1's pkg/engine/jmespath " +
			"(github.com/kyverno/go-jmespath v0.4.1-0.20231124160150-95e59c162877) and " +
			runtime.Version() + "; do not edit by hand",
		"rows": rows,
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	if err := enc.Encode(out); err != nil {
		fail(err.Error())
	}
}

func fail(msg string) {
	os.Stderr.WriteString(strings.TrimSpace(msg) + "\n")
	os.Exit(1)
}
