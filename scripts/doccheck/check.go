package main

import (
	"bufio"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"unicode"
)

// skipDirs are never searched for docs, Go files or tests: build output,
// what `make run` leaves, test inputs and dependencies.
var skipDirs = map[string]bool{".git": true, "bin": true, "tmp": true, "node_modules": true, "testdata": true, "vendor": true}

var (
	fence       = regexp.MustCompile("^\\s*(```|~~~)")
	heading     = regexp.MustCompile(`^(#{1,6})\s+(.*?)\s*#*\s*$`)
	codeSpan    = regexp.MustCompile("(`+)(.+?)(`+)")
	link        = regexp.MustCompile(`!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	refDef      = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s+<?(\S+?)>?(\s|$)`)
	htmlID      = regexp.MustCompile(`<a\s+(?:name|id)="([^"]+)"`)
	testName    = regexp.MustCompile(`^(Test|Benchmark|Fuzz)[A-Z0-9_]\w*$`)
	testWord    = regexp.MustCompile(`(\w+)(\*?)`)
	testFunc    = regexp.MustCompile(`(?m)^func ((?:Test|Benchmark|Fuzz)\w+)\(`)
	placeholder = regexp.MustCompile(`^(Test|Benchmark|Fuzz)[A-Z]$`)
	goPath      = regexp.MustCompile(`^[\w.*\-]+(/[\w.*\-]+)+\.go$`)
	lineSufix   = regexp.MustCompile(`(:\d+(-\d+)?|#L\d+(-L\d+)?)$`)
	mdLink      = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
	htmlTag     = regexp.MustCompile(`<[^>]+>`)
)

// doc is one Markdown file: its lines and the anchors of its headings.
type doc struct {
	rel     string // slash path from the root
	lines   []string
	anchors map[string]bool
}

