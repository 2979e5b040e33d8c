// compose-check validates Compose files with compose-go, the Compose Specification's
// reference loader (what `docker compose config` uses), without a Docker engine.
//
//	compose-check [-profile NAME]... [-print] FILE [FILE...]
//
// The files are merged in order (like `docker compose -f A -f B`), interpolated from the
// environment, validated against the Compose schema and normalized. Exit 0 when valid;
// otherwise 1 with the loader's error on stderr. -print writes the resolved project as JSON.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/compose-spec/compose-go/v2/cli"
)

type profiles []string

func (p *profiles) String() string     { return strings.Join(*p, ",") }
func (p *profiles) Set(v string) error { *p = append(*p, v); return nil }

func main() {
	var active profiles
	flag.Var(&active, "profile", "enable a profile (repeatable; \"*\" = all)")
	print := flag.Bool("print", false, "print the resolved project as JSON")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: compose-check [-profile NAME]... [-print] FILE [FILE...]")
		os.Exit(2)
	}
	opts, err := cli.NewProjectOptions(flag.Args(), cli.WithOsEnv, cli.WithProfiles(active))
	if err != nil {
		fail(err)
	}
	project, err := opts.LoadProject(context.Background())
	if err != nil {
		fail(err)
	}
	if *print {
		out, err := project.MarshalJSON()
		if err != nil {
			fail(err)
		}
		fmt.Println(string(out))
		return
	}
	names := project.ServiceNames()
	fmt.Printf("%s: valid (project %q, services: %s)\n", strings.Join(flag.Args(), " + "), project.Name,
		strings.Join(names, ", "))
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "compose-check: %s: %v\n", strings.Join(flag.Args(), " + "), err)
	os.Exit(1)
}
