// Command validate checks deployment files offline with the upstream loaders:
//
//	validate compose FILE   the Compose specification's own loader (compose-go);
//	                        prints the normalized project as JSON
//	validate k8s            a YAML stream of manifests on stdin, each decoded
//	                        strictly into its Kubernetes (or Prometheus Operator)
//	                        API type: unknown or duplicate fields, wrong types and
//	                        unknown kinds fail; prints one kind/name per line
//
// dev/setup builds it into dev/.cache; tests/unit/test_compose.py and
// tests/unit/test_helm.py run it.
package main

import (
	"fmt"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: validate compose FILE | validate k8s < manifests.yaml")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "compose":
		if len(os.Args) != 3 {
			err = fmt.Errorf("usage: validate compose FILE")
		} else {
			err = compose(os.Args[2], os.Stdout)
		}
	case "k8s":
		err = kubernetes(os.Stdin, os.Stdout)
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "validate:", err)
		os.Exit(1)
	}
}
