package e2e

import "strings"

// Table is a Markdown table, as the benchmark's page and the conformance
// report write them.
type Table struct {
	Head []string
	Rows [][]string
}

// Write writes the table to b, then a blank line.
func (t *Table) Write(b *strings.Builder) {
	b.WriteString("| " + strings.Join(t.Head, " | ") + " |\n|")
	for range t.Head {
		b.WriteString("---|")
	}
	b.WriteString("\n")
	for _, row := range t.Rows {
		b.WriteString("| " + strings.Join(row, " | ") + " |\n")
	}
	b.WriteString("\n")
}
