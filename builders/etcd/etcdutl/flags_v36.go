//go:build !etcd_v37

package main

import "github.com/spf13/cobra"

// releaseFlags: 3.6's root command has no flag beyond --write-out.
func releaseFlags(*cobra.Command) {}
