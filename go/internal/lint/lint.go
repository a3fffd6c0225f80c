package lint

import (
	"go/ast"
	"go/token"
	"strconv"
	"strings"
)

// Finding is one violation at a source position.
type Finding struct {
	Pos token.Position
	Msg string
}

func (f Finding) String() string { return f.Pos.String() + ": " + f.Msg }

// importName returns the name file uses for the package at path ("" when not imported).
func importName(file *ast.File, path string) string {
	for _, im := range file.Imports {
		p, err := strconv.Unquote(im.Path.Value)
		if err != nil || p != path {
			continue
		}
		if im.Name != nil {
			return im.Name.Name
		}
		return path[strings.LastIndexByte(path, '/')+1:]
	}
	return ""
}

// isCall reports whether call is pkg.fn(...) for the local package name pkg.
func isCall(call *ast.CallExpr, pkg string, fns ...string) (string, bool) {
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok {
		return "", false
	}
	id, ok := sel.X.(*ast.Ident)
	if !ok || pkg == "" || id.Name != pkg {
		return "", false
	}
	for _, f := range fns {
		if sel.Sel.Name == f {
			return f, true
		}
	}
	return "", false
}

// EnvReads finds reads of the process environment (os.Getenv, os.LookupEnv, os.Environ,
// syscall.Getenv) in file.
func EnvReads(fset *token.FileSet, file *ast.File) []Finding {
	osName, sysName := importName(file, "os"), importName(file, "syscall")
	var out []Finding
	ast.Inspect(file, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		if fn, ok := isCall(call, osName, "Getenv", "LookupEnv", "Environ"); ok {
			out = append(out, Finding{fset.Position(call.Pos()), "os." + fn + " in a library package (take an option instead)"})
		}
		if fn, ok := isCall(call, sysName, "Getenv", "Environ"); ok {
			out = append(out, Finding{fset.Position(call.Pos()), "syscall." + fn + " in a library package (take an option instead)"})
		}
		return true
	})
	return out
}

// errorNames are identifiers taken to hold an error: err, e, and any name ending in "err"
// or "Err" (derr, readErr).
func errorName(name string) bool {
	return name == "e" || strings.HasSuffix(name, "err") || strings.HasSuffix(name, "Err")
}

// LostCauses finds fmt.Errorf calls that format an error-named argument (see errorName) or
// an err.Error() call with %v or %s, which drops the cause from errors.Is and errors.As.
// Only literal format strings are checked.
func LostCauses(fset *token.FileSet, file *ast.File) []Finding {
	fmtName := importName(file, "fmt")
	var out []Finding
	ast.Inspect(file, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		if _, ok := isCall(call, fmtName, "Errorf"); !ok || len(call.Args) == 0 {
			return true
		}
		lit, ok := call.Args[0].(*ast.BasicLit)
		if !ok || lit.Kind != token.STRING {
			return true
		}
		format, err := strconv.Unquote(lit.Value)
		if err != nil {
			return true
		}
		for i, verb := range verbs(format) {
			if i+1 >= len(call.Args) || (verb != 'v' && verb != 's') {
				continue
			}
			if name, ok := errorArg(call.Args[i+1]); ok {
				out = append(out, Finding{fset.Position(call.Args[i+1].Pos()),
					"fmt.Errorf formats " + name + " with %" + string(verb) + ": use %w to keep the cause"})
			}
		}
		return true
	})
	return out
}

// errorArg reports whether arg looks like an error value: an error-named identifier or
// selector (x.err), or a call of its Error method.
func errorArg(arg ast.Expr) (string, bool) {
	switch a := arg.(type) {
	case *ast.Ident:
		return a.Name, errorName(a.Name)
	case *ast.SelectorExpr:
		return a.Sel.Name, errorName(a.Sel.Name)
	case *ast.CallExpr:
		if sel, ok := a.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "Error" && len(a.Args) == 0 {
			if name, ok := errorArg(sel.X); ok {
				return name + ".Error()", true
			}
		}
	}
	return "", false
}

// verbs returns the verb letter of each operand-consuming directive in format, in order
// (a '*' width or precision consumes an operand too and is returned as '*').
func verbs(format string) []byte {
	var out []byte
	for i := 0; i < len(format); i++ {
		if format[i] != '%' {
			continue
		}
		i++
		for ; i < len(format); i++ {
			c := format[i]
			if c == '*' {
				out = append(out, '*')
				continue
			}
			if strings.IndexByte("+-# 0123456789.[]", c) >= 0 {
				continue
			}
			if c != '%' {
				out = append(out, c)
			}
			break
		}
	}
	return out
}
