// Package chartdoc writes a Helm chart's values table from the comments of
// its values.yaml, in the style of helm-docs: a comment block starting
// with "# --" right above a key describes it. A described key is one row,
// whatever its value; an undescribed map is walked into; anything else
// undescribed is an error, so that no value a user can set goes without a
// sentence. The table replaces what lies between the markers Begin and End
// of the chart's README.md.
//
//	go generate ./internal/chartdoc    # or: make chart-docs
package chartdoc

//go:generate go run ./cmd/chartdoc ../../deploy/helm/authlimit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"gopkg.in/yaml.v3"
)

// The markers around the generated table in README.md.
const (
	Begin = "<!-- values table: generated from values.yaml by `make chart-docs` -->"
	End   = "<!-- end of values table -->"
)

// Value is one row of the table.
type Value struct {
	Key         string // dotted path: image.repository
	Type        string // string, int, float, bool, object, list, null
	Default     string // the value as JSON
	Description string // the "# --" comment, one line
	Line        int    // the key's line in values.yaml
}

// Values reads values.yaml and returns its rows in the file's order. An
// undescribed value that is not a map to walk into is an error naming its
// key and line; every such value is reported at once.
func Values(src []byte) ([]Value, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(src, &doc); err != nil {
		return nil, fmt.Errorf("values.yaml: %w", err)
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, errors.New("values.yaml: not a map of values")
	}
	var rows []Value
	var problems []error
	walk(doc.Content[0], "", &rows, &problems)
	return rows, errors.Join(problems...)
}

func walk(m *yaml.Node, prefix string, rows *[]Value, problems *[]error) {
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1]
		key := prefix + k.Value
		desc := description(k.HeadComment)
		if desc == "" && v.Kind == yaml.MappingNode && len(v.Content) > 0 {
			walk(v, key+".", rows, problems)
			continue
		}
		if desc == "" {
			*problems = append(*problems, fmt.Errorf("values.yaml:%d: %s has no \"# --\" comment describing it", k.Line, key))
			continue
		}
		def, err := defaultOf(v)
		if err != nil {
			*problems = append(*problems, fmt.Errorf("values.yaml:%d: %s: %w", k.Line, key, err))
			continue
		}
		*rows = append(*rows, Value{Key: key, Type: typeOf(v), Default: def, Description: desc, Line: k.Line})
	}
}

// description is the comment block from its last line starting with
// "# --" on, joined into one line; "" without one.
func description(comment string) string {
	lines := strings.Split(comment, "\n")
	start := -1
	for i, l := range lines {
		if strings.HasPrefix(strings.TrimSpace(l), "# --") {
			start = i
		}
	}
	if start < 0 {
		return ""
	}
	var words []string
	for i, l := range lines[start:] {
		l = strings.TrimSpace(l)
		if i == 0 {
			l = strings.TrimPrefix(l, "# --")
		} else {
			l = strings.TrimPrefix(l, "#")
		}
		words = append(words, strings.Fields(l)...)
	}
	return strings.Join(words, " ")
}

func typeOf(v *yaml.Node) string {
	switch v.Kind {
	case yaml.MappingNode:
		return "object"
	case yaml.SequenceNode:
		return "list"
	}
	switch v.ShortTag() {
	case "!!int":
		return "int"
	case "!!float":
		return "float"
	case "!!bool":
		return "bool"
	case "!!null":
		return "null"
	}
	return "string"
}

// defaultOf renders a value as compact JSON.
func defaultOf(v *yaml.Node) (string, error) {
	var x any
	if err := v.Decode(&x); err != nil {
		return "", err
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(x); err != nil {
		return "", err
	}
	return strings.TrimSpace(b.String()), nil
}

// Table is the Markdown table of rows.
func Table(rows []Value) string {
	var b strings.Builder
	b.WriteString("| Key | Type | Default | Description |\n|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", r.Key, r.Type, code(r.Default), cell(r.Description))
	}
	return b.String()
}

// code puts s in a code span, with a fence longer than any run of
// backticks in it, and escapes the table's pipes.
func code(s string) string {
	fence := "`"
	for strings.Contains(s, fence) {
		fence += "`"
	}
	pad := ""
	if strings.HasPrefix(s, "`") || strings.HasSuffix(s, "`") {
		pad = " "
	}
	return cell(fence + pad + s + pad + fence)
}

func cell(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

// Splice returns readme with the text between Begin and End replaced by
// table.
func Splice(readme []byte, table string) ([]byte, error) {
	s := string(readme)
	i := strings.Index(s, Begin)
	j := strings.Index(s, End)
	if i < 0 || j < i || strings.Count(s, Begin) != 1 || strings.Count(s, End) != 1 {
		return nil, fmt.Errorf("README.md: want the markers %q and %q once each, in that order", Begin, End)
	}
	return []byte(s[:i+len(Begin)] + "\n" + table + s[j:]), nil
}

// Generate returns the chart's README.md with its values table made from
// values.
func Generate(readme, values []byte) ([]byte, error) {
	rows, err := Values(values)
	if err != nil {
		return nil, err
	}
	return Splice(readme, Table(rows))
}
