// etcd for the real-node tier, built from its Go module (Debian's 3.4 is older than
// Kubernetes 1.31+ supports): the same entry point as etcd's own main package.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
