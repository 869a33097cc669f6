package main

import (
	"strings"
	"testing"
)

const table = `
| scenario                           |    req/s |   p50 ms |   p99 ms | vs. plain reverse_proxy          |  CPU us | - plain | / plain |
|------------------------------------|----------|----------|----------|----------------------------------|---------|---------|---------|
| plain reverse_proxy                |     5744 |    9.890 |   33.220 | 1.00x (baseline)                 |   168.0 |       - |       - |
| sync invoke                        |     3369 |   17.200 |   45.280 | 0.587x throughput                |   276.8 |    +109 |   1.65x |
| job status poll                    |    20289 |    3.250 |   31.420 | 3.311x throughput                |    69.7 |    −136 |   0.34x |
| sync invoke, 5 ms backend          |     2000 |    7.000 |   12.000 | +1.0 ms p50, +3 ms p99           |   300.0 |    +100 |   1.40x |
`

func TestParseAndDraw(t *testing.T) {
	rows, err := parse(strings.NewReader(table))
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 3 {
		t.Fatalf("rows = %+v, want plain, sync and status (the 5 ms row left out)", rows)
	}
	if rows[1].cpu != 276.8 || rows[1].diff != 109 || rows[2].diff != -136 {
		t.Fatalf("rows = %+v", rows)
	}
	svg := draw(rows, "a <title> & more", 60)
	for _, want := range []string{"<svg ", "a &lt;title&gt; &amp; more", "277 (+109)", "70 (-136)", "plain + 60 µs", "</svg>"} {
		if !strings.Contains(svg, want) {
			t.Errorf("the chart lacks %q", want)
		}
	}
	// One orange bar: only the sync row costs more than plain.
	if n := strings.Count(svg, `fill="#f28e2b"`); n != 1 {
		t.Errorf("%d added-cost bars, want 1", n)
	}
}

func TestParseRefusesOtherInput(t *testing.T) {
	for _, in := range []string{"", "no table here\n", "| sync invoke | 1 | 2 | 3 | x | 200 | +1 | 1x |\n"} {
		if _, err := parse(strings.NewReader(in)); err == nil {
			t.Errorf("parse(%q) accepted a table without a plain row", in)
		}
	}
}
