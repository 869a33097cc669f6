// Command doccheck checks the repository's Markdown (README.md and
// docs/*.md, every tracked *.md): every relative link and #anchor leads
// somewhere (GitHub's heading anchors), no link leaves the repository,
// and every Go file path and every Test/Benchmark/Fuzz function a doc
// names in backticks exists. A doc that points at nothing misleads the
// reader who follows it; a renamed test or file silently orphans the
// sentence that cites it. `make lint` runs it (and so CI):
//
//	go run ./scripts/doccheck [repository root]
//
// It prints one line per problem (file:line: what) and exits 1 if any.
package main

import (
	"fmt"
	"os"
)

func main() {
	root := "."
	if len(os.Args) > 1 {
		root = os.Args[1]
	}
	problems, err := Check(root)
	if err != nil {
		fmt.Fprintln(os.Stderr, "doccheck:", err)
		os.Exit(2)
	}
	for _, p := range problems {
		fmt.Println(p)
	}
	if len(problems) > 0 {
		fmt.Fprintf(os.Stderr, "doccheck: %d problem(s) in the docs\n", len(problems))
		os.Exit(1)
	}
}
