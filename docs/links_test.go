// Package docs holds authlimit's documentation; its tests keep the
// relative links and anchors of every Markdown file in the repository
// resolving, as GitHub resolves them.
package docs

import (
	"bufio"
	"bytes"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"unicode"
)

// TestLinksResolve: every relative link in README.md, docs/ and the other
// Markdown files of the repository names a file or directory that exists
// in the repository, and every #anchor names a heading of its target as
// GitHub spells it (or a line, #L12, of a file that is not Markdown).
func TestLinksResolve(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	files := markdownFiles(t, root)
	for _, want := range []string{"README.md", "docs/configuration.md"} {
		if !contains(files, filepath.Join(root, want)) {
			t.Fatalf("found no %s under %s", want, root)
		}
	}
	problems, checked := checkLinks(root, files)
	if checked < 50 {
		t.Errorf("checked %d links; README and docs/ hold far more: is the link pattern broken?", checked)
	}
	for _, p := range problems {
		t.Error(p)
	}
}

// TestCheckLinksFindsBrokenOnes: the checker reports each kind of broken
// link it exists for, and passes the good ones beside them.
func TestCheckLinksFindsBrokenOnes(t *testing.T) {
	root := t.TempDir()
	write := func(rel, body string) {
		t.Helper()
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("README.md", strings.Join([]string{
		"# Top",
		"## Behind `nginx` (auth_request)",
		"## Twice", "## Twice",
		"[ok](docs/a.md#a-b) [ok](#behind-nginx-auth_request) [ok](#twice-1) [ok](docs/) [ok](x.conf#L3)",
		"[bad file](docs/missing.md) [bad anchor](docs/a.md#nope) [bad self](#twice-2)",
		"[bad dir](nowhere/) [bad line](x.conf#section) [outside](../up.md)",
		"[ok](https://example.com/x#y) `[not a link](nowhere.md)`",
		"",
		"    [code](nowhere.md)",
		"",
		"```",
		"[fenced](nowhere.md)",
		"```",
		"[ref]: docs/gone.md",
	}, "\n"))
	write("docs/a.md", "# A: b?\n[up](../README.md#top)\n")
	write("x.conf", "x\n")
	problems, checked := checkLinks(root, markdownFiles(t, root))
	got := strings.Join(problems, "\n")
	for _, want := range []string{
		"docs/missing.md", "docs/a.md#nope", "#twice-2", "nowhere/", "x.conf#section", "../up.md", "docs/gone.md",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the checker did not report %q; it reported:\n%s", want, got)
		}
	}
	if len(problems) != 7 {
		t.Errorf("%d problems, want 7:\n%s", len(problems), got)
	}
	if checked != 13 {
		t.Errorf("checked %d links, want 13", checked)
	}
}

