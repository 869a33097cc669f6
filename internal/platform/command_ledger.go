package platform

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"

	"github.com/platformgw/gateway/internal/store"
)

// usagePruneCommand is `caddy platform usage prune --before <time>`.
func usagePruneCommand() *cobra.Command {
	prune := &cobra.Command{
		Use:   "prune --before <time>",
		Short: "Removes raw ledger rows older than a time (hourly rollups stay)",
		Long: `
Removes the raw usage ledger rows recorded before --before (an RFC 3339 time
or a date), in whole segments: a segment goes when its newest row is older,
so a few older rows may stay until their segment's turn. The disk is freed
at once. Hourly rollups (caddy platform usage --rollup hour) are kept. The
ledger_retention option does the same every hour (docs/operations.md).

	caddy platform usage prune --before 2026-01-01`,
		Args: cobra.NoArgs,
		RunE: runCommand(cmdUsagePrune),
	}
	prune.Flags().String("before", "", "Remove rows recorded before this time (RFC 3339 or YYYY-MM-DD) (required)")
	return prune
}

func cmdUsagePrune(c cli, _ []string) error {
	before, err := c.required("before")
	if err != nil {
		return err
	}
	var res store.PruneResult
	if printed, err := c.call(http.MethodPost, "/platform/usage/prune?"+url.Values{"before": {before}}.Encode(), nil, &res); printed || err != nil {
		return err
	}
	_, err = fmt.Fprintf(c.out, "Removed %d segment(s): %d rows, %s, recorded before %s. Hourly rollups are kept.\n",
		res.Segments, res.Rows, humanize.IBytes(uint64(res.Bytes)), res.Before.UTC().Format(time.RFC3339))
	return err
}

// usageProgress is where a long export reports its progress.
var usageProgress io.Writer = os.Stderr

// progressEvery is how often a long export reports; a short one is quiet.
const progressEvery = 2 * time.Second

// progressWriter counts what an export wrote and says so on usageProgress
// every progressEvery, so that an operator waiting on a year's export
// sees it move (the rows go to standard output, the progress to standard
// error, so a redirect to a file still gets only the rows).
type progressWriter struct {
	w     io.Writer
	start time.Time
	last  time.Time
	bytes int64
	lines int64
}

func newProgressWriter(w io.Writer) *progressWriter {
	t := time.Now()
	return &progressWriter{w: w, start: t, last: t}
}

func (p *progressWriter) Write(b []byte) (int, error) {
	n, err := p.w.Write(b)
	p.bytes += int64(n)
	for _, c := range b[:n] {
		if c == '\n' {
			p.lines++
		}
	}
	if t := time.Now(); t.Sub(p.last) >= progressEvery {
		p.last = t
		p.report(false)
	}
	return n, err
}

// report prints the counts; done is the last line of a long export.
func (p *progressWriter) report(done bool) {
	if p.last.Equal(p.start) {
		return // never reported: a short export stays quiet
	}
	el := time.Since(p.start)
	what := "exporting"
	if done {
		what = "exported"
	}
	fmt.Fprintf(usageProgress, "%s: %s lines, %s in %s (%s/s)\n", what, humanize.Comma(p.lines),
		humanize.IBytes(uint64(p.bytes)), el.Round(time.Second), humanize.IBytes(uint64(float64(p.bytes)/max(el.Seconds(), 0.001))))
}
