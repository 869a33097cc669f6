package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The repository's own docs: every link, anchor, Go file and test they
// cite exists. (It failed on docs/configuration.md's link to
// fleet.md#failure-modes, a heading fleet.md never had.)
func TestRepositoryDocs(t *testing.T) {
	problems, err := Check("../..")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Error(p)
	}
}

// GitHub's heading ids, as the docs' anchors use them.
func TestAnchor(t *testing.T) {
	for heading, want := range map[string]string{
		"Running it":                             "running-it",
		"`POST /platform/keys` — create a key":   "post-platformkeys--create-a-key",
		"`service <id>`":                         "service-id",
		"1. Crash: nothing acknowledged is lost": "1-crash-nothing-acknowledged-is-lost",
		"Nothing acknowledged lost, nothing counted twice: two ways": "nothing-acknowledged-lost-nothing-counted-twice-two-ways",
		"The [fleet](fleet.md) and `store_postgres`":                 "the-fleet-and-store_postgres",
		"Größe <b>bold</b>":                                          "größe-bold",
	} {
		if got := Anchor(heading); got != want {
			t.Errorf("Anchor(%q) = %q, want %q", heading, got, want)
		}
	}
}

// Each kind of problem is found, with its file and line, and what is
// right passes: a fixture repository with one of each.
func TestCheckFindsEachProblem(t *testing.T) {
	root := t.TempDir()
	files := map[string]string{
		"README.md": "# Top\n\nSee [docs](docs/a.md), [b](docs/a.md#second-part) and [gone](docs/gone.md).\n",
		"docs/a.md": "# A\n\n## Second part\n\n## Second part\n\n" +
			"[up](../README.md#top) [dup](#second-part-1) [bad anchor](#third) [web](https://example.com/x#y)\n" +
			"[outside](../../outside/notes.md)\n" +
			"`pkg/real.go`, `pkg/*_test.go`, `pkg/missing.go`, `../outside/x` and `TestReal`, `TestRe*`, `TestGone`, `TestXxxReal`, `FuzzX`.\n" +
			"```\n[not a link](nowhere.md) `pkg/in_a_fence.go`\n```\n",
		"pkg/real.go":      "package pkg\n",
		"pkg/real_test.go": "package pkg\n\nimport \"testing\"\n\nfunc TestReal(t *testing.T) {}\n",
	}
	for name, body := range files {
		p := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	problems, err := Check(root)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"README.md:3: link docs/gone.md: no file docs/gone.md in the repository",
		"docs/a.md:7: link #third: no heading with anchor #third in docs/a.md",
		"docs/a.md:8: link ../../outside/notes.md leaves the repository",
		"docs/a.md:9: `pkg/missing.go`: no such Go file in the repository",
		"docs/a.md:9: `../outside/x` is outside the repository",
		"docs/a.md:9: `TestGone`: no test function TestGone in any _test.go file",
	}
	got := strings.Join(problems, "\n")
	for _, w := range want {
		if !strings.Contains(got, w) {
			t.Errorf("no problem %q; got:\n%s", w, got)
		}
	}
	if len(problems) != len(want) {
		t.Errorf("got %d problems, want %d:\n%s", len(problems), len(want), got)
	}
}