func TestSlug(t *testing.T) {
	for _, tc := range []struct{ heading, want string }{
		{"Quick start", "quick-start"},
		{"nginx (auth_request)", "nginx-auth_request"},
		{"Migrating from envoyproxy/ratelimit", "migrating-from-envoyproxyratelimit"},
		{"`make bench`", "make-bench"},
		{"Rate limit service (the ratelimit filter)", "rate-limit-service-the-ratelimit-filter"},
		{"[Admin API](#x): quotas", "admin-api-quotas"},
		{"What *is* it?", "what-is-it"},
		{"Ünïcode 2.0 — now", "ünïcode-20--now"},
	} {
		if got := slug(tc.heading); got != tc.want {
			t.Errorf("slug(%q) = %q, want %q", tc.heading, got, tc.want)
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// markdownFiles lists the .md files under root, skipping hidden
// directories (.git) and testdata.
func markdownFiles(t *testing.T, root string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(d.Name(), ".md") {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(files)
	return files
}

var (
	inlineLink = regexp.MustCompile(`!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	refLink    = regexp.MustCompile(`^ {0,3}\[[^\]]+\]:\s*<?([^\s>]+)>?`)
	codeSpan   = regexp.MustCompile("(`+)[^`]*?(?:`+)")
	atxHeading = regexp.MustCompile(`^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$`)
	lineAnchor = regexp.MustCompile(`^L[0-9]+(-L[0-9]+)?$`)
	htmlAnchor = regexp.MustCompile(`<a\s+(?:name|id)="([^"]+)"`)
)

// checkLinks checks every relative link of files, which lie under root,
// and returns the broken ones and the number checked.
func checkLinks(root string, files []string) (problems []string, checked int) {
	anchors := map[string]map[string]bool{} // file → its anchors, read once
	anchorsOf := func(path string) (map[string]bool, error) {
		if a, ok := anchors[path]; ok {
			return a, nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		a := headingAnchors(b)
		anchors[path] = a
		return a, nil
	}
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		rel, _ := filepath.Rel(root, file)
		for _, l := range links(b) {
			target := l.target
			if u, err := url.Parse(target); err == nil && (u.Scheme != "" || strings.HasPrefix(target, "//")) {
				continue // not relative: mailto:, https:, …
			}
			checked++
			where := fmt.Sprintf("%s:%d: link %s", rel, l.line, target)
			pathPart, fragment, _ := strings.Cut(target, "#")
			if p, err := url.PathUnescape(pathPart); err == nil {
				pathPart = p
			}
			if f, err := url.PathUnescape(fragment); err == nil {
				fragment = f
			}
			dest := file
			if pathPart != "" {
				if strings.HasPrefix(pathPart, "/") {
					problems = append(problems, where+": absolute path; GitHub resolves it against its own site, not the repository")
					continue
				}
				dest = filepath.Join(filepath.Dir(file), filepath.FromSlash(pathPart))
				if r, err := filepath.Rel(root, dest); err != nil || r == ".." || strings.HasPrefix(r, ".."+string(filepath.Separator)) {
					problems = append(problems, where+": outside the repository")
					continue
				}
				fi, err := os.Stat(dest)
				if err != nil {
					problems = append(problems, where+": no such file or directory")
					continue
				}
				if strings.HasSuffix(pathPart, "/") && !fi.IsDir() {
					problems = append(problems, where+": not a directory")
					continue
				}
				if fi.IsDir() {
					if fragment != "" {
						problems = append(problems, where+": an anchor into a directory")
					}
					continue
				}
			}
			if fragment == "" {
				continue
			}
			if !strings.HasSuffix(dest, ".md") {
				if !lineAnchor.MatchString(fragment) {
					problems = append(problems, where+": a file that is not Markdown has line anchors (#L12) only")
				}
				continue
			}
			a, err := anchorsOf(dest)
			if err != nil {
				problems = append(problems, where+": "+err.Error())
				continue
			}
			if !a[fragment] {
				problems = append(problems, where+": no heading has the anchor #"+fragment+suggest(a, fragment))
			}
		}
	}
	return problems, checked
}

// suggest names the anchor closest to want, if one shares its first word.
func suggest(anchors map[string]bool, want string) string {
	first, _, _ := strings.Cut(want, "-")
	var near []string
	for a := range anchors {
		if strings.HasPrefix(a, first) {
			near = append(near, "#"+a)
		}
	}
	if len(near) == 0 {
		return ""
	}
	sort.Strings(near)
	return " (have " + strings.Join(near, ", ") + ")"
}

type link struct {
	line   int
	target string
}

// markdownLines calls fn with each line of b that is not code (fenced or
// indented) and its number.
func markdownLines(b []byte, fn func(n int, line string)) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var fence string
	prevBlank, prevCode := true, false
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimLeft(line, " ")
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			continue
		}
		if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
			fence = trimmed[:3]
			continue
		}
		blank := strings.TrimSpace(line) == ""
		indented := strings.HasPrefix(line, "    ") || strings.HasPrefix(line, "\t")
		if indented && !blank && (prevBlank || prevCode) {
			prevCode, prevBlank = true, false
			continue
		}
		prevCode = prevCode && blank
		prevBlank = blank
		fn(n, line)
	}
}

// links returns the link targets of a Markdown document, inline and
// reference definitions, outside code.
func links(b []byte) []link {
	var out []link
	markdownLines(b, func(n int, line string) {
		line = codeSpan.ReplaceAllString(line, "")
		for _, m := range inlineLink.FindAllStringSubmatch(line, -1) {
			out = append(out, link{n, m[1]})
		}
		if m := refLink.FindStringSubmatch(line); m != nil {
			out = append(out, link{n, m[1]})
		}
	})
	return out
}

// headingAnchors returns the anchors GitHub gives a document's headings
// (a repeated one gets -1, -2, …) and its explicit <a name|id> anchors.
func headingAnchors(b []byte) map[string]bool {
	anchors := map[string]bool{}
	seen := map[string]int{}
	add := func(text string) {
		s := slug(text)
		if k := seen[s]; k > 0 {
			anchors[fmt.Sprintf("%s-%d", s, k)] = true
		} else {
			anchors[s] = true
		}
		seen[s]++
	}
	var prev string
	markdownLines(b, func(_ int, line string) {
		for _, m := range htmlAnchor.FindAllStringSubmatch(line, -1) {
			anchors[m[1]] = true
		}
		if m := atxHeading.FindStringSubmatch(line); m != nil {
			add(m[2])
			prev = ""
			return
		}
		t := strings.TrimSpace(line)
		if prev != "" && t != "" && (strings.Trim(t, "=") == "" || strings.Trim(t, "-") == "") {
			add(prev) // a setext heading: its text, underlined
			prev = ""
			return
		}
		if t == "" || strings.HasPrefix(t, "|") || strings.HasPrefix(t, "- ") || strings.HasPrefix(t, "* ") {
			prev = ""
			return
		}
		prev = t
	})
	return anchors
}

var mdLink = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)

// slug is GitHub's anchor for a heading: its text as rendered (links'
// text kept, code and emphasis marks dropped), in lower case, with
// every character that is not a letter, a mark, a digit, '_', '-' or a
// space removed and every space made a '-'.
func slug(heading string) string {
	text := mdLink.ReplaceAllString(heading, "$1")
	text = strings.NewReplacer("`", "", "*", "").Replace(text)
	var sb strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case r == ' ':
			sb.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsMark(r) || unicode.IsDigit(r):
			sb.WriteRune(r)
		}
	}
	return sb.String()
}
