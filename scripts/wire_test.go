package scripts

import (
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// goWireNames returns layout.go's constants by the names the scripts give
// them (FlatRuleValues is FLAT_RULE_VALUES), with their values, read from
// the source so that a constant added there is held to the scripts too.
func goWireNames(t *testing.T) map[string]string {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "layout.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	pkg, err := (&types.Config{Importer: importer.Default()}).Check("scripts", fset, []*ast.File{f}, nil)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, name := range pkg.Scope().Names() {
		c, ok := pkg.Scope().Lookup(name).(*types.Const)
		if !ok {
			continue
		}
		out[luaName(name)] = c.Val().ExactString()
	}
	return out
}

// luaName is a Go constant's name in the scripts: its words in capitals,
// joined by underscores.
func luaName(goName string) string {
	var b strings.Builder
	rs := []rune(goName)
	for i, r := range rs {
		if i > 0 && unicode.IsUpper(r) && (unicode.IsLower(rs[i-1]) || i+1 < len(rs) && unicode.IsLower(rs[i+1])) {
			b.WriteByte('_')
		}
		b.WriteRune(unicode.ToUpper(r))
	}
	return b.String()
}

// TestWireNamesAgree parses each script's block of wire names and holds
// every name to layout.go's value of it: a name the script declares that
// Go does not, or with another value, fails. decide.lua declares every
// one of layout.go's numbers.
func TestWireNamesAgree(t *testing.T) {
	want := goWireNames(t)
	if len(want) < 10 {
		t.Fatalf("layout.go declares %d constants: %v", len(want), want)
	}
	for _, sc := range []struct {
		name, src string
		all       bool
	}{{"decide.lua", decideSource, true}, {"refund.lua", refundSource, false}} {
		names, _, _ := wireNames(sc.src)
		if len(names) == 0 {
			t.Errorf("%s: no block of wire names", sc.name)
		}
		for n, v := range names {
			switch w, ok := want[n]; {
			case !ok:
				t.Errorf("%s: %s = %s, which layout.go does not declare", sc.name, n, v)
			case w != v:
				t.Errorf("%s: %s = %s, layout.go says %s", sc.name, n, v, w)
			}
		}
		if sc.all {
			for n, v := range want {
				if _, ok := names[n]; !ok {
					t.Errorf("%s does not name %s (%s)", sc.name, n, v)
				}
			}
		}
	}
}

// TestInlinedScriptsNameNothing: Redis runs the scripts with every wire
// name replaced by its value and the block gone, and the scripts declare
// no other name in capitals that could be mistaken for one.
func TestInlinedScriptsNameNothing(t *testing.T) {
	for name, src := range map[string]string{"decide.lua": Decide, "refund.lua": Refund} {
		if strings.Contains(src, wireNamesHead) {
			t.Errorf("%s as Redis runs it keeps its block of wire names", name)
		}
		for n := range goWireNames(t) {
			if regexp.MustCompile(`\b` + n + `\b`).MatchString(src) {
				t.Errorf("%s as Redis runs it still reads %s", name, n)
			}
		}
	}
	// The block ends at its first line that is not a name: a name
	// declared after it would not be inlined.
	for name, src := range map[string]string{"decide.lua": decideSource, "refund.lua": refundSource} {
		_, _, to := wireNames(src)
		if m := regexp.MustCompile(`(?m)^local [A-Z][A-Z0-9_]* = -?[0-9]+`).FindStringIndex(src[to:]); m != nil {
			t.Errorf("%s declares %q after its block of wire names", name, src[to+m[0]:to+m[1]])
		}
	}
}

func TestLuaName(t *testing.T) {
	for goName, want := range map[string]string{"FixedWindow": "FIXED_WINDOW", "GCRA": "GCRA", "FlagRefundTokens": "FLAG_REFUND_TOKENS", "EpochMicros": "EPOCH_MICROS", "ReasonCostTooHigh": "REASON_COST_TOO_HIGH"} {
		if got := luaName(goName); got != want {
			t.Errorf("luaName(%s) = %s, want %s", goName, got, want)
		}
	}
}
