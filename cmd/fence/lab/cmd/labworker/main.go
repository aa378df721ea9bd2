// Command labworker is a worker process of fence's fault lab; see package
// lab/worker. The lab builds and starts it; it is not meant to be run by
// hand.
package main

import (
	"os"

	"github.com/fencekit/fence/cmd/fence/lab/worker"
)

func main() { os.Exit(worker.Main()) }
