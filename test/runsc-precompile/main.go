//go:build ignore

// Command runsc-precompile gives runsc its seccomp programs precompiled, as
// gVisor's Bazel build does (precompiled_seccomp_rules). test/runsc.sh
// copies gVisor's module at runsc's version, runs this command in the copy
// and builds runsc there. A runsc built with plain `go install` has none:
// it compiles its sentry's filter at every `runsc start` and its gofer's
// at every create. Measured here (print(45), medians of 16, interleaved),
// without them a `runsc start` took 24 ms more and the program's run to its
// end 46 ms more.
//
//	go run ./DIR -gvisor GVISOR
//
// Each filter_precompiled.go under GVISOR, a stub that registers no
// program, is rewritten in place with every program of its package's
// PrecompiledPrograms registered.
package main

import (
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"gvisor.dev/gvisor/pkg/seccomp/precompiledseccomp"
	bootconfig "gvisor.dev/gvisor/runsc/boot/filter/config"
	goferconfig "gvisor.dev/gvisor/runsc/fsgofer/filter/config"
)

// The stub's lines that the generated file changes.
const (
	disabled = "const PrecompilationDisabledAtBuildTime = true"
	enabled  = "const PrecompilationDisabledAtBuildTime = false"
	register = "\tprecompiledPrograms = programs"
)

func main() {
	gvisor := flag.String("gvisor", "", "the copy of gVisor's module to rewrite")
	flag.Parse()
	log.SetFlags(0)
	if *gvisor == "" {
		log.Fatal("runsc-precompile: -gvisor is required")
	}
	for _, f := range []struct {
		path     string
		programs func() ([]precompiledseccomp.Program, error)
	}{
		{"runsc/boot/filter/filter_precompiled.go", bootconfig.PrecompiledPrograms},
		{"runsc/fsgofer/filter/filter_precompiled.go", goferconfig.PrecompiledPrograms},
	} {
		stub := filepath.Join(*gvisor, f.path)
		src, err := os.ReadFile(stub)
		if err != nil {
			log.Fatalf("runsc-precompile: %v", err)
		}
		programs, err := f.programs()
		if err != nil {
			log.Fatalf("runsc-precompile: %s: %v", f.path, err)
		}
		sort.Slice(programs, func(i, j int) bool { return programs[i].Name < programs[j].Name })
		var reg strings.Builder
		for _, p := range programs {
			reg.WriteString(p.Registration("\t", "precompiledseccomp", "programs"))
		}
		text := string(src)
		if strings.Count(text, disabled) != 1 || strings.Count(text, register+"\n") != 1 {
			log.Fatalf("runsc-precompile: %s is not the stub this command knows (gVisor changed it)", stub)
		}
		text = strings.Replace(text, disabled, enabled, 1)
		text = strings.Replace(text, register+"\n", reg.String()+register+"\n", 1)
		if err := os.WriteFile(stub, []byte(text), 0o644); err != nil {
			log.Fatalf("runsc-precompile: %v", err)
		}
		fmt.Fprintf(os.Stderr, "runsc-precompile: %s: %d programs\n", f.path, len(programs))
	}
}
