package chartdoc

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestValues(t *testing.T) {
	tests := []struct {
		name    string
		yaml    string
		want    []Value
		wantErr []string // each must be in the error
	}{
		{
			name: "described scalars of each type",
			yaml: "# -- A count.\nn: 2\n# -- A ratio.\nf: 0.5\n# -- A switch.\nb: true\n# -- Unset.\nz: null\n# -- A name.\ns: x\n",
			want: []Value{
				{Key: "n", Type: "int", Default: "2", Description: "A count.", Line: 2},
				{Key: "f", Type: "float", Default: "0.5", Description: "A ratio.", Line: 4},
				{Key: "b", Type: "bool", Default: "true", Description: "A switch.", Line: 6},
				{Key: "z", Type: "null", Default: "null", Description: "Unset.", Line: 8},
				{Key: "s", Type: "string", Default: `"x"`, Description: "A name.", Line: 10},
			},
		},
		{
			name: "an undescribed map is walked into",
			yaml: "image:\n  # -- Where from.\n  repository: r\n  # -- Which.\n  tag: \"\"\n",
			want: []Value{
				{Key: "image.repository", Type: "string", Default: `"r"`, Description: "Where from.", Line: 3},
				{Key: "image.tag", Type: "string", Default: `""`, Description: "Which.", Line: 5},
			},
		},
		{
			name: "a described map or list is one row",
			yaml: "# -- Limits.\nresources:\n  cpu: 1\n  mem: 2Mi\n# -- Peers.\nfrom:\n  - a\n# -- None yet.\nextra: {}\n",
			want: []Value{
				{Key: "resources", Type: "object", Default: `{"cpu":1,"mem":"2Mi"}`, Description: "Limits.", Line: 2},
				{Key: "from", Type: "list", Default: `["a"]`, Description: "Peers.", Line: 6},
				{Key: "extra", Type: "object", Default: `{}`, Description: "None yet.", Line: 9},
			},
		},
		{
			name: "the description is the last # -- block, its lines joined",
			yaml: "# The file's own comment.\n# -- First line,\n#   and the second\n# with a `code` span.\nk: |\n  a\n  b\n",
			want: []Value{
				{Key: "k", Type: "string", Default: `"a\nb\n"`, Description: "First line, and the second with a `code` span.", Line: 5},
			},
		},
		{
			name: "characters JSON would escape for HTML stay",
			yaml: "# -- A rule.\nr: \"a<b & c>d\"\n",
			want: []Value{{Key: "r", Type: "string", Default: `"a<b & c>d"`, Description: "A rule.", Line: 2}},
		},
		{
			name:    "every undescribed value is reported, with its line",
			yaml:    "# -- Fine.\na: 1\nb: 2\nm:\n  c: []\n  # plain comment\n  d: x\n",
			wantErr: []string{"values.yaml:3: b has no", "values.yaml:5: m.c has no", "values.yaml:7: m.d has no"},
		},
		{
			name:    "not a map",
			yaml:    "- a\n",
			wantErr: []string{"not a map of values"},
		},
		{
			name:    "not YAML",
			yaml:    "a: [\n",
			wantErr: []string{"values.yaml:"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Values([]byte(tt.yaml))
			if len(tt.wantErr) > 0 {
				if err == nil {
					t.Fatalf("Values(%q) = %+v, want an error", tt.yaml, got)
				}
				for _, w := range tt.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("Values(%q) error %q does not say %q", tt.yaml, err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("Values(%q): %v", tt.yaml, err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Values(%q)\n got %+v\nwant %+v", tt.yaml, got, tt.want)
			}
		})
	}
}

func TestTable(t *testing.T) {
	got := Table([]Value{
		{Key: "a", Type: "string", Default: `"x|y"`, Description: "Pipes | escaped."},
		{Key: "b", Type: "string", Default: "\"`q`\"", Description: "Backticks."},
		{Key: "c", Type: "string", Default: "`", Description: "Edge."},
	})
	want := "| Key | Type | Default | Description |\n|---|---|---|---|\n" +
		"| `a` | string | `\"x\\|y\"` | Pipes \\| escaped. |\n" +
		"| `b` | string | ``\"`q`\"`` | Backticks. |\n" +
		"| `c` | string | `` ` `` | Edge. |\n"
	if got != want {
		t.Errorf("Table:\n got %q\nwant %q", got, want)
	}
}

func TestSplice(t *testing.T) {
	good := "# Chart\n\n" + Begin + "\nold table\n" + End + "\n\nAfter.\n"
	got, err := Splice([]byte(good), "new table\n")
	if err != nil {
		t.Fatal(err)
	}
	if want := "# Chart\n\n" + Begin + "\nnew table\n" + End + "\n\nAfter.\n"; string(got) != want {
		t.Errorf("Splice:\n got %q\nwant %q", got, want)
	}
	for _, bad := range []string{
		"no markers\n",
		Begin + "\n",
		End + "\n" + Begin + "\n",
		Begin + "\n" + End + "\n" + Begin + "\n" + End + "\n",
	} {
		if _, err := Splice([]byte(bad), "t\n"); err == nil {
			t.Errorf("Splice(%q) accepts it", bad)
		}
	}
}

// chartDir is the repository's chart, from this package.
const chartDir = "../../deploy/helm/authlimit"

// TestChartREADMEIsGenerated: the chart's README.md holds the table its
// values.yaml gives; every value of values.yaml is described.
func TestChartREADMEIsGenerated(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join(chartDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	values, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := Generate(readme, values)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(readme) {
		t.Errorf("%s/README.md's values table is not what values.yaml gives: run make chart-docs", chartDir)
	}
}

// TestChartValuesCoverTheSchema: every value values.schema.json accepts
// (but global, Helm's own) is in values.yaml, hence in the table.
func TestChartValuesCoverTheSchema(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Properties map[string]json.RawMessage `json:"properties"`
	}
	if err := json.Unmarshal(b, &schema); err != nil {
		t.Fatal(err)
	}
	values, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	rows, err := Values(values)
	if err != nil {
		t.Fatal(err)
	}
	top := map[string]bool{}
	for _, r := range rows {
		top[strings.SplitN(r.Key, ".", 2)[0]] = true
	}
	for name := range schema.Properties {
		if name != "global" && !top[name] {
			t.Errorf("values.schema.json accepts %s, which values.yaml neither sets nor describes", name)
		}
	}
	if len(top) < 20 {
		t.Errorf("only %d top-level values in the table", len(top))
	}
}
