package cuda

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestOptionsFromEnvKernelCache(t *testing.T) {
	t.Setenv("EMBER_KERNEL_CACHE", "off")
	opt, err := OptionsFromEnv(BackendOptions{})
	if err != nil || opt.KernelCache != "off" {
		t.Errorf("EMBER_KERNEL_CACHE=off: KernelCache = %q, %v; want off", opt.KernelCache, err)
	}
	// An option the caller set wins over the environment.
	if opt, _ = OptionsFromEnv(BackendOptions{KernelCache: "/tmp/k"}); opt.KernelCache != "/tmp/k" {
		t.Errorf("explicit KernelCache = %q, want /tmp/k", opt.KernelCache)
	}
	t.Setenv("EMBER_KERNEL_CACHE", "")
	if opt, _ = OptionsFromEnv(BackendOptions{}); opt.KernelCache != "" {
		t.Errorf("unset EMBER_KERNEL_CACHE: KernelCache = %q", opt.KernelCache)
	}
}

func TestOptionsFromEnvConvSearch(t *testing.T) {
	t.Setenv("EMBER_CUDNN_SEARCH", "all")
	if opt, err := OptionsFromEnv(BackendOptions{}); err != nil || !opt.ConvSearchAll {
		t.Errorf("EMBER_CUDNN_SEARCH=all: ConvSearchAll = %v, %v; want true", opt.ConvSearchAll, err)
	}
	t.Setenv("EMBER_CUDNN_SEARCH", "fast")
	if _, err := OptionsFromEnv(BackendOptions{}); err == nil || !strings.Contains(err.Error(), `EMBER_CUDNN_SEARCH="fast"`) {
		t.Errorf("EMBER_CUDNN_SEARCH=fast: error %v, want one naming the variable and its value", err)
	}
}

// TestNoEnvironmentInLibrary checks that the library code of the cuda and
// tensor packages (and their sub-packages) reads no EMBER_ variable: the
// switches are BackendOptions, and only OptionsFromEnv, which commands and
// tests call, maps the variables onto them.
func TestNoEnvironmentInLibrary(t *testing.T) {
	requirePackageSources(t)
	fset := token.NewFileSet()
	for _, root := range []string{".", filepath.Join("..", "tensor")} {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			for _, decl := range f.Decls {
				if fd, ok := decl.(*ast.FuncDecl); ok && fd.Recv == nil && fd.Name.Name == "OptionsFromEnv" && path == "backend.go" {
					continue
				}
				ast.Inspect(decl, func(n ast.Node) bool {
					call, ok := n.(*ast.CallExpr)
					if !ok || len(call.Args) == 0 {
						return true
					}
					sel, ok := call.Fun.(*ast.SelectorExpr)
					if !ok || (sel.Sel.Name != "Getenv" && sel.Sel.Name != "LookupEnv") {
						return true
					}
					if lit, ok := call.Args[0].(*ast.BasicLit); ok {
						if v, _ := strconv.Unquote(lit.Value); strings.HasPrefix(v, "EMBER_") {
							t.Errorf("%s reads %s: make it a BackendOptions field that OptionsFromEnv sets", fset.Position(call.Pos()), v)
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
	}
}

// TestOptionsFromEnvLinearLt maps EMBER_LINEAR_LT: "1" is cuBLASLt above
// 256 rows, "all" for every layer, anything else neither.
func TestOptionsFromEnvLinearLt(t *testing.T) {
	for _, c := range []struct {
		v                    string
		lt, everywhere, wide bool
	}{{"1", true, false, true}, {"all", false, true, true}, {"0", false, false, false}, {"", false, false, true}} {
		t.Setenv("EMBER_LINEAR_LT", c.v)
		opt, err := OptionsFromEnv(BackendOptions{})
		if err != nil || opt.LinearLt != c.lt || opt.LinearLtEverywhere != c.everywhere || opt.NoLinearLtWide == c.wide {
			t.Errorf("EMBER_LINEAR_LT=%q: LinearLt %v, LinearLtEverywhere %v, NoLinearLtWide %v, %v; want %v, %v, %v",
				c.v, opt.LinearLt, opt.LinearLtEverywhere, opt.NoLinearLtWide, err, c.lt, c.everywhere, !c.wide)
		}
	}
	t.Setenv("EMBER_LINEAR_LT", "on")
	if _, err := OptionsFromEnv(BackendOptions{}); err == nil || !strings.Contains(err.Error(), "EMBER_LINEAR_LT") {
		t.Errorf("EMBER_LINEAR_LT=on: %v; want an error naming the variable", err)
	}
}
