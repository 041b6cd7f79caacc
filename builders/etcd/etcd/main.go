// etcd: the release's own server, built from go.etcd.io/etcd/server/v3 (the module pinned by the modfile).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
