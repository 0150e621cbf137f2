// Command protoschema writes the protobuf schema of Kubernetes' built-in kinds that the
// gateway's proxy mode encodes with (see package protoschema):
//
//	go run ./cmd/protoschema > ../core/src/watch/unstructured/builtin.schema
package main

import (
	"fmt"
	"os"

	"svc.io/interop/protoschema"
)

func main() {
	if err := protoschema.Generate(os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
