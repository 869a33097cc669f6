// Command chart draws the CPU time per request of a make bench table as an
// SVG bar chart (docs/performance.md shows the latest one).
//
//	bin/bench/chart -title "make bench at 1a2b3c4" < table.md > bench-cpu.svg
//
// It reads the Markdown table scripts/bench.sh prints (a row per scenario:
// scenario | req/s | p50 | p99 | vs. plain | CPU µs/req | − plain | / plain)
// and draws, per peak scenario, the Caddy process's CPU microseconds per
// request served: plain reverse_proxy's as the first bar, the gateway's
// rows split into the part plain costs too and the part the gateway adds.
// A dashed line marks plain + the budget (-budget, 60 µs) so the reader
// sees at a glance which rows are within the gateway's budget. Rows without
// a CPU figure (and the 5 ms rows, whose CPU depends on their rate) are
// left out.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"html"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
)

// row is one scenario of the table.
type row struct {
	name string
	cpu  float64 // CPU µs per request
	rps  float64
	// diff is the table's "− plain" figure (the median of each round's
	// difference, which is not the difference of the medians); NaN when
	// the row has none.
	diff float64
}

func main() {
	title := flag.String("title", "CPU per request of the Caddy process (µs), median of the rounds", "chart title")
	budget := flag.Float64("budget", 60, "the gateway's budget over plain reverse_proxy per sync call, µs (0: no line)")
	flag.Parse()
	rows, err := parse(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "chart:", err)
		os.Exit(1)
	}
	if _, err := io.WriteString(os.Stdout, draw(rows, *title, *budget)); err != nil {
		fmt.Fprintln(os.Stderr, "chart:", err)
		os.Exit(1)
	}
}

// parse reads the table's rows; the first row with a CPU figure whose
// name starts with "plain" is the baseline and comes first.
func parse(r io.Reader) ([]row, error) {
	var rows []row
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if !strings.HasPrefix(line, "|") || strings.HasPrefix(line, "|-") || strings.HasPrefix(line, "|--") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) < 6 {
			continue
		}
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		name := cells[0]
		if name == "scenario" || strings.Contains(name, "5 ms") {
			continue
		}
		cpu, err := strconv.ParseFloat(strings.ReplaceAll(cells[5], ",", ""), 64)
		if err != nil || cpu <= 0 {
			continue
		}
		rps, _ := strconv.ParseFloat(strings.ReplaceAll(cells[1], ",", ""), 64)
		diff := math.NaN()
		if len(cells) > 6 {
			d := strings.NewReplacer("−", "-", "+", "", ",", "").Replace(cells[6])
			if v, err := strconv.ParseFloat(d, 64); err == nil {
				diff = v
			}
		}
		rows = append(rows, row{name: name, cpu: cpu, rps: rps, diff: diff})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(rows) == 0 || !strings.HasPrefix(rows[0].name, "plain") {
		return nil, fmt.Errorf("no table with a plain reverse_proxy row and CPU figures on standard input")
	}
	return rows, nil
}

// Layout, in SVG user units.
const (
	width     = 860
	labelW    = 250 // the scenario names
	valueW    = 90  // the figures right of the bars
	barH      = 22
	rowGap    = 12
	top       = 84
	bottomPad = 56
)

// draw renders the chart.
func draw(rows []row, title string, budget float64) string {
	plain := rows[0].cpu
	maxV := plain + budget
	for _, r := range rows {
		maxV = math.Max(maxV, r.cpu)
	}
	maxV = niceCeil(maxV)
	plotW := float64(width - labelW - valueW - 20)
	x := func(v float64) float64 { return float64(labelW) + v/maxV*plotW }
	height := top + len(rows)*(barH+rowGap) + bottomPad

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Helvetica, Arial, sans-serif" font-size="13">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="#ffffff"/>`+"\n", width, height)
	fmt.Fprintf(&b, `<text x="16" y="26" font-size="15" font-weight="bold" fill="#222">%s</text>`+"\n", html.EscapeString(title))
	fmt.Fprintf(&b, `<text x="16" y="46" fill="#555">grey: what plain reverse_proxy costs per request; orange: what the gateway adds (lower is better)</text>`+"\n")

	// Grid lines and their labels.
	step := niceStep(maxV)
	plotBottom := top + len(rows)*(barH+rowGap)
	for v := 0.0; v <= maxV+1e-9; v += step {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#e4e4e4"/>`+"\n", x(v), top-6, x(v), plotBottom)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle" fill="#666">%g</text>`+"\n", x(v), plotBottom+18, v)
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle" fill="#444">CPU µs per request</text>`+"\n", x(maxV/2), plotBottom+38)

	for i, r := range rows {
		y := top + i*(barH+rowGap)
		fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end" fill="#222">%s</text>`+"\n", labelW-10, y+barH/2+5, html.EscapeString(r.name))
		base := math.Min(r.cpu, plain)
		fmt.Fprintf(&b, `<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="#9aa5b1"/>`+"\n", x(0), y, x(base)-x(0), barH)
		if i > 0 && r.cpu > plain {
			fmt.Fprintf(&b, `<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="#f28e2b"/>`+"\n", x(plain), y, x(r.cpu)-x(plain), barH)
		}
		label := fmt.Sprintf("%.0f", r.cpu)
		if i > 0 {
			d := r.diff
			if math.IsNaN(d) {
				d = r.cpu - plain
			}
			label += fmt.Sprintf(" (%+.0f)", d)
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" fill="#222">%s</text>`+"\n", x(r.cpu)+6, y+barH/2+5, label)
	}
	if budget > 0 {
		bx := x(plain + budget)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#c0392b" stroke-width="1.5" stroke-dasharray="5,4"/>`+"\n", bx, top-10, bx, plotBottom)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle" fill="#c0392b">plain + %g µs</text>`+"\n", bx, top-14, budget)
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// niceCeil rounds v up to a multiple of a round step.
func niceCeil(v float64) float64 {
	s := niceStep(v)
	return math.Ceil(v/s) * s
}

// niceStep is a grid step of 1, 2 or 5 times a power of ten giving about
// five to ten lines up to v.
func niceStep(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{0.1, 0.2, 0.5, 1, 2, 5} {
		if v/(m*p) <= 10 {
			return m * p
		}
	}
	return 10 * p
}
