package lint

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// goRoot is the repository's go/ directory, relative to this package.
const goRoot = "../.."

// sources parses every non-test .go file under go/ whose slash path keep accepts.
func sources(t *testing.T, keep func(rel string) bool) (*token.FileSet, map[string]*ast.File) {
	t.Helper()
	fset := token.NewFileSet()
	files := map[string]*ast.File{}
	err := filepath.WalkDir(goRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); n == "testdata" || n == "vendor" || (strings.HasPrefix(n, ".") && path != goRoot) {
				return filepath.SkipDir
			}
			return nil
		}
		rel, _ := filepath.Rel(goRoot, path)
		rel = filepath.ToSlash(rel)
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") || !keep(rel) {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		files[rel] = f
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The walk must have seen the tree: a wrong root would make every check pass.
	for _, must := range []string{"client/client.go", "client/mds.go", "internal/cabi/cabi.go", "cmd/dfkvctl/main.go"} {
		if _, ok := files[must]; !ok && keep(must) {
			t.Fatalf("%s not scanned: is %s the repository's go/ directory?", must, goRoot)
		}
	}
	return fset, files
}

// Library packages read no environment: only the binaries (go/cmd/...) and the C ABI
// (go/internal/cabi) turn environment variables into options.
func TestLibraryPackagesReadNoEnvironment(t *testing.T) {
	library := func(rel string) bool {
		return !strings.HasPrefix(rel, "cmd/") && !strings.HasPrefix(rel, "internal/cabi/")
	}
	fset, files := sources(t, library)
	if len(files) < 20 {
		t.Fatalf("only %d library files found", len(files))
	}
	for _, f := range files {
		for _, v := range EnvReads(fset, f) {
			t.Error(v)
		}
	}
}

// Every fmt.Errorf in the tree keeps the cause of the error it formats.
func TestErrorfKeepsCauses(t *testing.T) {
	fset, files := sources(t, func(string) bool { return true })
	for _, f := range files {
		for _, v := range LostCauses(fset, f) {
			t.Error(v)
		}
	}
}

// The checks find what they exist for (and nothing in the lookalikes).
func TestChecksFindFaults(t *testing.T) {
	const src = `package x

import (
	"fmt"
	env "os"
	"syscall"
)

func f(err, derr error, s string, n int) error {
	_ = env.Getenv("A")                          // env 1
	_, _ = env.LookupEnv("B")                    // env 2
	_ = syscall.Environ()                        // env 3
	_ = fmt.Errorf("x: %v", err)                 // lost 1
	_ = fmt.Errorf("x %d: %s", n, derr)          // lost 2
	_ = fmt.Errorf("x: %s", err.Error())         // lost 3
	_ = fmt.Errorf("x %*d: %v", n, n, err)       // lost 4
	_ = fmt.Errorf("x: %w", err)                 // fine
	_ = fmt.Errorf("x: %v %s %q", n, s, s)       // fine
	_ = fmt.Errorf("100%% %s: %w", s, err)       // fine
	_ = fmt.Sprintf("x: %v", err)                // not Errorf
	return nil
}
`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "x.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	lines := func(fs []Finding) []int {
		var out []int
		for _, v := range fs {
			out = append(out, v.Pos.Line)
		}
		return out
	}
	if got := lines(EnvReads(fset, f)); !equal(got, []int{10, 11, 12}) {
		t.Errorf("env reads on lines %v, want 10 11 12", got)
	}
	if got := lines(LostCauses(fset, f)); !equal(got, []int{13, 14, 15, 16}) {
		t.Errorf("lost causes on lines %v, want 13 14 15 16", got)
	}
}

func equal(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
