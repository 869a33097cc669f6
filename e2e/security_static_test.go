package e2e

import (
	"go/ast"
	"go/parser"
	"go/printer"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// secretish matches names of values an attacker may probe by timing: MACs,
// signatures, secrets, keys and their hashes.
var secretish = regexp.MustCompile(`(?i)(sig|signature|secret|hmac|\bmac\b|token|hash|password|apikey|servicekey|\bkey\b)`)

// timingAllowed lists comparisons the check flags that compare nothing an
// attacker can time against a secret, each with the reason (file:function
// → why). Keys themselves are never compared: they are looked up by their
// SHA-256 (the store's B-tree and its read cache), and the lookup time of
// a hash of 196 random bits tells nothing about any key.
var timingAllowed = map[string]string{
	// The Signing-Version header against "3": public.
	"sdk/verify.go:Verify": "signing version, public",
	// A key's CRC checksum (public, a function of the key) compared as one
	// integer after the same work for every input.
	"internal/servicekey/servicekey.go:WellFormed": "checksum, single integer compare",
	// Reservation ids and user ids are not secrets.
	"internal/store/boltstore/jobs.go:jobHolds": "reservation id",
	"internal/usagehandler/status.go:callerJob": "user ids",
	// An allowance's key is its user, service and period: not a secret.
	"internal/store/pgstore/jobs.go:cover": "allowance keys (user, service, period)",
	// The same for a job's hold and its account, and the lease rows of
	// one subscription grouped by a deferred expiry's return.
	"internal/store/pgstore/jobs.go:endJob":               "allowance keys (user, service)",
	"internal/store/pgstore/heldexpiry.go:settleReturned": "allowance keys (user, service)",
}

// TestSecurityConstantTimeCompare reads the source of every package (not
// tests) and fails on a comparison with == / != / bytes.Equal /
// strings.EqualFold / bytes.Compare / strings.Compare whose operands look
// like a signature, secret, key or hash, unless the other side is a
// literal, nil or a length. Such comparisons must go through hmac.Equal or
// subtle.ConstantTimeCompare (signing.Verify, the core routes'
// serviceSecret check), or through a lookup by hash.
func TestSecurityConstantTimeCompare(t *testing.T) {
	root := ".."
	fset := token.NewFileSet()
	var checked, compares int
	var constantTime []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "testdata", "bin", "tmp", "node_modules":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		checked++
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			name := "*"
			if ok {
				name = fn.Name.Name
			}
			ast.Inspect(decl, func(n ast.Node) bool {
				switch x := n.(type) {
				case *ast.BinaryExpr:
					if x.Op != token.EQL && x.Op != token.NEQ {
						return true
					}
					compares++
					if harmless(x.X) || harmless(x.Y) || !secretish.MatchString(src(fset, x.X)+" "+src(fset, x.Y)) {
						return true
					}
					flag(t, fset, rel, name, x, src(fset, x))
				case *ast.CallExpr:
					fun := src(fset, x.Fun)
					switch fun {
					case "hmac.Equal", "subtle.ConstantTimeCompare":
						constantTime = append(constantTime, rel+":"+name)
					case "bytes.Equal", "strings.EqualFold", "bytes.Compare", "strings.Compare", "reflect.DeepEqual", "slices.Equal":
						compares++
						args := ""
						anyHarmless := false
						for _, a := range x.Args {
							args += src(fset, a) + " "
							anyHarmless = anyHarmless || harmless(a)
						}
						if !anyHarmless && secretish.MatchString(args) {
							flag(t, fset, rel, name, x, src(fset, x))
						}
					}
				}
				return true
			})
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 30 || len(constantTime) == 0 {
		t.Fatalf("checked %d files and found %d constant-time compares: wrong root?", checked, len(constantTime))
	}
	t.Logf("%d source files, %d comparisons checked; constant-time compares in %v", checked, compares, constantTime)
}

func flag(t *testing.T, fset *token.FileSet, file, fn string, n ast.Node, text string) {
	t.Helper()
	if _, ok := timingAllowed[file+":"+fn]; ok {
		return
	}
	if _, ok := timingAllowed[file+":*"]; ok {
		return
	}
	t.Errorf("%s (%s): %s compares what looks like a secret in variable time; use hmac.Equal or subtle.ConstantTimeCompare",
		fset.Position(n.Pos()), fn, text)
}

// harmless: a literal, nil, true/false, a length, or a named constant of
// the usual shapes, none of which is a secret.
func harmless(e ast.Expr) bool {
	switch x := e.(type) {
	case *ast.BasicLit:
		return true
	case *ast.Ident:
		return x.Name == "nil" || x.Name == "true" || x.Name == "false"
	case *ast.CallExpr:
		if id, ok := x.Fun.(*ast.Ident); ok && (id.Name == "len" || id.Name == "cap") {
			return true
		}
	case *ast.ParenExpr:
		return harmless(x.X)
	}
	return false
}

func src(fset *token.FileSet, n ast.Node) string {
	var b strings.Builder
	printer.Fprint(&b, fset, n)
	return b.String()
}