// Check returns the problems of every Markdown file under root, sorted.
func Check(root string) ([]string, error) {
	docs := map[string]*doc{}
	var goFiles []string
	tests := map[string]bool{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != root && (skipDirs[d.Name()] || strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(rel)
		switch {
		case strings.HasSuffix(p, ".md"):
			d, err := readDoc(p, rel)
			if err != nil {
				return err
			}
			docs[rel] = d
		case strings.HasSuffix(p, ".go"):
			goFiles = append(goFiles, rel)
			if strings.HasSuffix(p, "_test.go") {
				b, err := os.ReadFile(p)
				if err != nil {
					return err
				}
				for _, m := range testFunc.FindAllStringSubmatch(string(b), -1) {
					tests[m[1]] = true
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	c := &checker{root: root, docs: docs, goFiles: goFiles, tests: tests}
	names := make([]string, 0, len(docs))
	for n := range docs {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		c.check(docs[n])
	}
	return c.problems, nil
}

func readDoc(p, rel string) (*doc, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	d := &doc{rel: rel, anchors: map[string]bool{}}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		d.lines = append(d.lines, sc.Text())
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", rel, err)
	}
	seen := map[string]int{}
	inFence := false
	for _, l := range d.lines {
		if fence.MatchString(l) {
			inFence = !inFence
			continue
		}
		if inFence {
			continue
		}
		for _, m := range htmlID.FindAllStringSubmatch(l, -1) {
			d.anchors[m[1]] = true
		}
		m := heading.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		a := Anchor(m[2])
		if n := seen[a]; n > 0 {
			d.anchors[fmt.Sprintf("%s-%d", a, n)] = true
		} else {
			d.anchors[a] = true
		}
		seen[a]++
	}
	return d, nil
}

// Anchor is the id GitHub gives a heading: its text (backticks, links'
// targets and HTML tags dropped) lowercased, every character but letters,
// digits, '_', '-' and spaces dropped, spaces turned into '-'. A second
// heading with the same id gets "-1" appended, a third "-2" (readDoc).
func Anchor(h string) string {
	h = mdLink.ReplaceAllString(h, "$1")
	// HTML tags are markup outside code spans only: "`service <id>`"
	// reads "service <id>", and its anchor is service-id.
	parts := strings.Split(h, "`")
	for i := 0; i < len(parts); i += 2 {
		parts[i] = htmlTag.ReplaceAllString(parts[i], "")
	}
	h = strings.Join(parts, "")
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.Is(unicode.Mn, r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

type checker struct {
	root     string
	docs     map[string]*doc
	goFiles  []string
	tests    map[string]bool
	problems []string
}

func (c *checker) report(d *doc, line int, format string, args ...any) {
	c.problems = append(c.problems, fmt.Sprintf("%s:%d: %s", d.rel, line+1, fmt.Sprintf(format, args...)))
}

func (c *checker) check(d *doc) {
	inFence := false
	for i, l := range d.lines {
		if fence.MatchString(l) {
			inFence = !inFence
			continue
		}
		if inFence {
			continue
		}
		var spans []string
		prose := codeSpan.ReplaceAllStringFunc(l, func(s string) string {
			m := codeSpan.FindStringSubmatch(s)
			spans = append(spans, m[2])
			return "CODE"
		})
		for _, m := range link.FindAllStringSubmatch(prose, -1) {
			c.checkLink(d, i, m[1])
		}
		if m := refDef.FindStringSubmatch(prose); m != nil {
			c.checkLink(d, i, m[1])
		}
		for _, s := range spans {
			c.checkCode(d, i, s)
		}
	}
}

// checkLink checks one link target of d: a relative file (or directory)
// inside the repository, and the heading its #anchor names.
func (c *checker) checkLink(d *doc, line int, target string) {
	if i := strings.Index(target, ":"); i > 0 && !strings.ContainsAny(target[:i], "/#.") {
		return // a scheme: https:, mailto:, …
	}
	file, anchor, _ := strings.Cut(target, "#")
	rel := d.rel
	if file != "" {
		rel = path.Clean(path.Join(path.Dir(d.rel), file))
		if rel == ".." || strings.HasPrefix(rel, "../") {
			c.report(d, line, "link %s leaves the repository: docs link only to what the repository holds", target)
			return
		}
		if _, err := os.Stat(filepath.Join(c.root, filepath.FromSlash(rel))); err != nil {
			c.report(d, line, "link %s: no file %s in the repository", target, rel)
			return
		}
	}
	if anchor == "" {
		return
	}
	t, ok := c.docs[rel]
	if !ok {
		return // an anchor into a non-Markdown file (#L10 of a .go file)
	}
	if !t.anchors[anchor] {
		c.report(d, line, "link %s: no heading with anchor #%s in %s", target, anchor, rel)
	}
}

// checkCode checks what one code span cites: Go file paths (from the
// root, or from the doc's directory; globs allowed), test function names
// ("Xxx" stands for any name part), and no path out of the repository
// (a sibling folder of the checkout, say).
func (c *checker) checkCode(d *doc, line int, span string) {
	for _, tok := range strings.FieldsFunc(span, func(r rune) bool {
		return unicode.IsSpace(r) || strings.ContainsRune("'\"(),;=<>[]{}|", r)
	}) {
		tok = strings.TrimRight(strings.TrimPrefix(tok, "./"), ".:")
		tok = lineSufix.ReplaceAllString(tok, "")
		if strings.HasPrefix(tok, "../") {
			// Commands and paths in code are read from the root.
			if rel := path.Clean(tok); rel == ".." || strings.HasPrefix(rel, "../") {
				c.report(d, line, "`%s` is outside the repository: docs cite only what the repository holds", tok)
				continue
			}
		}
		if goPath.MatchString(tok) && !c.goFileExists(path.Clean(tok), path.Clean(path.Join(path.Dir(d.rel), tok))) {
			c.report(d, line, "`%s`: no such Go file in the repository", tok)
		}
		for _, m := range testWord.FindAllStringSubmatch(tok, -1) {
			if testName.MatchString(m[1]) && !c.testExists(m[1], m[2] == "*") {
				c.report(d, line, "`%s`: no test function %s%s in any _test.go file", span, m[1], m[2])
			}
		}
	}
}

func (c *checker) goFileExists(candidates ...string) bool {
	for _, want := range candidates {
		for _, f := range c.goFiles {
			if ok, _ := path.Match(want, f); ok {
				return true
			}
		}
	}
	return false
}

// testExists says whether a test function name (or, with prefix, one
// starting with it) is declared. "Xxx" in a name stands for any part of
// it, and a bare prefix and one capital letter (FuzzX) for any name.
func (c *checker) testExists(name string, prefix bool) bool {
	if c.tests[name] {
		return true
	}
	if placeholder.MatchString(name) {
		return true
	}
	pattern := "^" + strings.ReplaceAll(regexp.QuoteMeta(name), "Xxx", `\w*`)
	if !prefix {
		pattern += "$"
	}
	re := regexp.MustCompile(pattern)
	for t := range c.tests {
		if re.MatchString(t) {
			return true
		}
	}
	return false
}
