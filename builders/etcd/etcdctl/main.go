// etcdctl: the release's own client tool, built from go.etcd.io/etcd/etcdctl/v3.
package main

import "go.etcd.io/etcd/etcdctl/v3/ctlv3"

func main() {
	ctlv3.MustStart()
}
