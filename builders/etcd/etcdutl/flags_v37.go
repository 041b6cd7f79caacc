//go:build etcd_v37

package main

import (
	"time"

	"github.com/spf13/cobra"

	"go.etcd.io/etcd/etcdutl/v3/etcdutl"
)

// releaseFlags: 3.7 added --timeout, the wait for the db file's lock.
func releaseFlags(root *cobra.Command) {
	root.PersistentFlags().DurationVar(&etcdutl.FlockTimeout, "timeout", 10*time.Second, "time to wait to obtain a file lock on db file, 0 to block indefinitely")
}
